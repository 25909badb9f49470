"""What the daemon's speed work (issue 16: batched frames both ways, coalesced acks, the journal's
group commit, event streams that report gaps) could break, attacked through a real ``turnpool
serve`` and real ``Client``\\ s:

* pipelined submits (many in flight on one connection, packed into one frame) keep the client's
  order, stay idempotent by ``turn_id``, and a cancel sent right behind a submit still wins;
* a burst handled a slice at a time (DAEMON-INTAKE-SLICE) keeps each client's order beside another client's
  burst, and a daemon stopped in the middle of one answers every request it had read;
* an acknowledged submit is durable: SIGKILL the daemon the moment an ack arrives, restart it on
  the same journal, and every acknowledged turn is there;
* ``handle.events()`` yields ``EventsDropped`` exactly where events were dropped (a follower that
  fell behind, a follower that started late) and never for a follower that keeps up.
"""

from __future__ import annotations

import os
import shutil
import signal
from contextlib import aclosing
from typing import Any

import anyio
import msgspec
import pytest
import zmq
import zmq.asyncio

import wire
from supervisor import Client, DaemonShuttingDown, DaemonUnavailable, EventsDropped
from supervisor.journal import read_history
from tests.support import daemonkit
from tests.support.daemonkit import FAST, serving
from tests.support.events import assert_accounted
from wire import client_link

pytestmark = pytest.mark.anyio

LONG_TURN = "tests.agents.client:wait_for_cancel"


@pytest.mark.parametrize("journal", [False, True], ids=["no-journal", "journal"])
async def test_pipelined_submits_keep_order_ids_and_cancel_wins(journal: bool) -> None:
    """300 submits started at once on one client (one session, so they run one at a time in the
    order they were accepted) run in exactly the order the client made them; 20 concurrent submits
    of one ``turn_id`` are one turn that runs once; a cancel sent in the same frame right behind
    its turn's submit ends that queued turn ``aborted`` without it ever starting. With the journal
    too: the twins wait on the first submit's row (JOURNAL-GATE-WAIT), every ack after its commit."""
    home = daemonkit.short_dir()
    path = home / "order.txt"
    n = 300
    store = ("--journal", str(home / "j.sqlite3")) if journal else ("--no-journal",)
    try:
        with serving(*FAST, *store) as d:
            async with Client.connect(d.endpoint, timeout=30) as client:
                handles: dict[int, Any] = {}
                twins: list[Any] = []

                async def submit(i: int) -> None:
                    handles[i] = await client.submit(
                        "tests.agents.speed:record", {"path": str(path), "mark": i}, session="s"
                    )

                async def twin() -> None:
                    twins.append(
                        await client.submit(
                            "tests.agents.speed:record",
                            {"path": str(path), "mark": "twin"},
                            session="s",
                            turn_id="the-twin",
                        )
                    )

                cancelled: list[Any] = []

                async def submit_then_cancel() -> None:
                    await client.submit(
                        "tests.agents.speed:record",
                        {"path": str(path), "mark": "never"},
                        session="s",
                        turn_id="doomed",
                    )

                async def cancel_doomed() -> None:
                    cancelled.append(await client.cancel("doomed"))

                with anyio.fail_after(120):
                    async with anyio.create_task_group() as tg:
                        for i in range(n):
                            tg.start_soon(submit, i)
                        for _ in range(20):
                            tg.start_soon(twin)
                        tg.start_soon(submit_then_cancel)
                        tg.start_soon(cancel_doomed)  # same pass: same frame, right behind the submit
                    results = [await handles[i].result() for i in range(n)]
                    twin_results = [await h.result() for h in twins]
                    doomed = await client.handle("doomed").result()
    finally:
        lines = path.read_text().split() if path.exists() else []
        shutil.rmtree(home, ignore_errors=True)
    assert [r.outcome for r in results] == ["completed"] * n
    assert [line for line in lines if line not in ("twin", "never")] == [str(i) for i in range(n)]
    assert {h.turn_id for h in twins} == {"the-twin"} and len(twins) == 20
    assert lines.count("twin") == 1 and {r.outcome for r in twin_results} == {"completed"}
    assert cancelled == [{"kind": "user"}]
    assert doomed.outcome == "aborted" and not doomed.started and "never" not in lines


