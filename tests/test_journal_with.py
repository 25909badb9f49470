"""JOURNAL-GATE-SHARE: a turn's accept row and its "may run" row in one commit. The dispatch gate may clear
a turn as soon as its accept row is written to the journal, before that row is committed; the
"dispatched" row then commits with it or after it, and the turn is handed to a worker only once
both are committed. What that could break, attacked with a real writer process, real SQLite files,
a real pool and a real ``turnpool serve``:

* the gain itself, counted rather than timed: one ``run()`` on an idle journaled daemon costs one
  writer commit before its turn starts, not two;
* behind an asynchronous gate that clears turns before they are recorded, in either order, with
  accept rows refused (withdrawn turns), cancels between the clearance and the commit, and
  crashing workers: no turn starts before it is recorded and cleared, no withdrawn turn ever
  starts, every other turn ends, and the gate's count of cleared turns never drifts;
* a full disk fails the batch that holds both rows: the submits get ``JournalUnavailable``, the
  turns never run and leave no row, the retried "dispatched" rows change nothing, and the gate
  still clears (a drift of its count would stop it for good: the pool would hang);
* an accept row whose id is already in the journal (JOURNAL-LOOKUP), its "dispatched" row in the same batch:
  refused, never run, the existing row not made "dispatched", the gate still clears;
* a cancel of each turn right behind its submit, in the same frame (between its clearance and
  its commit): ended ``aborted`` in the journal, never run, not even after a SIGKILL and a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from supervisor import Client, Daemon, JournalUnavailable, Supervisor
from supervisor.daemon.recovery import attach_journal
from supervisor.journal import Journal, read_history, read_result
from supervisor.lowlevel import CLEAR_AHEAD
from tests.support.daemonkit import FAST, short_dir, start, stop_process, wait_status
from tests.support.diskkit import fill, tmpfs
from tests.test_journal_faults import runs

pytestmark = pytest.mark.anyio

AGENT = "tests.agents.journal:count"


@contextlib.asynccontextmanager
async def _in_process(home: Path, **options: Any) -> AsyncIterator[tuple[Daemon, Journal, str]]:
    """A ``Daemon`` in this process with a real journal (its writer process, its SQLite file), so
    a test can count the journal's commits and stand in for the races it cannot time from outside."""
    journal = Journal.open(home / "j.sqlite3")
    endpoint = f"ipc://{home}/d.sock"
    sup = {"workers": 2, "spares": 0, "grace": 0.5, "kill_after": 0.5, **options}
    daemon = Daemon(endpoint, supervisor=sup, drain=0)
    attach_journal(daemon, journal)
    ready = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: daemon.serve(ready=lambda line: ready.set()))
            try:
                with anyio.fail_after(60):
                    await ready.wait()
                yield daemon, journal, endpoint
            finally:
                daemon.stop()
    finally:
        assert journal.close(timeout=30)


async def _quiet(journal: Journal) -> None:
    """Wait until everything handed to the journal so far is committed (from a thread: on the
    loop, JOURNAL-DIRECT, ``flush`` would block the loop that reads the commit's reply)."""
    with anyio.fail_after(30):
        await anyio.to_thread.run_sync(journal.flush)


async def test_one_run_costs_one_commit_before_its_turn_starts() -> None:
    """The gain, without a clock: on an idle daemon with its journal on, a ``run()``'s turn starts
    after one writer commit — its accept row and its "dispatched" row, two rows in it — where it
    took two commits in a row before (accept, then "dispatched" from the accept's callback). Ten
    runs one at a time, the journal quiet before each; every turn ends ``ended`` in the file."""
    home = short_dir()
    before_start: list[tuple[int, int]] = []
    try:
        async with _in_process(home) as (daemon, journal, endpoint):
            # First in the list: it runs before the journal's own hook writes the "running" row.
            daemon.start_hooks.insert(
                0, lambda turn, pid: before_start.append((journal.commits, journal.rows_written))
            )
            async with Client.connect(endpoint) as client:
                with anyio.fail_after(60):
                    await client.run("examples.agents:noop")  # workers up
                    deltas = []
                    for _ in range(10):
                        await _quiet(journal)
                        commits, rows = journal.commits, journal.rows_written
                        result = await client.run("examples.agents:noop")
                        assert result.outcome == "completed"
                        at_commits, at_rows = before_start[-1]
                        deltas.append((at_commits - commits, at_rows - rows))
                await _quiet(journal)
                file = home / "j.sqlite3"
                states = {r["state"] for r in read_history(file, limit=100)}
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert deltas == [(1, 2)] * 10, deltas
    assert states == {"ended"}


