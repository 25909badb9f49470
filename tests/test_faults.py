"""The fault matrix: every way a real agent (or its worker) goes wrong, one row each.

For every row: the turn gets exactly one outcome and it is the right one (with the right exit
code and cause), the pool keeps serving (a following echo turn completes), and no process of
the turn's worker tree remains (psutil on every pid recorded, plus the autouse fixture).
A second table covers workers that cannot start: the supervisor backs off and reports the
reason instead of spinning.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from supervisor import Supervisor, WorkerStartError
from supervisor import lowlevel as sup_lowlevel
from tests.support.events import first_event as _first_event

pytestmark = pytest.mark.anyio

GRACE, KILL_AFTER = 0.2, 0.3
SIGTERM_OR_KILL = frozenset({-signal.SIGTERM, -signal.SIGKILL})


@dataclass(frozen=True)
class Fault:
    agent: str
    input: Any = None
    outcome: str = "completed"
    # None; "cancel" (user cancel); "kill" (SIGKILL of the worker from outside); "usr1" (tells the
    # agent to crash, once the supervisor has seen the turn start)
    trigger: str | None = None
    exit_codes: frozenset[int | None] = frozenset({None})
    cause: str | None = None
    error_type: str | None = None
    output: Any = None
    options: dict[str, Any] = field(default_factory=dict)
    # The turn costs its worker (a new pid serves the next turn). None: when it crashed or was killed.
    replaced: bool | None = None


FAULTS: dict[str, Fault] = {
    "returns": Fault("examples.agents:echo", {"x": 1}, "completed", output={"x": 1}),
    "raises": Fault("examples.agents:failing", {"message": "boom"}, "failed", error_type="ValueError"),
    "os_exit": Fault(
        "tests.agents.faults:crash_when_told",
        {"how": "exit", "code": 7},
        "crashed",
        trigger="usr1",
        exit_codes=frozenset({7}),
    ),
    "sigsegv": Fault(
        "tests.agents.faults:crash_when_told",
        {"how": "segv"},
        "crashed",
        trigger="usr1",
        exit_codes=frozenset({-signal.SIGSEGV}),
    ),
    "sigkill_from_outside": Fault(
        "examples.agents:slow",
        {"seconds": 60},
        "crashed",
        trigger="kill",
        exit_codes=frozenset({-signal.SIGKILL}),
    ),
    "memory_limit": Fault(
        "tests.agents.faults:stubborn_hog",
        {"mb": 300},
        "killed",
        exit_codes=SIGTERM_OR_KILL,
        cause="memory",
        options={"max_rss_mb": 150, "rss_interval": 0.05},
    ),
    "gil_holding_c_call": Fault(
        "tests.agents.faults:gil_holder",
        None,
        "killed",
        trigger="cancel",
        exit_codes=frozenset({-signal.SIGKILL}),
        cause="user",
    ),
    "ignores_sigterm": Fault(
        "examples.agents:sigterm_ignorer",
        None,
        "killed",
        trigger="cancel",
        exit_codes=frozenset({-signal.SIGKILL}),
        cause="user",
    ),
    "blocks_sigterm": Fault(
        "examples.agents:sigterm_blocker",
        None,
        "killed",
        trigger="cancel",
        exit_codes=SIGTERM_OR_KILL,
        cause="user",
    ),
    "grandchildren": Fault(
        "tests.agents.faults:forker_only_children",
        {"children": 3},
        "killed",
        trigger="cancel",
        exit_codes=SIGTERM_OR_KILL,
        cause="user",
    ),
    "setsid_daemon": Fault(
        "examples.agents:forker",
        {"children": 0, "ignore_sigterm": True},
        "killed",
        trigger="cancel",
        exit_codes=frozenset({-signal.SIGKILL}),
        cause="user",
    ),
    # The agent returns after closing the socket: the worker logged its End before it died of the
    # lost link, so the turn ends with its own outcome (rule WORKER-END-LOG); the worker is replaced.
    "closes_its_zmq_socket": Fault(
        "tests.agents.faults:socket_closer", None, "completed", output="closed", replaced=True
    ),
    "garbage_on_stdout_stderr": Fault(
        "tests.agents.faults:garbage_writer", None, "completed", output="wrote"
    ),
}


def _tree_of(pid: int) -> set[int]:
    try:
        return {pid} | {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


@pytest.mark.parametrize("name", list(FAULTS))
async def test_fault_matrix(name: str) -> None:
    """One row per fault: exactly one outcome, the right one; the pool keeps serving; nothing remains."""
    fault = FAULTS[name]
    ended: list[str] = []
    opts = {"grace": GRACE, "kill_after": KILL_AFTER, **fault.options}
    async with Supervisor(workers=1, spares=0, **opts) as sup:
        sup.add_hooks(on_result=lambda turn, result: ended.append(turn.id))
        first_pid = (await sup.status())["workers"][0]["pid"]
        recorded = _tree_of(first_pid)  # the worker and its guardian
        handle = await sup.submit(fault.agent, fault.input)
        t_cancel = None
        if fault.trigger or fault.outcome in ("crashed", "killed"):
            event = await _first_event(handle)
            recorded |= _tree_of(event.get("pid", first_pid)) | set(event.get("children", ()))
            if "daemon" in event:
                recorded.add(event["daemon"])
            if fault.trigger == "cancel":
                t_cancel = time.monotonic()
                assert await handle.cancel() == {"kind": "user"}
            elif fault.trigger == "kill":
                os.kill(event["pid"], signal.SIGKILL)
            elif fault.trigger == "usr1":
                os.kill(event["pid"], signal.SIGUSR1)
        with anyio.fail_after(60):
            result = await handle.result()
        elapsed = time.monotonic() - t_cancel if t_cancel is not None else None
        with anyio.fail_after(60):
            after = await sup.run("examples.agents:echo", "next")
        status = await sup.status()
        held = sup.input_bytes  # MEM-INPUTS: every ended turn gave its input back, whatever its end

    assert held == 0, held
    assert result.outcome == fault.outcome, result
    assert result.exit_code in fault.exit_codes, result
    assert (result.cause.kind if result.cause else None) == fault.cause
    if fault.error_type:
        assert result.error is not None and result.error.type == fault.error_type
    if fault.outcome == "completed":
        assert result.output == fault.output
    assert result.started and result.worker_pid == first_pid
    if fault.outcome == "killed" and elapsed is not None:
        assert elapsed >= GRACE  # grace honoured before any signal
    # Exactly one outcome: one result delivered for the turn, counted once.
    assert ended.count(result.turn_id) == 1
    assert sum(status["outcomes"].values()) == 2
    # The pool keeps serving; a crash or kill costs exactly this one worker.
    assert after.outcome == "completed" and after.output == "next"
    replaced = fault.replaced if fault.replaced is not None else fault.outcome in ("crashed", "killed")
    if replaced:
        assert after.worker_pid != first_pid
        assert [p for p in recorded if psutil.pid_exists(p)] == []
    else:
        assert after.worker_pid == first_pid


# ---- workers that cannot start ---------------------------------------------------------


def _wrapper(tmp: Path, body: str) -> str:
    script = tmp / "python-wrapper"
    script.write_text(f'#!/bin/sh\n{body}\nexec {sys.executable} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def _shadow(tmp: Path) -> Path:
    """A directory whose ``msgspec`` module fails to import: an import error in the worker itself."""
    shadow = tmp / "shadow"
    shadow.mkdir()
    (shadow / "msgspec.py").write_text("raise ImportError('shadowed msgspec: a broken install')\n")
    return shadow


class _CountSpawns:
    """Counts worker spawn attempts (wraps ``supervisor.lowlevel.procs.spawn_worker``); sets
    ``reached`` at ``n``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, n: int = 1_000_000) -> None:
        self.times: list[float] = []
        self.n = n
        self.reached = anyio.Event()
        real = sup_lowlevel.procs.spawn_worker

        def spawn(**kwargs: Any) -> int:
            self.times.append(time.monotonic())
            if len(self.times) >= self.n:
                self.reached.set()
            return real(**kwargs)

        monkeypatch.setattr(sup_lowlevel.procs, "spawn_worker", spawn)


