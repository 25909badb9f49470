"""The daemon's per-client state is bounded and freed (issue 13, items 9 and 10, and two smaller items).

Attacks, each against a real ``turnpool serve``: thousands of raw clients that ask and vanish; a
client that stops waiting; followers that never read, next to an event flood and other clients;
a result at the message-size limit; a CURVE key the daemon does not know.
"""

from __future__ import annotations

import os
import time
import typing
from contextlib import aclosing
from typing import Any

import anyio
import msgspec
import psutil
import pytest
import zmq
import zmq.asyncio
import zmq.auth

import wire
from supervisor import AuthenticationFailed, Client, DaemonUnavailable, EventsDropped, InvalidAgent
from supervisor.daemon.clients import WINDOWLESS_BATCH_BYTES, batch_frames
from supervisor.daemon.endpoint import CLIENT_SNDHWM
from tests.support import daemonkit
from tests.support.daemonkit import FAST, serving
from tests.support.memkit import rss_under
from wire import client_link

pytestmark = pytest.mark.anyio

LONG = "tests.agents.client:wait_for_cancel"


async def _daemon_facts(client: Client) -> dict[str, Any]:
    return dict((await client.status())["daemon"])


async def _until(client: Client, what: str, check: Any, limit: float = 60.0) -> dict[str, Any]:
    """Poll the daemon's status until ``check(daemon facts)`` holds, bounded by ``limit``."""
    with anyio.fail_after(limit):
        while True:
            facts = await _daemon_facts(client)
            if check(facts):
                return facts
            await anyio.sleep(0.05)  # allowed: pacing a bounded poll of the daemon's status (no event)


async def _first_event(client: Client, turn_id: str) -> Any:
    with anyio.fail_after(60):
        async with aclosing(client.handle(turn_id).events()) as events:
            async for event in events:
                return event
    raise AssertionError("no event")


# MEM-TRIM: how close to its RSS before an attack the daemon comes back once the attackers are gone.
RSS_BACK = 64 * 2**20


async def test_vanished_clients_free_their_streams_waits_and_memory() -> None:
    """2,000 raw clients send ``Follow`` + ``GetResult`` for a long turn and close: the daemon
    notices each disconnect and frees every stream and pending result wait (its status says 0),
    its RSS grows by no more than a generous bound, and the turn runs on untouched."""
    batches, per_batch = 4, 500
    with serving(*FAST, "--no-journal") as d:
        daemon = psutil.Process(d.pid)
        async with Client.connect(d.endpoint, timeout=30) as client:
            handle = await client.submit(LONG)
            await _first_event(client, handle.turn_id)
            rss_before = daemon.memory_info().rss
            ctx = zmq.asyncio.Context()
            try:
                for batch in range(batches):
                    socks = []
                    for _ in range(per_batch):
                        sock = ctx.socket(zmq.DEALER)
                        sock.setsockopt(zmq.LINGER, 0)
                        sock.connect(d.endpoint)
                        await sock.send(wire.encode(client_link.Follow(1, handle.turn_id, 64)))
                        await sock.send(wire.encode(client_link.GetResult(2, handle.turn_id)))
                        socks.append(sock)
                    # Every request arrived (the daemon holds them) before the clients vanish.
                    await _until(
                        client,
                        "requests held",
                        lambda f: f["streams"] >= per_batch and f["waits"] >= 2 * per_batch,
                    )
                    for sock in socks:
                        sock.close(linger=0)
                    facts = await _until(
                        client, "freed", lambda f: (f["streams"], f["waits"], f["clients"]) == (0, 0, 1)
                    )
                    print(f"batch {batch}: freed; {facts['clients_gone']} clients seen gone")
            finally:
                ctx.term()
            # Waited for (bounded): a snapshot right after the frees reads what the allocator has not
            # handed back yet, which the daemon does within a second or two (MEM-TRIM).
            rss_after = await rss_under(daemon, rss_before + RSS_BACK)
            status = await client.status()
            assert status["running"] == 1, status  # the turn was never touched
            grown = (rss_after - rss_before) / 2**20
            print(f"daemon RSS grew {grown:.1f} MiB after {batches * per_batch} vanished clients")
            assert grown < 64, grown
            assert await handle.cancel() == {"kind": "user"}
            with anyio.fail_after(60):
                assert (await handle.result()).outcome == "aborted"