async def test_every_ack_is_durable_when_the_daemon_is_killed_right_after_it() -> None:
    """Journal on: 400 submits in flight at once; the moment the first acknowledgement arrives the
    daemon is SIGKILLed (no drain, no flush). Restarted on the same journal, it knows every turn
    whose submit was acknowledged — an ack is never sent before its row is committed, batched
    or not."""
    keep = daemonkit.short_dir()
    journal = str(keep / "j.sqlite3")
    acked: list[str] = []
    try:
        with serving(*FAST, "--workers", "1", "--journal", journal) as d:
            async with Client.connect(d.endpoint, timeout=30) as client:
                killed = False

                async def submit(i: int) -> None:
                    nonlocal killed
                    try:
                        handle = await client.submit("examples.agents:slow", {"seconds": 60}, turn_id=f"a{i}")
                    except DaemonUnavailable:
                        return
                    acked.append(handle.turn_id)
                    if not killed:
                        killed = True
                        os.kill(d.pid, signal.SIGKILL)

                with anyio.fail_after(120):
                    async with anyio.create_task_group() as tg:
                        for i in range(400):
                            tg.start_soon(submit, i)
            d.proc.wait(timeout=30)
        assert acked, "no submit was acknowledged"
        daemonkit.wait_journal_released(journal)  # its writer dies of its parent-death signal after it
        with serving(*FAST, "--workers", "1", "--journal", journal) as again:
            async with Client.connect(again.endpoint, timeout=30) as client:
                with anyio.fail_after(120):
                    missing = [t for t in acked if not await client.exists(t)]
                    for turn_id in acked:
                        await client.cancel(turn_id)
    finally:
        shutil.rmtree(keep, ignore_errors=True)
    assert missing == [], f"{len(missing)} of {len(acked)} acknowledged turns were lost"


async def _collect(events: Any, into: list[Any], until: int | None = None) -> None:
    async for event in events:
        into.append(event)
        if until is not None and len(into) >= until:
            return


async def test_a_follower_that_keeps_up_never_sees_a_gap_marker() -> None:
    """The agent emits 3,000 events in chunks of 50 and only goes on once the follower has them
    all (it writes a file): the daemon keeps 100 events, so a follower that keeps up is never more
    than 50 behind. It gets every event, in order, and no ``EventsDropped``."""
    home = daemonkit.short_dir()
    count, chunk = 3000, 50
    got: list[Any] = []
    try:
        with serving(*FAST, "--no-journal", "--max-events", "100") as d:
            async with Client.connect(d.endpoint, timeout=30) as client:
                handle = await client.submit(
                    "tests.agents.speed:paced", {"count": count, "chunk": chunk, "dir": str(home)}
                )
                with anyio.fail_after(120):
                    async with aclosing(handle.events()) as events:
                        async for event in events:
                            got.append(event)
                            if len(got) % chunk == 0:
                                (home / f"got-{len(got)}").write_text("")
                    result = await handle.result()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert result.outcome == "completed"
    assert not any(isinstance(e, EventsDropped) for e in got)
    assert got == list(range(count))


