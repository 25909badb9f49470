"""JOURNAL-GROUP and JOURNAL-GATE-RESUME: journal rows grouped per statement, and the dispatch gate's walk
that does not start again from the head of the queue at every pump. What that could break, attacked with a
real writer process, real SQLite files, a real pool and a real ``turnpool serve``:

* an accept row whose id is already in the journal, in the middle of a grouped batch, is reported
  for its own turn (and in its place among the batch's callbacks), on the writer thread and on the
  event loop (JOURNAL-DIRECT);
* rows of one turn written in one pass (accept, dispatched, running, ended), among other turns'
  rows, reach the file in their order: the turn ends ``ended`` with its start's values;
* behind a gate, with queued turns cancelled whether cleared or not and workers crashing (their
  handed turns go back to the front of the queue), every other turn still runs and the gate never
  has more turns cleared and waiting than its bound: ``CLEAR_AHEAD`` windows of the workers'
  prefetch while turns are short (JOURNAL-GATE-AHEAD), the workers alone while turns are long;
* the daemon SIGKILLed the moment ``submit_many`` returned (every ack in): after a restart every
  acknowledged turn is there, and none ran twice (each agent run notes itself in a file).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import wire
from supervisor import Client, Supervisor
from supervisor.journal import Journal, read_history
from supervisor.lowlevel import CLEAR_AHEAD
from tests.support import daemonkit
from tests.support.daemonkit import FAST, serving
from tests.support.journalkit import completed, record


@pytest.mark.parametrize("path", ["thread", "loop"])
def test_a_conflict_in_the_middle_of_a_grouped_batch_is_reported_for_its_own_turn(
    tmp_path: Path, path: str
) -> None:
    """JOURNAL-LOOKUP with JOURNAL-GROUP: one pass writes accept rows ``a``, ``dup`` (an id already in the
    journal) and ``c``, with a start and an end of another turn and a dispatched row between them. The writer
    runs them grouped per statement; the conflict comes back for ``dup`` alone (its ``on_fail`` with
    ``conflict`` true, never its ``on_commit``), in its place among the batch's callbacks; the journal keeps
    ``dup``'s first row untouched and has every other row."""
    file = tmp_path / "j.sqlite3"
    journal = Journal.open(file)
    calls: list[tuple[str, object]] = []
    try:
        journal.accepted(record("dup", tag=b"first"))
        journal.accepted(record("x"))
        journal.flush()

        def commit(name: str) -> Any:
            return lambda: calls.append((name, "committed"))

        def fail(name: str) -> Any:
            return lambda why, conflict: calls.append((name, ("failed", conflict, why)))

        async def one_pass() -> None:
            if path == "loop":
                assert journal.attach() is True
            done = asyncio.get_running_loop().create_future()
            journal.accepted(record("a"), commit("a"), fail("a"))
            journal.started("x", 4242)
            journal.accepted(record("dup", tag=b"second"), commit("dup"), fail("dup"))
            journal.dispatched(["a"], commit("dispatched a"))
            journal.ended(completed("x"))
            loop = asyncio.get_running_loop()
            journal.accepted(record("c"), lambda: loop.call_soon_threadsafe(done.set_result, None), fail("c"))
            journal.hand_over()  # the whole pass as one batch
            with anyio.fail_after(30):
                await done

        asyncio.run(one_pass())
    finally:
        assert journal.close(timeout=30)
    names = [name for name, _ in calls]
    assert names == ["a", "dup", "dispatched a"], calls
    assert calls[1][1][:2] == ("failed", True) and "'dup'" in calls[1][1][2]  # type: ignore[index]
    rows = {r["turn_id"]: r for r in read_history(file)}
    assert set(rows) == {"dup", "x", "a", "c"}
    assert rows["a"]["state"] == "dispatched" and rows["c"]["state"] == "queued"
    assert rows["x"]["state"] == "ended" and rows["x"]["worker_pid"] == 4242
    assert rows["dup"]["state"] == "queued"
    with contextlib.closing(sqlite3.connect(file)) as con:
        (raw,) = con.execute("SELECT input FROM turns WHERE turn_id='dup'").fetchone()
    assert wire.decode_payload(raw)["tag"] == b"first".hex()  # the first row, untouched


