"""A turn a worker ran is never run again because a later turn killed that worker (rule WORKER-END-LOG).

SPEC: after any crash an acknowledged turn runs at most once (unless submitted with
``retry=True``) and ends exactly once. With prefetch a worker runs quick handed turns back to
back and their ``End`` frames leave later, in a batch; a turn that kills its worker at once
(``os._exit``) used to take that batch along, and the supervisor re-queued the turns that had
already run (48-128 of 600 ran twice in the reproduction). Each agent here notes its own
execution first, so every run is counted, whatever the pool believes.
"""

from __future__ import annotations

import collections
import os
import random
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import Supervisor
from worker import lowlevel

pytestmark = pytest.mark.anyio

AGENT = "tests.agents.exactly_once:counted"
EAGER = {"prefetch_window": 3600.0}  # hand quick turns ahead as deep as prefetch allows


async def _run_mix(
    tmp_path: Path, n: int, crash_share: float, pad: int, bound: float, **options: Any
) -> None:
    """Run ``n`` turns (quick ones, and ones that kill their worker) from 4 submitters on 2
    prefetching workers; check every execution and every result."""
    log = tmp_path / "runs"
    rng = random.Random(7)
    kinds = ["crash" if rng.random() < crash_share else "quick" for _ in range(n)]
    deliveries: collections.Counter[str] = collections.Counter()
    results: dict[str, Any] = {}
    async with Supervisor(workers=2, spares=1, worker_output=None, **EAGER, **options) as sup:
        sup.add_hooks(on_result=lambda turn, result: deliveries.update([turn.id]))
        with anyio.fail_after(30):  # one quick turn: the mean turn time drops, prefetch deepens
            assert (await sup.run("examples.agents:echo", 0)).outcome == "completed"

        async def submitter(first: int) -> None:
            for i in range(first, n, 4):
                inp = {"kind": kinds[i], "log": str(log), "pad": pad}
                handle = await sup.submit(AGENT, inp, turn_id=f"t{i}")
                results[handle.turn_id] = await handle.result()

        with anyio.fail_after(bound):
            async with anyio.create_task_group() as tg:
                for first in range(4):
                    tg.start_soon(submitter, first)
        crashes = sup.worker_restarts
    runs = collections.Counter(log.read_text().split())
    twice = {t: c for t, c in runs.items() if c > 1}
    assert not twice, f"{len(twice)} turns ran more than once: {sorted(twice.items())[:10]}"
    assert len(results) == n
    assert {t: c for t, c in deliveries.items() if t.startswith("t") and c != 1} == {}, "a turn ended twice"
    wrong = []
    for i, kind in enumerate(kinds):
        r = results[f"t{i}"]
        if kind == "crash":
            ok = (r.outcome, r.started, r.exit_code) == ("crashed", True, 3) and runs[r.turn_id] == 1
        else:
            # A quick turn that ran before a crash keeps its own outcome and output.
            expected = {"ran": r.turn_id, "pad": "x" * pad}
            ok = (r.outcome, r.started, r.output) == ("completed", True, expected) and runs[r.turn_id] == 1
        if not ok:
            wrong.append((kind, r.turn_id, r.outcome, r.started, r.exit_code, runs[r.turn_id]))
    assert not wrong, f"{len(wrong)} wrong results, e.g. {wrong[:5]}"
    assert crashes >= kinds.count("crash") // 2  # the crashes really took workers down


async def test_quick_turns_before_a_crash_run_once_and_keep_their_outcome(tmp_path: Path) -> None:
    """400 turns, a fifth of them killing their worker at once, from 4 concurrent submitters on 2
    prefetching workers: every turn runs at most once (counted by the agent) and ends exactly
    once; quick turns that ran in the burst before a crash end ``completed`` with their own
    output (their ends come from the End log), the crashing turns ``crashed``, started."""
    await _run_mix(tmp_path, 400, 0.2, 0, bound=60)


async def test_turns_passed_before_a_marked_crash_run_once(tmp_path: Path) -> None:
    """The same mix while the supervisor reads every busy worker's start marker each millisecond
    (the memory check does, LADDER-EARLY; so do a cancel or a deadline of a handed turn). A read that falls
    between a crashing turn's start and its worker's death finds the crashing turn marked, with
    the quick turns before it passed (run, their frames unsent): when the worker then dies, their
    ends come from the End log. They used to be re-queued and run a second time."""
    await _run_mix(tmp_path, 400, 0.2, 0, bound=60, max_rss_mb=1 << 20, rss_interval=0.001)


async def test_ends_too_big_for_the_log_still_run_once(tmp_path: Path) -> None:
    """Outputs of 300 kB: the worker's 1 MiB End log takes three, then an End that does not fit
    asks for an EndAck (the log is emptied when it comes) before the next turn may start.
    Mixed with crashes, every turn still runs once and keeps its outcome and output."""
    await _run_mix(tmp_path, 80, 0.25, 300_000, bound=60)


def test_end_log_shows_only_whole_records_of_its_own_worker() -> None:
    """The supervisor reads a log only if the pid in it is the dead worker's; it sees records
    only up to the committed length (a record written but not committed is not there), and
    nothing after ``clear()``. The log is a memory file without a name (SEC-WORKER-FILES): the writer maps
    the descriptor it is handed and closes it; the reader keeps a read-only mapping."""
    import wire
    from wire import worker_link

    fd = lowlevel.own_file("w1-ends", lowlevel.ENDLOG_SIZE)
    view = lowlevel.own_file_view(fd, lowlevel.ENDLOG_SIZE)
    endlog = lowlevel.EndLog(os.dup(fd))
    log = view.buf
    a = worker_link.End("a", "completed", wire.encode_payload({"x": 1}))
    b = worker_link.End("b", "failed", error=wire.TurnError(type="E", message="m"))
    assert endlog.append(wire.encode(a), 1.5) and endlog.append(wire.encode(b), 2.5)
    assert lowlevel.endlog_read(log, os.getpid()) == [(1.5, a), (2.5, b)]
    assert lowlevel.endlog_read(log, os.getpid() + 1) == []  # another worker's (or generation's) log
    # A record written without its commit (a death between the two) is invisible.
    used = endlog._used
    at = lowlevel.ENDLOG_HEAD + used
    endlog._map[at : at + lowlevel.ENDLOG_REC] = (5).to_bytes(4, "little") + bytes(8)
    assert [e.turn_id for _, e in lowlevel.endlog_read(log, os.getpid())] == ["a", "b"]
    assert not endlog.append(b"x" * lowlevel.ENDLOG_SIZE, 3.0)  # does not fit: nothing written
    endlog.clear()
    assert lowlevel.endlog_read(log, os.getpid()) == []
    view.close()
    os.close(fd)
    # A new worker's log starts empty.
    fd = lowlevel.own_file("w2-ends", lowlevel.ENDLOG_SIZE)
    view = lowlevel.own_file_view(fd, lowlevel.ENDLOG_SIZE)
    assert lowlevel.EndLog(fd) and lowlevel.endlog_read(view.buf, os.getpid()) == []
    view.close()
