"""``submit_many`` and ``results`` (API-MANY): many turns in one call, on the embedded pool and
through a real ``turnpool serve``, attacked where pipelining could break a promise:

* order: handles and results come back in input order, each input's own turn and output;
* checks at the boundary: one bad input (not encodable, too large, a bad ``turn_ids``) refuses
  the whole call before any turn is submitted;
* a partial refusal (a full queue) loses nothing: the accepted turns run and their handles are in
  the error's ``.handles``;
* ``turn_ids`` keep each submit idempotent; an ack from ``submit_many`` is durable (SIGKILL the
  daemon right after it returns, restart: every turn is there);
* ``results`` raises ``UnknownTurn`` and drops its other waits; cancelling it leaves the turns
  running; a daemon that dies under it fails it at once.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from supervisor import (
    Client,
    DaemonUnavailable,
    QueueFull,
    Supervisor,
    SyncClient,
    SyncSupervisor,
    UnknownTurn,
)
from tests.support import daemonkit
from tests.support.daemonkit import FAST, serving
from tests.support.events import first_event

pytestmark = pytest.mark.anyio

ECHO = "examples.agents:echo"
SLOW = "examples.agents:slow"


@asynccontextmanager
async def backend(kind: str, *args: str) -> AsyncIterator[Any]:
    """An embedded ``Supervisor`` or a ``Client`` of a fresh daemon, with ``--max-queue``-like
    options given as daemon flags."""
    if kind == "embedded":
        max_queue = int(args[args.index("--max-queue") + 1]) if "--max-queue" in args else 100_000
        async with Supervisor(workers=2, spares=0, max_queue=max_queue, grace=0.5, kill_after=0.5) as sup:
            yield sup
        return
    with serving(*FAST, "--no-journal", *args) as d:
        async with Client.connect(d.endpoint, timeout=30) as client:
            yield client


KINDS = pytest.mark.parametrize("kind", ["embedded", "daemon"])


@KINDS
async def test_handles_and_results_come_back_in_input_order(kind: str) -> None:
    """2,000 echo turns in one ``submit_many``: one handle per input, in input order, each turn
    distinct; ``results`` of them (given shuffled) answers in the order given, each with its own
    input echoed back."""
    n = 2000
    async with backend(kind) as b:
        with anyio.fail_after(120):
            handles = await b.submit_many(ECHO, [{"i": i} for i in range(n)])
            assert len(handles) == n
            assert len({h.turn_id for h in handles}) == n
            order = list(range(n))[::-1]
            results = await b.results([handles[i] for i in order])
    assert [r.turn_id for r in results] == [handles[i].turn_id for i in order]
    assert [r.outcome for r in results] == ["completed"] * n
    assert [r.output for r in results] == [{"i": i} for i in order]


@KINDS
async def test_one_bad_input_refuses_the_whole_call_before_anything_is_submitted(kind: str) -> None:
    """A non-encodable input last in the list, a ``turn_ids`` of the wrong length, a bad id, an
    input above the size limit, a lone dict instead of a list: each raises at the call, and the
    pool has run no turn at all."""
    async with backend(kind) as b:
        with anyio.fail_after(60):
            with pytest.raises(TypeError, match="turn input #2"):
                await b.submit_many(ECHO, [1, 2, object()])
            with pytest.raises(ValueError, match="2 ids for 3 inputs"):
                await b.submit_many(ECHO, [1, 2, 3], turn_ids=["a", "b"])
            with pytest.raises(TypeError, match="non-empty string"):
                await b.submit_many(ECHO, [1, 2], turn_ids=["a", ""])
            with pytest.raises(ValueError, match="limit"):
                await b.submit_many(ECHO, [1, "x" * (70 * 1024 * 1024)])
            with pytest.raises(TypeError, match="not a dict"):
                await b.submit_many(ECHO, {"text": "hi"})
            with pytest.raises(TypeError, match="handles or non-empty turn id"):
                await b.results([None])
            assert await b.submit_many(ECHO, []) == []
            assert await b.results([]) == []
            status = await b.status()
    assert status["queue"] == 0
    assert status["outcomes"] == {}, status["outcomes"]


@KINDS
async def test_a_partial_refusal_keeps_the_accepted_turns_and_hands_them_back(kind: str) -> None:
    """A queue of 4 behind 2 busy workers, then ``submit_many`` of 10 slow turns: ``QueueFull``
    is raised with ``.handles``: a handle for each accepted turn, ``None`` for each refused. The
    accepted ones really exist (queued, then cancelled: each ends once, never started); the
    refused ones do not."""
    async with backend(kind, "--max-queue", "4") as b:
        with anyio.fail_after(120):
            busy = [await b.submit(SLOW, {"seconds": 60}) for _ in range(2)]
            for h in busy:  # both workers hold a turn: the queue is what is left
                await first_event(h)
            with pytest.raises(QueueFull) as caught:
                await b.submit_many(SLOW, [{"seconds": 60}] * 10, turn_ids=[f"m{i}" for i in range(10)])
            handles = caught.value.handles
            assert len(handles) == 10
            accepted = [h for h in handles if h is not None]
            assert len(accepted) == 4, handles
            assert "4 of 10 turns were accepted" in "".join(caught.value.__notes__)
            for i, h in enumerate(handles):
                if h is None:
                    with pytest.raises(UnknownTurn):
                        await b.handle(f"m{i}").result()
            for h in accepted + busy:  # the queued ones first: none gets a freed worker
                await h.cancel()
            ended = await b.results(busy + accepted)
    assert [(r.outcome, r.started) for r in ended[2:]] == [("aborted", False)] * 4  # cancelled while queued
    assert {r.turn_id for r in ended[2:]} == {h.turn_id for h in accepted}


@KINDS
async def test_turn_ids_keep_each_submit_idempotent(kind: str) -> None:
    """The same ``submit_many`` with the same ``turn_ids`` twice: the same turns, each run once
    (a second run would echo again and count a second turn on the workers)."""
    ids = [f"same-{i}" for i in range(50)]
    async with backend(kind) as b:
        with anyio.fail_after(60):
            first = await b.submit_many(ECHO, list(range(50)), turn_ids=ids)
            await b.results(first)
            again = await b.submit_many(ECHO, list(range(50)), turn_ids=ids)
            results = await b.results(again)
            status = await b.status()
    assert [h.turn_id for h in again] == ids == [h.turn_id for h in first]
    assert [r.output for r in results] == list(range(50))
    assert status["outcomes"] == {"completed": 50}, status["outcomes"]


async def test_results_raises_unknown_turn_and_drops_its_other_waits() -> None:
    """``results`` over a running turn and an id nobody knows raises ``UnknownTurn`` for the
    unknown one at once (not after the running turn ends), and leaves no wait behind in the
    client: a later ``results`` of the same turn still gets its result."""
    with serving(*FAST, "--no-journal") as d:
        async with Client.connect(d.endpoint, timeout=30) as client:
            with anyio.fail_after(60):
                running = await client.submit(SLOW, {"seconds": 0.5})
                with pytest.raises(UnknownTurn, match="no-such-turn"):
                    await client.results([running, "no-such-turn"])
                assert client._pending == {}  # the running turn's wait was dropped too
                (result,) = await client.results([running.turn_id])
    assert result.outcome == "completed"


async def test_cancelling_results_leaves_the_turns_running() -> None:
    """A wait on ``results`` cut short by a cancel scope: the turns go on (a handle only
    observes) and end as they would have; the cancelled wait left nothing pending."""
    with serving(*FAST, "--no-journal") as d:
        async with Client.connect(d.endpoint, timeout=30) as client:
            with anyio.fail_after(60):
                handles = await client.submit_many(SLOW, [{"seconds": 0.5}] * 2)
                with anyio.move_on_after(0.05) as scope:
                    await client.results(handles)
                assert scope.cancelled_caught
                assert client._pending == {}
                results = await client.results(handles)
    assert [r.outcome for r in results] == ["completed", "completed"]


async def test_a_daemon_killed_under_results_fails_the_wait_at_once() -> None:
    """SIGKILL the daemon while ``results`` waits on turns that would run a minute: the wait
    raises ``DaemonUnavailable`` within the connection's loss detection, not after the turns."""
    with serving(*FAST, "--no-journal") as d:
        async with Client.connect(d.endpoint, timeout=30) as client:
            handles = await client.submit_many(SLOW, [{"seconds": 60}] * 4)
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:

                    async def kill_soon() -> None:
                        await anyio.wait_all_tasks_blocked()
                        os.kill(d.pid, signal.SIGKILL)

                    tg.start_soon(kill_soon)
                    with pytest.raises(DaemonUnavailable):
                        await client.results(handles)
            d.proc.wait(timeout=30)