async def test_the_gap_marker_says_exactly_what_a_slow_or_late_follower_missed() -> None:
    """``--max-events 20``: a follower reads the first event, then stops while the agent emits 499 more; when
    it reads again it gets one ``EventsDropped`` exactly where its events stop being contiguous,
    whose count is exactly how many it missed, and the stream goes on to the last event (it is not
    ended). A follower that starts after the drops gets the marker first (``first`` 0), then the
    kept events. Nothing is ever silently skipped: received + reported dropped = emitted."""
    home = daemonkit.short_dir()
    count = 500
    try:
        with serving(*FAST, "--no-journal", "--max-events", "20") as d:
            async with Client.connect(d.endpoint, timeout=30, follow_window=4) as client:
                handle = await client.submit(
                    "tests.agents.speed:flood_then_wait", {"count": count, "dir": str(home)}
                )
                slow: list[Any] = []
                late: list[Any] = []
                with anyio.fail_after(120):
                    async with aclosing(handle.events()) as events:
                        await _collect(events, slow, until=1)
                        (home / "go").write_text("")
                        # Wait until the daemon holds the last event (so the first ones are dropped):
                        # the agent's "emitted" file says only that its emits left the worker.
                        async with aclosing(client.handle(handle.turn_id).events()) as probe:
                            async for item in probe:
                                if item == count - 1:
                                    break
                        async with aclosing(client.handle(handle.turn_id).events()) as late_events:
                            await _collect(late_events, late, until=2)
                        (home / "release").write_text("")
                        await _collect(events, slow)
                    result = await handle.result()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert result.outcome == "completed"
    assert_accounted(slow, count)
    markers = [e for e in slow if isinstance(e, EventsDropped)]
    assert len(markers) >= 1 and slow[0] == 0
    assert isinstance(late[0], EventsDropped) and late[0].first == 0 and late[0].count > 0
    assert late[1] == late[0].count  # the oldest event kept comes right after the marker


def test_batch_frames_round_trip() -> None:
    """A batch frame holds one or more messages (a fixarray, array16 and array32 header) and is
    told apart from one message by its first element; one message still decodes as before; an
    empty array is malformed (so every frame a client sends gets at least a reply or an error)."""
    import wire
    from wire import client_link

    for n in (1, 15, 16, 70_000):
        frame = client_link.encode_batch([wire.encode(client_link.Ok(i)) for i in range(n)])
        assert client_link.decode_from_daemon_frame(frame) == [client_link.Ok(i) for i in range(n)]
    with pytest.raises(msgspec.DecodeError):  # an empty array is neither a message nor a batch
        client_link.decode_to_daemon_frame(client_link.encode_batch([]))
    assert client_link.decode_from_daemon_frame(wire.encode(client_link.Ok(7))) == [client_link.Ok(7)]
    assert client_link.decode_to_daemon_frame(wire.encode(client_link.GetStatus(2))) == [
        client_link.GetStatus(2)
    ]
    follow = client_link.encode_batch(
        [wire.encode(client_link.Follow(1, "t", 4)), wire.encode(client_link.Credit(1, 2))]
    )
    assert client_link.decode_to_daemon_frame(follow) == [
        client_link.Follow(1, "t", 4),
        client_link.Credit(1, 2),
    ]


async def test_thousands_of_submits_in_flight_on_one_client_are_all_acknowledged() -> None:
    """5,000 submits in flight at once on one connection: every one is acknowledged and every
    turn completes. (Before batched replies, the daemon's per-client send queue filled with
    single acks faster than the client read them, and the acks that did not fit were lost: the
    client waited for them until its request timeout.)"""
    n = 5000
    with serving(*FAST, "--no-journal", "--keep-results", str(2 * n)) as d:
        async with Client.connect(d.endpoint, timeout=30, request_timeout=60) as client:
            handles: list[Any] = []

            async def submit() -> None:
                handles.append(await client.submit("examples.agents:noop"))

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for _ in range(n):
                        tg.start_soon(submit)
                outcomes = {(await h.result()).outcome for h in handles}
    assert len(handles) == n and len({h.turn_id for h in handles}) == n
    assert outcomes == {"completed"}


