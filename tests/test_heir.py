"""LADDER-HEIR (docs/design.md): at the kill decision a warm spare is handed the next queued turn, held
until the doomed worker's process is gone; the spare watches that process itself (a pidfd, the pid's
start time guarding against reuse) and starts the turn the moment it exits. These tests attack what
that could break: a spare starting while the doomed worker still runs (one agent more than
``workers``), a held turn that cannot be cancelled or ends twice, a held turn lost with a spare that
dies, a held turn stuck where the spare cannot watch, and a reused pid taken for the doomed worker."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import Supervisor
from tests.agents.heir import proc_state
from tests.support.events import first_event
from worker import lowlevel

pytestmark = pytest.mark.anyio

BOUND = 30


async def full(sup: Supervisor, count: int) -> None:
    """Wait until ``count`` workers are ready (the spare included)."""
    while sum(1 for w in (await sup.status())["workers"] if w["state"] in ("idle", "busy")) < count:  # noqa: ASYNC110
        await anyio.sleep(0.005)  # allowed: polling the pool's own status, bounded by fail_after


async def worker_pids(sup: Supervisor) -> set[int]:
    return {w["pid"] for w in (await sup.status())["workers"] if w["state"] in ("idle", "busy")}


async def held_by(sup: Supervisor, turn_id: str, doomed_pid: int) -> int:
    """Wait until ``turn_id`` is handed to a worker other than the doomed one (and not started);
    return that worker's pid. (Short turns before make the pool hand turns ahead: the turn may be
    handed to the doomed worker first, and come back at the kill decision, LADDER-HANDOVER.)"""
    while True:
        record = sup.record(turn_id)
        if record.state == "handed" and record.worker is not None and record.worker.pid != doomed_pid:
            return record.worker.pid
        assert record.state in ("queued", "handed"), record.state
        await anyio.sleep(0.002)  # allowed: polling the turn's own state, bounded by fail_after


def pidfds(pid: int) -> list[str]:
    """The pidfds process ``pid`` holds open (a held turn's watch is one)."""
    found = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") == "anon_inode:[pidfd]":
                found.append(name)
        except OSError:
            continue
    return found


async def held_behind_a_survivor(sup: Supervisor, agent: str) -> tuple[Any, int, Any, int]:
    """A turn of an agent that survives SIGTERM, then a turn of ``agent`` queued behind it (its
    input names the doomed worker), then a cancel of the first: returns (doomed handle, doomed
    worker's pid, next handle, pid of the spare that holds the next turn)."""
    doomed = await sup.submit("tests.agents.handover:survive_term")
    doomed_pid = (await first_event(doomed))["pid"]
    nxt = await sup.submit(agent, {"doomed": doomed_pid})
    await doomed.cancel()
    return doomed, doomed_pid, nxt, await held_by(sup, nxt.turn_id, doomed_pid)


async def test_the_spare_holds_the_next_turn_from_the_decision_and_starts_it_once_the_doomed_is_gone() -> (
    None
):
    """The doomed agent ignores SIGTERM, so its worker lives a whole ``kill_after`` (1 s) past the
    decision. The queued turn is handed to the spare at the decision (before: it stayed queued until
    the doomed worker's exit) and does not start while that worker runs: when it starts, the doomed
    process is a zombie or gone, after the SIGKILL step. It runs once, on the spare."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=1, grace=0.0, kill_after=1.0) as sup:
            await full(sup, 2)
            doomed = await sup.submit("tests.agents.handover:survive_term")
            doomed_pid = (await first_event(doomed))["pid"]
            (spare_pid,) = await worker_pids(sup) - {doomed_pid}
            nxt = await sup.submit("tests.agents.heir:note_doomed", {"doomed": doomed_pid})
            await doomed.cancel()
            assert await held_by(sup, nxt.turn_id, doomed_pid) == spare_pid
            assert proc_state(doomed_pid) not in ("Z", "gone")  # the case under test: it still runs
            assert sup.record(nxt.turn_id).started is False
            out = (await nxt.result()).output
            result = await doomed.result()
            record = sup.record(doomed.turn_id)
    assert result.outcome == "killed" and result.exit_code == -signal.SIGKILL, result
    assert out["pid"] == spare_pid
    assert out["doomed"] in ("Z", "gone"), out  # never beside the doomed agent
    assert record.escalated_at is not None and out["t"] >= record.escalated_at + 0.9


async def test_a_held_turn_cancelled_before_it_starts_ends_aborted_unstarted() -> None:
    """A turn held by the spare is still a queued turn (TURN-HANDED): cancelling it while the doomed worker
    survives its SIGTERM ends it ``aborted`` with ``started`` false at once, exactly once; the spare
    drops its watch (no pidfd left open) and takes the next turn when the doomed worker is gone."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=1, grace=0.0, kill_after=2.0) as sup:
            await full(sup, 2)
            doomed, doomed_pid, nxt, spare_pid = await held_behind_a_survivor(
                sup, "tests.agents.heir:note_doomed"
            )
            # The case under test: the spare watches the doomed worker (once it has read its Run).
            while not pidfds(spare_pid):  # noqa: ASYNC110
                await anyio.sleep(0.002)  # allowed: polling the spare's fds, bounded by fail_after
            assert await nxt.cancel() == {"kind": "user"}
            held = await nxt.result()
            assert sup.record(doomed.turn_id).state != "ended"  # before the doomed worker's end
            assert pidfds(spare_pid) == []
            after = await sup.submit("tests.agents.heir:note_doomed", {"doomed": doomed_pid})
            out = (await after.result()).output
            assert (await doomed.result()).outcome == "killed"
            assert (await nxt.result()) == held  # one end, the same every time
    assert held.outcome == "aborted" and held.started is False and held.cause == {"kind": "user"}, held
    assert out["pid"] == spare_pid and out["doomed"] in ("Z", "gone"), out


async def test_a_spare_that_dies_holding_a_turn_gives_it_back_unharmed() -> None:
    """The spare holding the next turn is SIGKILLed before the doomed worker is gone: the held turn
    goes back to the queue (it never started), then runs once on a worker started after, not
    before the doomed worker is gone; the doomed turn is ``killed``; nothing is left running."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=1, grace=0.0, kill_after=1.0) as sup:
            await full(sup, 2)
            doomed, doomed_pid, nxt, spare_pid = await held_behind_a_survivor(
                sup, "tests.agents.heir:note_doomed"
            )
            assert proc_state(doomed_pid) not in ("Z", "gone")  # held, not handed after the exit
            os.kill(spare_pid, signal.SIGKILL)
            result = await nxt.result()
            assert (await doomed.result()).outcome == "killed"
    assert result.outcome == "completed" and result.started, result
    out = result.output
    assert out["pid"] not in (spare_pid, doomed_pid)
    assert out["doomed"] in ("Z", "gone"), out


async def test_a_spare_that_cannot_watch_starts_its_held_turn_on_proceed() -> None:
    """Both workers are made unable to watch another process (as where no pidfd can be opened):
    the spare still holds the turn from the decision, and starts it on the supervisor's
    ``Proceed``, sent after the doomed worker's exit - not before it, and not never."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=1, grace=0.0, kill_after=0.5) as sup:
            await full(sup, 2)
            pids = await worker_pids(sup)
            blinded: set[int] = set()
            while blinded != pids:  # idle workers take turns in rotation: both get one
                blinded.add((await sup.run("tests.agents.heir:blind")).output)
                assert blinded <= pids
            doomed, doomed_pid, nxt, spare_pid = await held_behind_a_survivor(
                sup, "tests.agents.heir:note_doomed"
            )
            assert proc_state(doomed_pid) not in ("Z", "gone")  # held, not handed after the exit
            assert pidfds(spare_pid) == []  # (blind: it waits for the supervisor's word)
            out = (await nxt.result()).output
            assert (await doomed.result()).outcome == "killed"
            record = sup.record(doomed.turn_id)
    assert out["pid"] == spare_pid and out["doomed"] in ("Z", "gone"), out
    assert record.exited_at is not None and out["t"] >= record.exited_at


async def test_a_held_turn_imports_its_agent_only_once_the_doomed_worker_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spare may look a held turn's agent up while it waits only when that runs none of the
    agent's code; an agent module not imported yet is imported when the turn starts, after the
    doomed worker (which survives its SIGTERM for ``kill_after``) is gone: an import is agent code."""
    note = tmp_path / "imported"
    monkeypatch.setenv("TURNPOOL_TEST_IMPORT_NOTE", str(note))  # read by the workers' agent module
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=1, grace=0.0, kill_after=1.0) as sup:
            await full(sup, 2)
            doomed, doomed_pid, nxt, spare_pid = await held_behind_a_survivor(
                sup, "tests.agents.heir_late:agent"
            )
            assert proc_state(doomed_pid) not in ("Z", "gone")  # held while the doomed worker runs
            assert (await nxt.result()).output == spare_pid
            assert (await doomed.result()).outcome == "killed"
            record = sup.record(doomed.turn_id)
    # ADAPT-PROBE imported the module once in a probe at the first submit (its own pid, not a worker's);
    # the workers imported it once, in the spare, after the doomed worker was gone.
    (line,) = [
        line for line in note.read_text().splitlines() if int(line.split()[0]) in (doomed_pid, spare_pid)
    ]
    pid, at = line.split()
    assert int(pid) == spare_pid
    assert record.escalated_at is not None
    assert float(at) >= record.escalated_at + 0.9, (at, record.escalated_at)


def test_the_watch_names_one_process_and_a_reused_pid_is_not_it() -> None:
    """``heir_watch(pid, start)``: a pidfd for the live process ``pid`` started at ``start``; the
    same pid with another start time (a pid reused by a later process) is ``HEIR_GONE``, as is a
    reaped process; a zombie's pidfd is readable at once. Real processes."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    assert child.stdin is not None
    try:
        start = lowlevel.start_ticks(child.pid)
        assert start is not None
        assert lowlevel.heir_watch(child.pid, start + 1) == lowlevel.HEIR_GONE
        fd = lowlevel.heir_watch(child.pid, start)
        assert fd >= 0
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(0) == []  # it runs
        child.stdin.close()
        assert poller.poll(BOUND * 1000)  # exited: readable (a zombie until reaped)
        os.close(fd)
        zombie = lowlevel.heir_watch(child.pid, start)
        assert zombie >= 0
        poller = select.poll()
        poller.register(zombie, select.POLLIN)
        assert poller.poll(0)
        os.close(zombie)
    finally:
        child.kill()
        child.wait()
    assert lowlevel.heir_watch(child.pid, start) == lowlevel.HEIR_GONE