async def test_a_cancelled_wait_frees_its_state_and_the_turn_runs_on() -> None:
    """Cancelling a pending ``result()``, ``events()`` or ``when_idle()`` on the client side sends
    ``Abandon``: the daemon drops that request (status shows 0 waits) and the turn keeps running."""
    with serving(*FAST, "--no-journal") as d:
        async with Client.connect(d.endpoint, timeout=30) as client:
            handle = await client.submit(LONG)
            await _first_event(client, handle.turn_id)
            base = (await _daemon_facts(client))["waits"]

            async def wait_result() -> None:
                await handle.result()

            async def follow() -> None:
                async with aclosing(handle.events()) as events:
                    async for _ in events:
                        pass

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_result)
                tg.start_soon(follow)
                tg.start_soon(client.when_idle)
                await _until(client, "three waits", lambda f: f["waits"] == base + 3)
                tg.cancel_scope.cancel()
            facts = await _until(client, "freed", lambda f: f["waits"] == base and f["streams"] == 0)
            assert facts["waits"] == 0
            status = await client.status()
            assert status["running"] == 1 and status["outcomes"] == {}, status
            await handle.cancel()
            with anyio.fail_after(60):
                assert (await handle.result()).outcome == "aborted"


# CLIENT-NO-WINDOW: what a client that reads nothing can have queued of its window-less follows' events: a
# batch of at most WINDOWLESS_BATCH_BYTES in each message of its queue (CLIENT_SNDHWM of them), one more
# batch per follow that the send which found the queue full kept owed, and what the kernel's socket
# buffers took off the queue (at most its default send buffer: the client's receive side holds 1 message).
def _windowless_bound(follows: int) -> int:
    with open("/proc/sys/net/core/wmem_default") as f:
        kernel = int(f.read())
    return (CLIENT_SNDHWM + follows) * WINDOWLESS_BATCH_BYTES + kernel


async def _read_until_told(sock: zmq.Socket[bytes], reqs: set[int]) -> tuple[int, dict[int, str]]:
    """A client that read nothing reads now: every frame queued for it, until each follow ``reqs``
    was ended (``FollowEnd``: everything was sent) or dropped (the ``Error`` owed to a client dropped
    when its queue filled). Returns the bytes of events it got and how each follow ended."""
    got = 0
    ended: dict[int, str] = {}
    with anyio.fail_after(60):
        while len(ended) < len(reqs):
            while not sock.poll(0):  # noqa: ASYNC110 - a plain (sync) zmq socket: no event on the loop
                await anyio.sleep(0.01)  # allowed: pacing a bounded poll of it
            for reply in client_link.decode_from_daemon_frame(sock.recv()):
                if isinstance(reply, client_link.Events):
                    got += sum(map(len, reply.data))
                elif isinstance(reply, (client_link.FollowEnd, client_link.Error)) and reply.req in reqs:
                    ended[reply.req] = reply.code if isinstance(reply, client_link.Error) else "end"
    return got, ended