@pytest.mark.parametrize("journal", [False, True], ids=["no-journal", "journal"])
async def test_bursts_handled_in_slices_keep_each_clients_order(journal: bool) -> None:
    """DAEMON-INTAKE-SLICE: two clients each ``submit_many`` 2,000 turns of their own session at once, so the
    daemon handles both bursts a slice at a time (its budget per reader callback is far below a
    burst) with the slices interleaved. Each session's turns run in exactly the order its client
    listed them, and every turn runs once."""
    home = daemonkit.short_dir()
    n = 2000
    store = ("--journal", str(home / "j.sqlite3")) if journal else ("--no-journal",)
    paths = [home / "a.txt", home / "b.txt"]
    try:
        with serving(*FAST, *store, "--max-queue", "10000", "--keep-results", "10000") as d:
            async with (
                Client.connect(d.endpoint, timeout=30, request_timeout=120) as a,
                Client.connect(d.endpoint, timeout=30, request_timeout=120) as b,
            ):
                got: dict[int, list[Any]] = {}

                async def burst(k: int, client: Client) -> None:
                    inputs = [{"path": str(paths[k]), "mark": i} for i in range(n)]
                    handles = await client.submit_many("tests.agents.speed:record", inputs, session=f"s{k}")
                    got[k] = await client.results(handles)

                with anyio.fail_after(120):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(burst, 0, a)
                        tg.start_soon(burst, 1, b)
        lines = [p.read_text().split() for p in paths]
    finally:
        shutil.rmtree(home, ignore_errors=True)
    for k in (0, 1):
        assert [r.outcome for r in got[k]] == ["completed"] * n
        assert lines[k] == [str(i) for i in range(n)], f"client {k}'s session ran out of order"


async def test_a_daemon_stopped_mid_burst_answers_every_request_it_read() -> None:
    """DAEMON-INTAKE-SLICE: SIGTERM reaches the daemon while it is still handling a burst of 20,000 submits a
    slice at a time (another client saw the first of them arrive). ``submit_many`` comes back well
    inside its request timeout: accepted, refused with ``DaemonShuttingDown`` past the point where
    the daemon stopped accepting, or ``DaemonUnavailable`` for requests still unread when it went.
    Whatever the client heard, the journal holds exactly a prefix of the burst (requests are handled
    in order, and none the daemon read is left half-done in its backlog), every acknowledged turn
    is in it, the daemon exits 0, and restarted on the journal it ends every recorded turn."""
    home = daemonkit.short_dir()
    n = 20_000
    journal = str(home / "j.sqlite3")
    opts = (*FAST, "--journal", journal, "--max-queue", str(2 * n), "--keep-results", str(2 * n))
    ids = [f"b-{i}" for i in range(n)]
    try:
        with serving(*opts) as d:
            async with (
                Client.connect(d.endpoint, timeout=30, request_timeout=600) as burster,
                Client.connect(d.endpoint, timeout=30) as watcher,
            ):
                acked: list[str] = []

                async def burst() -> None:
                    try:
                        handles = await burster.submit_many("examples.agents:noop", [None] * n, turn_ids=ids)
                    except DaemonShuttingDown as exc:
                        handles = [h for h in exc.handles if h is not None]
                    except DaemonUnavailable:
                        handles = []  # the daemon went with requests unread: the journal tells
                    acked.extend(h.turn_id for h in handles)

                with anyio.fail_after(60):  # far inside request_timeout: an unanswered submit hangs
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(burst)
                        while True:
                            status = await watcher.status()
                            if status["queue"] or status["daemon"]["turns_kept"]:
                                break
                        os.kill(d.pid, signal.SIGTERM)
                assert d.proc.wait(timeout=60) == 0
        recorded = sorted(
            (row["turn_id"] for row in read_history(journal, limit=2 * n)), key=lambda t: int(t[2:])
        )
        assert 0 < len(recorded) <= n
        assert recorded == ids[: len(recorded)], "the journal holds no prefix of the burst"
        assert set(acked) <= set(recorded)
        with serving(*opts) as again:
            async with Client.connect(again.endpoint, timeout=30, request_timeout=120) as client:
                with anyio.fail_after(120):
                    results = await client.results([client.handle(t) for t in recorded])
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert [r.turn_id for r in results] == recorded
    assert {r.outcome for r in results} <= {"completed", "aborted"}, {r.outcome for r in results}