@pytest.mark.parametrize("kind", ["bad_interpreter_flag", "import_error_in_worker"])
async def test_worker_start_failure_is_reported_not_spun(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that cannot start (bad interpreter flag; its own import fails): ``start()`` raises
    ``WorkerStartError`` naming the reason after a few backed-off attempts, and
    ``status()["last_start_error"]`` says why."""
    spawns = _CountSpawns(monkeypatch)
    if kind == "bad_interpreter_flag":
        sup = Supervisor(workers=1, spares=0, worker_args=("--no-such-flag",))
    else:
        shadow = _shadow(tmp_path)
        sup = Supervisor(
            workers=1, spares=0, python=_wrapper(tmp_path, f'export PYTHONPATH="{shadow}:$PYTHONPATH"')
        )
    t0 = time.monotonic()
    with anyio.fail_after(30), pytest.raises(WorkerStartError, match="before it was ready"):
        await sup.start()
    elapsed = time.monotonic() - t0
    status = await sup.status()
    assert "exited with" in (status["last_start_error"] or "")
    # Backed off: a handful of attempts (0.1 s, 0.2 s, ... apart), not a spin.
    assert 3 <= len(spawns.times) <= 6, spawns.times
    gaps = [b - a for a, b in zip(spawns.times, spawns.times[1:], strict=False)]
    assert all(g >= 0.09 for g in gaps), gaps
    assert elapsed >= 0.1 + 0.2


async def test_start_failures_after_start_back_off_and_recover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replacements that fail to start (after the pool was up) are retried with growing delays and
    reported in ``status()``; a turn submitted meanwhile waits in the queue (not lost, not failed)
    and runs once workers start again."""
    flag = tmp_path / "broken"
    python = _wrapper(tmp_path, f'[ -e "{flag}" ] && exec {sys.executable} --no-such-flag "$@"')
    async with Supervisor(workers=1, spares=0, python=python) as sup:
        flag.touch()
        spawns = _CountSpawns(monkeypatch, n=4)
        # The worker is lost while a turn is known to run (its event arrived), so the loss is
        # certain to be seen as a crash of that turn, not as a hand-over that never started.
        running = await sup.submit("examples.agents:slow", {"seconds": 60})
        info = await _first_event(running)
        os.kill(info["pid"], signal.SIGKILL)
        with anyio.fail_after(30):
            crashed = await running.result()
        assert crashed.outcome == "crashed" and crashed.exit_code == -signal.SIGKILL
        waiting = await sup.submit("examples.agents:echo", "waited")
        with anyio.fail_after(30):
            await spawns.reached.wait()
        span = spawns.times[3] - spawns.times[0]
        assert span >= 0.2 + 0.4 - 0.05, spawns.times  # exponential back-off, not a spin
        status = await sup.status()
        assert "before it was ready" in (status["last_start_error"] or "")
        assert status["queue"] == 1 and status["running"] == 0
        flag.unlink()
        with anyio.fail_after(30):
            result = await waiting.result()
    assert result.outcome == "completed" and result.output == "waited"


async def test_turn_that_kills_its_worker_at_once_runs_once() -> None:
    """An agent that kills its worker before its ``Started`` frame can leave the process: the
    worker's start marker (a shared file written before agent code runs) tells the supervisor the
    turn did start, so it ends ``crashed`` at once — it is never handed to another worker (it
    would run twice), and only one worker is lost. (Were the marker lost too, the turn would be
    re-queued at most ``MAX_HANDOVERS`` times, then end ``crashed``.)"""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(60):
            result = await sup.run("tests.agents.faults:exit_at_once")
            after = await sup.run("examples.agents:echo", "next")
        restarts = (await sup.status())["worker_restarts"]
    assert result.outcome == "crashed" and result.exit_code == 9 and result.started is True
    assert result.attempts == 1 and restarts == 1
    assert sup_lowlevel.MAX_HANDOVERS >= 2
    assert after.outcome == "completed"


async def test_a_turn_that_crashed_its_worker_is_never_run_again(tmp_path: Path) -> None:
    """Turns handed ahead in bursts whose agent emits and kills its worker at once: each ends
    ``crashed`` (started), none is silently run a second time on another worker."""
    async with Supervisor(workers=2, spares=1) as sup:
        handles = [
            await sup.submit("tests.agents.faults:exit_first_run_only", str(tmp_path / f"m{i}"))
            for i in range(12)
        ]
        with anyio.fail_after(120):
            results = [await h.result() for h in handles]
    assert {(r.outcome, r.started, r.output) for r in results} == {("crashed", True, None)}


async def test_an_end_after_a_failed_send_keeps_the_real_outcome() -> None:
    """A worker whose link failed a send is doomed (killed, no new turns), but an ``End`` it sent
    before dying still settles its turn with the real outcome, not ``crashed``."""
    async with Supervisor(workers=1, spares=0, grace=20) as sup:
        handle = await sup.submit("tests.agents:wait_signal")
        info = await _first_event(handle)
        slot = next(s for s in sup.pool.slots.values() if s.turn is not None)
        slot.doomed = True  # what a failed send does (before it SIGKILLs the worker)
        await handle.cancel({"kind": "deadline"})
        with anyio.fail_after(30):
            result = await handle.result()
        assert result.outcome == "completed" and result.output == {"saw": "deadline"}
        assert (await sup.status())["workers"][0]["state"] == "busy"  # no new turn for a doomed worker
        os.kill(info["pid"], signal.SIGKILL)
        with anyio.fail_after(30):
            after = await sup.run("examples.agents:echo", "next")
    assert after.outcome == "completed" and after.worker_pid != info["pid"]