async def test_a_stopped_windowless_client_is_dropped_within_its_bound() -> None:
    """CLIENT-NO-WINDOW, measured: a turn emits 1,000 events of 8 KB (8 MB, all kept) and waits. A raw
    client that follows it once without a window, and one that follows it eight times, read nothing
    until the daemon drops them; then they read what was queued for them. Each was dropped (each
    follow ends with ``lagged``), and the events it had queued are within ``_windowless_bound``:
    CLIENT_SNDHWM × 16 KiB (4 MiB), one owed batch per follow, the kernel's socket buffer. Before,
    the eight follows' 16 KiB batches of one loop pass went out merged into 64 KiB frames, and the
    client's queue held ≈ 16 MiB of them."""
    with serving(*FAST, "--no-journal") as d:
        ctx = zmq.Context()
        socks: list[zmq.Socket[bytes]] = []
        try:
            async with Client.connect(d.endpoint, timeout=30) as client:
                stalled_before = (await _daemon_facts(client))["clients_stalled"]
                handle = await client.submit(
                    "tests.agents.client:flood", {"count": 1000, "size": 8000, "wait": True}
                )
                plans = {1: {2}, 8: set(range(2, 10))}
                for reqs in plans.values():
                    sock = ctx.socket(zmq.DEALER)
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.setsockopt(zmq.RCVHWM, 1)  # a client that reads nothing keeps its queue full
                    sock.connect(d.endpoint)
                    sock.send(wire.encode(client_link.Hello(1, client_link.CLIENT_PROTOCOL_VERSION)))
                    for req in sorted(reqs):
                        sock.send(wire.encode(client_link.Follow(req, handle.turn_id, 0)))
                    socks.append(sock)
                await _until(client, "dropped", lambda f: f["clients_stalled"] >= stalled_before + 2)
                measured = []
                for (follows, reqs), sock in zip(plans.items(), socks, strict=True):
                    got, ended = await _read_until_told(sock, reqs)
                    measured.append((follows, got, _windowless_bound(follows)))
                    assert set(ended.values()) == {"lagged"}, ended
                print(f"window-less events queued (follows, bytes, bound): {measured}")
                for follows, got, bound in measured:
                    assert got <= bound, (follows, got, bound)
                    assert got >= CLIENT_SNDHWM * WINDOWLESS_BATCH_BYTES // 2, (follows, got)  # it was full
                await handle.cancel()
                with anyio.fail_after(60):
                    assert (await handle.result()).outcome == "aborted"
        finally:
            for sock in socks:
                sock.close(linger=0)
            ctx.term()