def test_rows_of_one_turn_in_one_pass_reach_the_file_in_their_order(tmp_path: Path) -> None:
    """JOURNAL-GROUP runs a batch's statements grouped (accept, queued again, dispatched, running,
    running + ended, ended): a turn whose every row is written in one pass — interleaved with
    other turns' rows, its end written before another turn's accept — ends ``ended`` with its
    start's pid and time; a turn that ran, requeued by recovery and cleared again in the same
    batch, is ``dispatched`` with its new attempt (cleared first, it stayed ``queued`` and a crash
    would have run it again as if it never had); the other turns' rows are all there too."""
    file = tmp_path / "j.sqlite3"
    journal = Journal.open(file)
    try:
        journal.accepted(record("old"))
        journal.accepted(record("again"))
        journal.dispatched(["again"], lambda: None)
        journal.started("again", 5)
        journal.flush()
        before = time.time()

        async def one_pass() -> None:
            # Recovery requeues a turn that may have run, and readmitting it clears it at once.
            journal.requeued("again", 2)
            journal.dispatched(["again"], lambda: None)
            journal.ended(completed("old"))  # an end first, of a turn accepted earlier
            journal.accepted(record("k"))
            journal.accepted(record("other"))
            journal.dispatched(["k"], lambda: None)
            journal.started("k", 77)
            journal.dispatched(["other"], lambda: None)
            journal.ended(completed("k"))
            journal.hand_over()

        asyncio.run(one_pass())
        journal.flush()
    finally:
        assert journal.close(timeout=30)
    rows = {r["turn_id"]: r for r in read_history(file)}
    assert rows["old"]["state"] == "ended"
    k = rows["k"]
    assert k["state"] == "ended" and k["outcome"] == "completed" and k["worker_pid"] == 77
    assert k["started_at"] >= before
    assert rows["other"]["state"] == "dispatched"
    assert rows["again"]["state"] == "dispatched" and rows["again"]["attempts"] == 2


@pytest.mark.anyio
async def test_the_gate_walk_stays_exact_with_cancels_and_turns_back_at_the_front() -> None:
    """JOURNAL-GATE-RESUME: behind a dispatch gate that records and clears turns asynchronously (as the
    journal does), 600 short turns on 2 workers; every fifth is cancelled as soon as it is accepted, every
    seventh a while later (cleared or not by then), and every 97th crashes its worker (the turns handed ahead
    to it go back to the front of the queue). Every other turn completes — a gate whose count of cleared turns
    drifted up would stop clearing, and the run would hang — and at no call does the gate have more turns
    cleared and waiting than ``CLEAR_AHEAD`` × capacity × prefetch (JOURNAL-GATE-AHEAD)."""
    loop = asyncio.get_running_loop()
    worst = 0
    async with Supervisor(workers=2, spares=0, grace=0.5, kill_after=0.5, max_queue=10_000) as sup:
        bound = CLEAR_AHEAD * sup.workers * sup.prefetch

        cleared: set[str] = set()  # given to the gate, not started or ended yet

        def gate(turns: list[Any]) -> None:
            nonlocal worst
            worst = max(worst, len(cleared) + len(turns))
            cleared.update(t.id for t in turns)
            loop.call_soon(sup.clear_for_dispatch, turns)

        sup.set_dispatch_gate(gate)
        sup.add_hooks(
            on_accept=lambda turn: loop.call_soon(sup.mark_recorded, turn),
            on_start=lambda turn, pid: cleared.discard(turn.id),
            on_result=lambda turn, result: cleared.discard(turn.id),
        )
        handles = []
        with anyio.fail_after(120):
            for i in range(600):
                if i % 97 == 96:
                    handle = await sup.submit("examples.agents:crasher")
                else:
                    handle = await sup.submit("examples.agents:echo", {"i": i})
                handles.append(handle)
                if i % 5 == 4:
                    await handle.cancel()
                if i % 7 == 6 and i >= 14:
                    await handles[i - 7].cancel()
                if i % 50 == 0:
                    await (
                        anyio.lowlevel.checkpoint()
                    )  # allowed: let recording and clearing interleave with submits
            results = [await h.result() for h in handles]
    for i, result in enumerate(results):
        if i % 97 == 96:
            assert result.outcome in ("crashed", "aborted"), (i, result)
        elif result.cause is not None and result.outcome != "aborted":
            # A cancel that found the turn running races its End: an agent that had already returned
            # ends completed (the Abort is stale when it arrives), with the cause it was asked with.
            assert result.started and result.outcome == "completed" and result.output == {"i": i}, (i, result)
        elif result.cause is None:
            assert result.outcome == "completed" and result.output == {"i": i}, (i, result)
    assert sum(r.outcome == "completed" for r in results) > 300
    assert worst <= bound, f"{worst} turns cleared and waiting, more than {bound}"