def _doomed(i: int) -> bool:
    """Whether turn ``t{i}`` of the engine test below has its accept row refused (withdrawn)."""
    return i % 11 == 10


async def test_turns_cleared_before_they_are_recorded_start_only_once_recorded_and_cleared() -> None:
    """JOURNAL-GATE-SHARE against the engine's bookkeeping (JOURNAL-GATE-RESUME's counts, ``TurnQueue``'s): a
    gate that clears turns asynchronously (0 to 3 passes of the loop later), and the accept rows of the same
    turns recorded - or refused, every eleventh turn withdrawn as a failed batch does - 1 to 3 passes after
    their accept: a turn's clearance comes before or after its record, and a withdrawn turn's before or after
    its withdrawal (as the journal's retried "dispatched" row does). 600 short turns on 2 workers; every fifth
    cancelled at once (between its clearance and any commit), every seventh a while later, every 97th crashing
    its worker. No turn starts before it is both recorded and cleared; no withdrawn turn starts; every other
    turn ends as it should (a drifted count of cleared turns would stop the gate and hang the run); the gate
    never holds more than ``CLEAR_AHEAD`` × capacity × prefetch cleared and waiting; and many turns were
    cleared before they were recorded (the case under test did happen)."""
    loop = asyncio.get_running_loop()
    rng = random.Random(6006)
    recorded: set[str] = set()
    cleared: set[str] = set()
    withdrawn: set[str] = set()
    waiting: set[str] = set()  # given to the gate, not started or ended yet
    bad_starts: list[str] = []
    outcomes: dict[str, Any] = {}  # each turn's result, as the result hook saw it
    early = 0
    worst = 0

    def later(hops: int, fn: Any, arg: Any) -> None:
        """``fn(arg)`` after ``hops`` passes of the loop."""
        if hops == 0:
            fn(arg)
        else:
            loop.call_soon(later, hops - 1, fn, arg)

    async with Supervisor(workers=2, spares=0, grace=0.5, kill_after=0.5, max_queue=10_000) as sup:
        bound = CLEAR_AHEAD * sup.workers * sup.prefetch

        def clear(turns: list[Any]) -> None:
            cleared.update(t.id for t in turns)
            sup.clear_for_dispatch(turns)

        def gate(turns: list[Any]) -> None:
            nonlocal early, worst
            early += sum(t.id not in recorded for t in turns)
            worst = max(worst, len(waiting) + len(turns))
            waiting.update(t.id for t in turns)
            later(rng.randint(0, 3), clear, turns)

        def record(turn: Any) -> None:
            recorded.add(turn.id)
            sup.mark_recorded(turn)

        def refuse(turn: Any) -> None:
            withdrawn.add(turn.id)
            sup.withdraw(turn, "cannot write the journal: the disk is full (test)")

        def accepted(turn: Any) -> None:
            sup.mark_written(turn)  # as the journal's accept hook does once the row is written
            fate = refuse if _doomed(int(turn.id[1:])) else record
            later(rng.randint(1, 3), fate, turn)  # (a commit's answer never comes inside the accept)

        def started(turn: Any, pid: int) -> None:
            waiting.discard(turn.id)
            if turn.id not in recorded or turn.id not in cleared or turn.id in withdrawn:
                bad_starts.append(turn.id)

        def ended(turn: Any, result: Any) -> None:
            waiting.discard(turn.id)
            outcomes[turn.id] = result

        sup.set_dispatch_gate(gate)
        sup.add_hooks(
            on_accept=accepted,
            on_start=started,
            on_result=ended,
        )
        handles = []
        with anyio.fail_after(60):  # (inside pytest-timeout's 120 s: a hang fails here, cleanly)
            for i in range(600):
                agent = "examples.agents:crasher" if i % 97 == 96 else "examples.agents:echo"
                handle = await sup.submit(agent, {"i": i}, turn_id=f"t{i}")
                handles.append(handle)
                if i % 5 == 4 and not _doomed(i):  # (a withdrawn id is forgotten: no cancel by id)
                    await handle.cancel()
                if i % 7 == 6 and i >= 14 and not _doomed(i - 7):
                    await handles[i - 7].cancel()
                if i % 10 == 9 and i >= 19:
                    # One batch of ten in flight: the pool is never far behind, so most turns reach a
                    # gate with room and are cleared before their record comes.
                    for j in range(i - 19, i - 9):
                        if not _doomed(j):
                            await handles[j].result()
            for i, h in enumerate(handles):
                if not _doomed(i):  # (a withdrawn turn's result came to the hook only)
                    await h.result()
    results = [outcomes[f"t{i}"] for i in range(600)]
    assert bad_starts == [], f"started before recorded and cleared, or withdrawn: {bad_starts[:10]}"
    for i, result in enumerate(results):
        if _doomed(i):
            assert result.outcome == "failed" and not result.started, (i, result)
            assert result.error is not None and result.error.type == "JournalUnavailable"
        elif i % 97 == 96:
            assert result.outcome in ("crashed", "aborted", "failed"), (i, result)
        elif i % 5 == 4:  # cancelled right after its accept: never started
            assert result.outcome == "aborted" and not result.started, (i, result)
        elif result.cause is not None:  # cancelled a while later: maybe running, maybe done by then
            assert result.outcome in ("aborted", "completed"), (i, result)
        else:
            assert result.outcome == "completed" and result.output == {"i": i}, (i, result)
    assert withdrawn == {f"t{i}" for i in range(600) if _doomed(i)}
    assert sum(r.outcome == "completed" for r in results) > 300
    assert early > 50, f"only {early} turns cleared before their record: the case was not exercised"
    assert worst <= bound, f"{worst} turns cleared and waiting, more than {bound}"