async def _flood_while(endpoint: str, count: int, stopped: int) -> tuple[float, int, dict[str, Any]]:
    """Run a ``count``-event flood turn with ``stopped`` followers that never read (half with no
    window, half windowed) while another client submits echo turns. Returns the flood's run time,
    how many echo turns completed meanwhile, and the daemon's facts after."""
    ctx = zmq.Context()
    socks = []
    try:
        async with Client.connect(endpoint, timeout=30) as client:
            stalled_before = (await _daemon_facts(client))["clients_stalled"]
            handle = await client.submit("tests.agents.client:flood", {"count": count})
            for i in range(stopped):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.RCVHWM, 1)  # a client that reads nothing keeps its queue full
                sock.connect(endpoint)
                sock.send(wire.encode(client_link.Hello(1, client_link.CLIENT_PROTOCOL_VERSION)))
                sock.send(wire.encode(client_link.Follow(2, handle.turn_id, 0 if i % 2 == 0 else 1024)))
                socks.append(sock)
            done = 0

            async def others() -> None:
                nonlocal done
                while True:
                    assert (await client.run("examples.agents:echo", done)).output == done
                    done += 1

            with anyio.fail_after(300):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(others)
                    result = await handle.result()
                    tg.cancel_scope.cancel()
            assert result.outcome == "completed", result
            if not stopped:
                return result.run_s, done, await _daemon_facts(client)
            # CLIENT-NO-WINDOW: each window-less one was either sent less than its bound (it skipped ahead
            # when the daemon fell behind the flood: EVENTS-GAP-WHERE) and ended, or dropped when its
            # queue filled; either way, what was queued for it (read now) is within the bound.
            await _until(client, "window-less follows done", lambda f: f["streams"] <= stopped // 2)
            for sock in socks[::2]:
                got, ended = await _read_until_told(sock, {2})
                assert got <= _windowless_bound(1), got
                assert ended[2] in ("end", "lagged"), ended
            facts = await _daemon_facts(client)
            facts["windowless_dropped"] = facts["clients_stalled"] - stalled_before
            return result.run_s, done, facts
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.term()


# Generous: on a shared 2-core box the crowded window is short and noisy. Before the first fix the
# other client got ~3 % of its rate alone (36/s against 1 052/s); measured after CLIENT-NO-WINDOW
# 7-130 %, mostly 20-80 % (single rounds; 7 % with other tests running beside it).
CROWD_SHARE = 0.08


def _rate_within_bound(alone_s: float, alone_done: int, crowd_s: float, crowd_done: int) -> bool:
    """One round's rate of the other client with 20 stopped followers against none."""
    return crowd_done / crowd_s > CROWD_SHARE * alone_done / alone_s


async def test_stopped_followers_hold_back_neither_the_turn_nor_other_clients() -> None:
    """20 followers that never read an event-flooding turn: the turn runs about as fast as with
    none, another client's submits and results go on at a comparable rate (generous bounds), the
    stopped followers cost a bounded queue each (the daemon's memory stays bounded), and it gets back
    what it grew once they are gone. CLIENT-NO-WINDOW: what each window-less one had queued, read
    once the turn is over, is within its bound (≈ 4 MiB) of a flood of ≈ 12 MB; before, when
    the daemon fell behind, 256 full 64 KiB batches held the whole flood, the daemon pushed ≈ 12 MB
    to each (RSS +120-220 MiB) and the other client got 3-12 % of its rate."""
    # A window of 2-4 s (100,000 gave ≈ 0.3 s: too short to measure a rate).
    count = 400_000
    with serving(*FAST, "--no-journal") as d:
        daemon = psutil.Process(d.pid)
        async with Client.connect(d.endpoint, timeout=30) as client:
            await client.run("examples.agents:echo", 0)
        alone_s, alone_done, _ = await _flood_while(d.endpoint, count, 0)
        rss_before = daemon.memory_info().rss
        crowd_s, crowd_done, facts = await _flood_while(d.endpoint, count, 20)
        rss_peak = daemon.memory_info().rss
        async with Client.connect(d.endpoint, timeout=30) as client:
            after = await _until(client, "followers freed", lambda f: f["streams"] == 0 and f["clients"] <= 1)
            # MEM-TRIM: what the daemon grew goes back to the system once they are gone: it looks
            # once a second. Before, it stayed resident at its peak (+258 MiB in CI, 8 MiB of
            # it in use), so a snapshot here measured the allocator, not what the daemon holds.
            rss_after = await rss_under(daemon, rss_before + RSS_BACK)
            trims = (await _daemon_facts(client))["memory_trims"]
        # A second round for the rates, only when the first missed its bound: on the shared
        # 2-core machine the echo rate alone itself varies 10x from one second to the next (130
        # to 2,000/s), so a miss is retried once and the best of two of each is compared (the
        # same verdict as always running both: the best of two passes iff one round does). A real
        # starvation (36/s against 1,052/s before CLIENT-NO-WINDOW) misses both rounds. The
        # stopped followers' cost is checked exactly above (dropped after 4 MiB).
        alone2_s, alone2_done, crowd2_s, crowd2_done = alone_s, alone_done, crowd_s, crowd_done
        if not _rate_within_bound(alone_s, alone_done, crowd_s, crowd_done):
            alone2_s, alone2_done, _ = await _flood_while(d.endpoint, count, 0)
            crowd2_s, crowd2_done, _ = await _flood_while(d.endpoint, count, 20)
    alone_rate = max(alone_done / alone_s, alone2_done / alone2_s)
    crowd_rate = max(crowd_done / crowd_s, crowd2_done / crowd2_s)
    print(
        f"flood of {count}: alone {alone_s:.1f}s, {alone2_s:.1f}s with {alone_done / alone_s:.0f}, "
        f"{alone2_done / alone2_s:.0f} echo/s; with 20 stopped followers {crowd_s:.1f}s, "
        f"{crowd2_s:.1f}s with "
        f"{crowd_done / crowd_s:.0f}, {crowd2_done / crowd2_s:.0f} echo/s; "
        f"RSS +{(rss_peak - rss_before) >> 20} MiB, after they left +{(rss_after - rss_before) >> 20} MiB "
        f"({trims} trims); "
        f"{facts}"
    )
    assert crowd_s < 2 * alone_s + 5
    assert crowd_rate > CROWD_SHARE * alone_rate
    # The windowed ones fell behind the kept events and were told; the window-less ones were
    # either sent everything within the socket's bound or dropped when their queue filled.
    assert facts["lagged_followers"] >= 10
    # CLIENT-NO-WINDOW: the 10 window-less ones had at most their bound queued each (``_flood_while`` read
    # it); those sent more were dropped (test_a_stopped_windowless_client_is_dropped_within_its_bound).
    assert after["streams"] == 0
    # MEM-TRIM: back within ``RSS_BACK`` of where it stood before the crowd (+5 to +39 MiB measured, two
    # CPU hogs beside it; what stays is in use: Python's arenas, the other client's kept turns).
    # ``rss_under`` waited for it: the daemon hands freed memory back once a second.
    assert rss_after - rss_before < RSS_BACK, (rss_after - rss_before, f"{trims} trims")


async def test_a_follower_that_fell_behind_is_told_when_it_reads_again() -> None:
    """A ``Client`` follower that stops reading while the turn emits more than ``--max-events``
    events is not silently skipped ahead: when it reads again, ``events()`` yields
    ``EventsDropped`` saying exactly how many it missed, where, and goes on to the end (protocol 3).
    Following again yields a marker for the events dropped before it started, then the kept ones;
    the turn completes."""
    with serving(*FAST, "--no-journal", "--max-events", "20") as d:
        async with Client.connect(d.endpoint, timeout=30, follow_window=4) as client:
            handle = await client.submit("tests.agents.faults:stream_when_told", {"count": 200})
            with anyio.fail_after(60):
                async with aclosing(handle.events()) as events:
                    first = await events.__anext__()  # read one, then stop reading
                    await handle.cancel()  # the agent now emits 199 more (shielded) and completes
                    result = await handle.result()
                    rest = [event async for event in events]
                again = [e async for e in client.handle(handle.turn_id).events()]
    assert result.outcome == "completed"
    assert first == {"i": 0} and any(isinstance(e, EventsDropped) for e in rest)
    expected = 1
    for event in rest:  # every event is the next one, or a marker says exactly what was skipped
        if isinstance(event, EventsDropped):
            assert event.first == expected and event.count > 0
            expected += event.count
        else:
            assert event["i"] == expected
            expected += 1
    assert expected == 200
    assert isinstance(again[0], EventsDropped) and again[0].first == 0
    assert [e["i"] for e in again[1:]] == list(range(again[0].count, 200)) and len(again) <= 21


async def test_a_client_of_an_unreleased_protocol_version_is_refused() -> None:
    """Client protocols 1 and 2 were never released: a ``Hello`` of either is answered
    ``Error(protocol)`` naming the versions the daemon speaks, never ``Welcome``."""
    with serving(*FAST, "--no-journal") as d:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(d.endpoint)
        try:
            with anyio.fail_after(60):
                for req, version in ((1, 1), (2, 2)):
                    await sock.send(wire.encode(client_link.Hello(req, version)))
                    (reply,) = client_link.decode_from_daemon_frame(await sock.recv())
                    assert isinstance(reply, client_link.Error), reply
                    assert reply.req == req and reply.code == "protocol" and "3" in reply.message
        finally:
            sock.close(linger=0)
            ctx.term()


async def test_a_result_at_the_size_limit_is_fetchable() -> None:
    """An output just under the payload limit, with the longest turn id and session, comes back
    whole; an agent that raises with a message larger than a message frame ends ``failed`` with
    the message cut at the source, its result fetchable by every client, repeatedly."""
    with serving(*FAST, "--no-journal") as d:
        async with Client.connect(d.endpoint, timeout=30) as client:
            with anyio.fail_after(120):
                big = await client.run(
                    "tests.agents.client:near_limit_output",
                    {"slack": 16},
                    turn_id="t" * 256,
                    session="s" * 256,
                )
                assert big.outcome == "completed" and len(big.output) == wire.MAX_PAYLOAD_SIZE - 21
                loud = await client.submit(
                    "tests.agents.client:near_limit_error", turn_id="u" * 256, session="s" * 256
                )
                first = await loud.result()
                huge = await client.run(
                    "tests.agents.client:near_limit_error", {"size": wire.MAX_MESSAGE_SIZE}
                )
                with pytest.raises(InvalidAgent, match="at most"):
                    await client.submit("tests.agents.client:" + "a" * 2000)
        async with Client.connect(d.endpoint, timeout=30) as other:
            with anyio.fail_after(60):
                again = await other.handle("u" * 256).result()
                assert (await other.run("examples.agents:echo", "still fine")).output == "still fine"
    assert first.outcome == again.outcome == "failed"
    assert first.error is not None and first.error.type == "RuntimeError"
    assert len(first.error.message) < 100_000 and first.error.message.startswith("eee")
    assert again == first
    assert huge.outcome == "failed" and huge.error is not None and len(huge.error.message) < 100_000


async def test_a_rejected_curve_key_is_an_authentication_error() -> None:
    """A CURVE client whose key the daemon does not allow gets ``AuthenticationFailed`` (a
    ``DaemonUnavailable``) saying the handshake was refused, not "no daemon is running"; so does a
    client that offers no CURVE at all; an allowed key still gets in."""
    home = daemonkit.short_dir()
    keys, allowed = home / "keys", home / "allowed"
    keys.mkdir()
    allowed.mkdir()
    server_pub, server_sec = zmq.auth.create_certificates(str(keys), "server")
    _, stranger_sec = zmq.auth.create_certificates(str(keys), "stranger")
    friend_pub, friend_sec = zmq.auth.create_certificates(str(keys), "friend")
    os.rename(friend_pub, allowed / "friend.key")
    with serving(
        *FAST,
        "--no-journal",
        "--curve-secret-key",
        server_sec,
        "--curve-clients",
        str(allowed),
        "--allow-agent",  # SEC-SHARED: a tcp:// endpoint needs an agent allowlist besides CURVE
        "examples.agents:*",
        home=home,
        endpoint="tcp://127.0.0.1:0",
    ) as d:
        t0 = time.monotonic()
        with pytest.raises(AuthenticationFailed, match="refused this client") as caught:
            async with Client.connect(
                d.endpoint, timeout=10, curve_server_key=server_pub, curve_secret_key=stranger_sec
            ):
                pass
        assert isinstance(caught.value, DaemonUnavailable)
        assert "no turnpool daemon is running" not in str(caught.value)
        assert time.monotonic() - t0 < 10  # told by the handshake, not by a timeout
        with pytest.raises(AuthenticationFailed, match="requires CURVE"):
            async with Client.connect(d.endpoint, timeout=10):
                pass
        async with Client.connect(
            d.endpoint, timeout=30, curve_server_key=server_pub, curve_secret_key=friend_sec
        ) as friend:
            with anyio.fail_after(60):
                assert (await friend.run("examples.agents:echo", 1)).output == 1


def test_batch_frames_keep_order_and_give_the_alone_replies_frames_of_their_own() -> None:
    """CLIENT-NO-WINDOW, the flush's framing: replies go out in order, merged up to ``BATCH_BYTES``, except
    those queued alone (a window-less follow's events), each in a frame of its own."""
    replies = [wire.encode(client_link.Ok(i)) for i in range(6)]
    big = [wire.encode(client_link.Error(i, "internal", "x" * 40_000)) for i in range(3)]

    def framed(out: list[bytes], alone: list[int]) -> list[list[int]]:
        return [[m.req for m in client_link.decode_from_daemon_frame(f)] for f in batch_frames(out, alone)]

    assert framed(replies, []) == [[0, 1, 2, 3, 4, 5]]
    assert framed(replies, [0]) == [[0], [1, 2, 3, 4, 5]]
    assert framed(replies, [2, 3]) == [[0, 1], [2], [3], [4, 5]]
    assert framed(replies, list(range(6))) == [[i] for i in range(6)]
    assert framed(big, []) == [[0], [1], [2]]  # 64 KiB frames: two 40 KB replies do not share one


def test_wire_evolves_by_addition_only() -> None:
    """The client protocol grows by addition (CLIENT-PROTOCOL): version 3 is the first released one, every
    error code of ``ErrorCode`` is in ``ERROR_CODES``, and a message without its later optional
    fields still decodes."""
    assert client_link.MIN_CLIENT_PROTOCOL_VERSION == client_link.CLIENT_PROTOCOL_VERSION == 3
    assert set(client_link.ERROR_CODES) == set(typing.get_args(client_link.ErrorCode))
    follow_short = msgspec.msgpack.encode(["follow", 3, "t", 0])
    assert client_link.decode_to_daemon(follow_short) == client_link.Follow(3, "t", 0)
    assert client_link.decode_to_daemon(wire.encode(client_link.Abandon(4))) == client_link.Abandon(4)