async def test_every_turn_submit_many_returned_is_durable() -> None:
    """Journal on: ``submit_many`` of 300 slow turns returns (every ack in: each after its row is
    committed); the daemon is SIGKILLed at once. Restarted on the same journal it knows all 300."""
    keep = daemonkit.short_dir()
    journal = str(keep / "j.sqlite3")
    try:
        with serving(*FAST, "--workers", "1", "--journal", journal) as d:
            async with Client.connect(d.endpoint, timeout=30) as client:
                with anyio.fail_after(120):
                    handles = await client.submit_many(SLOW, [{"seconds": 60}] * 300)
                os.kill(d.pid, signal.SIGKILL)
            d.proc.wait(timeout=30)
        with serving(*FAST, "--workers", "1", "--journal", journal) as again:
            async with Client.connect(again.endpoint, timeout=30) as client:
                with anyio.fail_after(120):
                    missing = [h.turn_id for h in handles if not await client.exists(h.turn_id)]
                    for h in handles:
                        await client.cancel(h.turn_id)
    finally:
        shutil.rmtree(keep, ignore_errors=True)
    assert len(handles) == 300
    assert missing == [], f"{len(missing)} of 300 acknowledged turns were lost"


def test_the_blocking_fronts_offer_both_and_give_blocking_handles() -> None:
    """``SyncSupervisor`` and ``SyncClient``: ``submit_many`` returns blocking handles, whose
    ``result()`` blocks; ``results`` takes them (or ids) and answers in order."""
    with SyncSupervisor(workers=1, spares=0) as sup:
        handles = sup.submit_many(ECHO, ["a", "b"])
        assert handles[1].result().output == "b"
        assert [r.output for r in sup.results(handles)] == ["a", "b"]
    with serving(*FAST, "--no-journal") as d, SyncClient.connect(d.endpoint, timeout=30) as client:
        handles = client.submit_many(ECHO, ["c", "d"])
        assert handles[0].result().output == "c"
        assert [r.output for r in client.results([h.turn_id for h in handles])] == ["c", "d"]