@pytest.mark.parametrize("journal", [False, True], ids=["no-journal", "journal"])
async def test_a_client_that_vanishes_behind_its_backlog_leaves_nothing_held(journal: bool) -> None:
    """DAEMON-INTAKE-FAIR and CLIENT-GONE attacked: a raw client sends 10,000 submits of a long turn in one
    frame, each asking for its result too (``wait``), reads the first ack (the rest wait in the
    daemon's backlog, a slice per loop pass) and vanishes while the daemon is still working through
    them. Another client's ``status()`` is answered while the backlog drains (before, it waited
    behind the whole frame). The daemon handles every request it read, each turn exactly once, and
    holds nothing for the vanished client (status: 0 waits, one client left); after a cancel of the
    session every turn ends ``aborted`` (with the journal: recorded with that one end)."""
    home = daemonkit.short_dir()
    n = 10_000
    path = str(home / "j.sqlite3")
    store = ("--journal", path) if journal else ("--no-journal",)
    opts = (*FAST, *store, "--max-queue", str(2 * n), "--keep-results", str(2 * n))
    ids = [f"v-{i}" for i in range(n)]
    noinput = msgspec.Raw(msgspec.msgpack.encode(None))
    frame = client_link.encode_batch(
        [
            wire.encode(client_link.Submit(i + 2, LONG_TURN, noinput, session="vanish", turn_id=t, wait=True))
            for i, t in enumerate(ids)
        ]
    )
    try:
        with serving(*opts) as d:
            async with Client.connect(d.endpoint, timeout=30) as watcher:
                ctx = zmq.asyncio.Context()
                sock = ctx.socket(zmq.DEALER)
                try:
                    sock.connect(d.endpoint)
                    await sock.send(wire.encode(client_link.Hello(1, client_link.CLIENT_PROTOCOL_VERSION)))
                    with anyio.fail_after(30):
                        welcome = client_link.decode_from_daemon_frame(await sock.recv())
                        assert isinstance(welcome[0], client_link.Welcome), welcome
                        await sock.send(frame)
                        first = client_link.decode_from_daemon_frame(await sock.recv())
                    assert any(isinstance(m, client_link.Accepted) for m in first), first
                finally:
                    sock.close(linger=0)  # gone, with most of its frame still unhandled
                    ctx.term()
                seen: list[tuple[int, int, int, int]] = []
                with anyio.fail_after(120):
                    while True:
                        status = await watcher.status()
                        facts = status["daemon"]
                        seen.append(
                            (facts["turns_kept"], facts["waits"], facts["clients"], facts["clients_gone"])
                        )
                        if facts["turns_kept"] >= n and (facts["waits"], facts["clients"]) == (0, 1):
                            break
                        await anyio.sleep(0.05)  # allowed: pacing a bounded poll of the daemon's status
                assert seen[0][0] < n, f"the watcher waited behind the whole backlog: {seen[:3]}"
                assert seen[-1][3] >= 1, seen[-1]  # the vanished client was noticed and freed
                assert status["queue"] + status["running"] == n, status
                await watcher.cancel_session("vanish")
                with anyio.fail_after(120):
                    results = await watcher.results([watcher.handle(t) for t in ids])
                assert {r.outcome for r in results} == {"aborted"}, {r.outcome for r in results}
        if journal:
            rows = read_history(path, limit=2 * n)
            assert sorted(r["turn_id"] for r in rows) == sorted(ids)
            assert {r["outcome"] for r in rows} == {"aborted"}, {r["outcome"] for r in rows}
    finally:
        shutil.rmtree(home, ignore_errors=True)