async def _gate_still_clears(client: Client, log: Path, n: int = 8) -> None:
    """Turns of 5 ms (longer than the prefetch window: depth 1, so the gate's window is the two
    workers alone) one after another: each must be cleared, so a count of cleared turns that
    drifted up by two or more would hang here."""
    with anyio.fail_after(60):
        for _ in range(n):
            result = await client.run(AGENT, {"log": str(log), "ms": 5})
            assert result.outcome == "completed", result


async def test_a_full_disk_fails_the_batch_holding_a_turns_accept_and_dispatched_rows() -> None:
    """JOURNAL-UNAVAILABLE with JOURNAL-GATE-SHARE: the journal's tmpfs is full; six submits arrive in one
    frame while both workers are idle, so the first turns are cleared at once and their "dispatched" rows go
    in the batch of their accept rows. The batch fails: every submit gets ``JournalUnavailable``, none of
    those turns runs, and none leaves a row in the journal; the "dispatched" rows kept and retried until the
    disk is back change nothing. Once space is freed the gate still clears (its window is two turns here: had
    the withdrawn turns stayed counted as cleared, no turn would start again), and a refused id submitted
    again runs once, as a new turn."""
    with tmpfs("3m") as where:
        journal, log = where / "journal.sqlite3", where / "runs.log"
        home = short_dir()
        served = start(*FAST, "--journal", str(journal), home=home)
        refused = [f"refused{i}" for i in range(6)]
        errors: dict[str, Exception] = {}
        try:
            async with Client.connect(served.endpoint, request_timeout=60) as client:
                await _gate_still_clears(client, log, 3)
                filler = fill(where)
                pad = "x" * 100_000  # the WAL must grow: a reused WAL page would take a small row

                async def submit(tid: str) -> None:
                    try:
                        await client.submit(AGENT, {"log": str(log), "pad": pad}, turn_id=tid)
                    except JournalUnavailable as exc:
                        errors[tid] = exc

                with anyio.fail_after(60):
                    async with anyio.create_task_group() as tg:
                        for tid in refused:
                            tg.start_soon(submit, tid)  # one pass: one frame, one batch
                assert set(errors) == set(refused)
                filler.unlink()
                await wait_status(served, lambda s: s["daemon"]["accepting"])
                await _gate_still_clears(client, log)
                with anyio.fail_after(60):
                    again = await client.run(AGENT, {"log": str(log)}, turn_id="refused0")
                assert again.outcome == "completed" and again.attempts == 1
                await wait_status(served, lambda s: s["queue"] == 0)
        finally:
            stop_process(served.proc)
            shutil.rmtree(home, ignore_errors=True)
        counted = runs(log)
        assert counted["refused0"] == 1
        assert not any(counted[t] for t in refused[1:]), counted
        rows = {r["turn_id"]: r for r in read_history(journal, limit=1000)}
        assert not set(rows) & set(refused[1:]), "a refused turn left a row"
        assert rows["refused0"]["state"] == "ended" and rows["refused0"]["outcome"] == "completed"