@pytest.mark.anyio
async def test_long_turns_get_no_cleared_reserve() -> None:
    """JOURNAL-GATE-AHEAD is for short turns only: turns longer than the prefetch window are not handed ahead
    (depth 1), and behind a gate no more of them are cleared than the workers run at once. Were the
    reserve applied to them, turns would be cleared that wait long behind running ones, and a
    daemon killed meanwhile would end them ``crashed`` though they never ran."""
    loop = asyncio.get_running_loop()
    worst = 0
    async with Supervisor(workers=2, spares=0, grace=0.5, kill_after=0.5, prefetch_window=0.002) as sup:
        cleared: set[str] = set()  # cleared, not ended yet (running included)

        def gate(turns: list[Any]) -> None:
            nonlocal worst
            cleared.update(t.id for t in turns)
            worst = max(worst, len(cleared))
            loop.call_soon(sup.clear_for_dispatch, turns)

        sup.set_dispatch_gate(gate)
        sup.add_hooks(
            on_accept=lambda turn: loop.call_soon(sup.mark_recorded, turn),
            on_result=lambda turn, result: cleared.discard(turn.id),
        )
        with anyio.fail_after(60):
            handles = [await sup.submit("examples.agents:slow", {"seconds": 0.03}) for _ in range(12)]
            results = [await h.result() for h in handles]
    assert [r.outcome for r in results] == ["completed"] * 12
    assert 1 <= worst <= 2, f"{worst} long turns cleared at once on 2 workers"


def _runs(log: str) -> list[str]:
    """The turn ids the counting agents noted, one per run."""
    path = Path(log)
    return path.read_text().split() if path.exists() else []


@pytest.mark.anyio
async def test_sigkill_right_after_submit_many_keeps_every_ack_and_runs_none_twice() -> None:
    """Journal on, grouped batches: ``submit_many`` of 3,000 counting turns; the moment it returns
    (every ack in) the daemon is SIGKILLed. Restarted on the same journal, every acknowledged turn
    is known and ends; each ran at most once, counted by the agents themselves."""
    keep = daemonkit.short_dir()
    journal = str(keep / "j.sqlite3")
    log = str(keep / "runs.log")
    n = 3000
    try:
        with serving(*FAST, "--journal", journal, "--max-queue", "10000") as d:
            async with Client.connect(d.endpoint, timeout=30, request_timeout=120) as client:
                with anyio.fail_after(120):
                    handles = await client.submit_many(
                        "tests.agents.journal:count", [{"log": log, "ms": 0} for _ in range(n)]
                    )
                os.kill(d.pid, signal.SIGKILL)
            d.proc.wait(timeout=30)
        acked = [h.turn_id for h in handles]
        assert len(acked) == n
        with serving(*FAST, "--journal", journal, "--max-queue", "10000") as again:
            async with Client.connect(again.endpoint, timeout=30, request_timeout=120) as client:
                with anyio.fail_after(180):
                    results = await client.results([client.handle(t) for t in acked])
        runs = _runs(log)
    finally:
        shutil.rmtree(keep, ignore_errors=True)
    assert [r.turn_id for r in results] == acked
    assert all(r.outcome in ("completed", "crashed") for r in results), {r.outcome for r in results}
    twice = {t for t in runs if runs.count(t) > 1} if len(runs) != len(set(runs)) else set()
    assert not twice, f"ran twice: {sorted(twice)[:10]}"
    ran = set(runs)
    assert all(r.turn_id in ran for r in results if r.outcome == "completed")