async def test_an_id_already_in_the_journal_with_its_dispatched_row_in_the_same_batch() -> None:
    """JOURNAL-LOOKUP with JOURNAL-GATE-SHARE: a submit under an id whose row is already in the journal, the
    daemon's lookup missing it (the race JOURNAL-LOOKUP's insert-time check is for: here the lookup is made to
    miss). Its turn is cleared at once, so its "dispatched" row shares the batch of its conflicting accept
    row: the submit is refused (``ValueError``), the turn never runs, the existing row is not made
    "dispatched" (after a crash that would end it a second time) and keeps its own result (schema 1 overwrote
    it with the refused turn's end), and the gate, whose window is the two workers alone (``prefetch=1``),
    still clears turn after turn."""
    home = short_dir()
    log = home / "runs.log"
    try:
        async with (
            _in_process(home, keep_results=1, prefetch=1) as (daemon, journal, endpoint),
            Client.connect(endpoint) as client,
        ):
            with anyio.fail_after(60):
                first = await client.run(AGENT, {"log": str(log), "ms": 0}, turn_id="dup")
                assert first.outcome == "completed"
                for _ in range(3):  # ``dup`` leaves the supervisor's table (keep_results=1)
                    await client.run(AGENT, {"log": str(log), "ms": 0})
            await _quiet(journal)
            assert daemon.sup is not None and daemon.sup.find("dup") is None
            daemon.lookup = lambda turn_id: None
            for _ in range(3):
                with anyio.fail_after(60), pytest.raises(ValueError, match="already in the journal"):
                    await client.run(AGENT, {"log": str(log), "ms": 0, "v": 2}, turn_id="dup")
            await _gate_still_clears(client, log)
            await _quiet(journal)
            rows = [r for r in read_history(home / "j.sqlite3", limit=1000) if r["turn_id"] == "dup"]
            recorded = read_result(home / "j.sqlite3", "dup")
        counted = runs(log)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert counted["dup"] == 1
    assert [(r["state"], r["outcome"]) for r in rows] == [("ended", "completed")]
    # JOURNAL-APPEND: the refused turns' ends ("failed") wrote nothing, least of all onto this turn's record.
    assert recorded == first


def _ended(journal: Path) -> set[str]:
    return {r["turn_id"] for r in read_history(journal, limit=1000) if r["state"] == "ended"}


async def _all_ended(journal: Path, ids: list[str]) -> None:
    """Wait (bounded) until the journal file has every one of ``ids`` ``ended``: a result leaves
    once its row is handed to the writer, not once committed (as ``_in_journal`` there)."""
    with anyio.fail_after(30):
        while not set(ids) <= _ended(journal):  # noqa: ASYNC110 — a file, not an event
            await anyio.sleep(0.02)  # allowed: polling the journal file for the end rows, bounded


async def test_a_cancel_between_clearance_and_commit_ends_the_turn_aborted_for_good() -> None:
    """A cancel right behind each submit, in the same frame (CLIENT-BATCHES keeps their order): the turn is
    accepted and cleared at once (JOURNAL-GATE-SHARE), then cancelled before its batch — accept,
    "dispatched" and "ended" rows — is even sent. Forty such pairs: every turn ends ``aborted``
    unstarted and never runs; the gate still clears (each cancel must give its place back); the
    journal says ``ended``/``aborted`` for each, and after a SIGKILL and a restart they are still
    aborted, neither run again nor ended ``crashed``."""
    home = short_dir()
    keep = short_dir()
    journal, log = keep / "j.sqlite3", keep / "runs.log"
    ids = [f"c{i}" for i in range(40)]
    try:
        served = start(*FAST, "--journal", str(journal), home=home)
        try:
            async with Client.connect(served.endpoint, request_timeout=60) as client:
                causes: dict[str, Any] = {}

                async def submit(tid: str) -> None:
                    await client.submit(AGENT, {"log": str(log), "ms": 5}, turn_id=tid)

                async def cancel(tid: str) -> None:
                    causes[tid] = await client.cancel(tid)

                with anyio.fail_after(60):
                    async with anyio.create_task_group() as tg:
                        for tid in ids:
                            tg.start_soon(submit, tid)
                            tg.start_soon(cancel, tid)  # same pass: same frame, right behind it
                    results = await client.results([client.handle(t) for t in ids])
                assert [r.outcome for r in results] == ["aborted"] * len(ids), results
                assert not any(r.started for r in results)
                await _gate_still_clears(client, log)
                await wait_status(served, lambda s: s["queue"] == 0)
                await _all_ended(journal, ids)
            served.proc.send_signal(signal.SIGKILL)
            served.proc.wait(timeout=60)
        finally:
            stop_process(served.proc)
        rows = {r["turn_id"]: r for r in read_history(journal, limit=1000)}
        assert all(rows[t]["state"] == "ended" and rows[t]["outcome"] == "aborted" for t in ids), rows
        served = start(*FAST, "--journal", str(journal), home=home)
        try:
            async with Client.connect(served.endpoint, request_timeout=60) as client:
                with anyio.fail_after(60):
                    again = await client.results([client.handle(t) for t in ids])
        finally:
            stop_process(served.proc)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        counted = runs(log)
        shutil.rmtree(keep, ignore_errors=True)
    assert [r.outcome for r in again] == ["aborted"] * len(ids)
    assert not any(counted[t] for t in ids), counted
