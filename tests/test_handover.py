"""LADDER-HANDOVER (docs/design.md): the turns handed ahead to a doomed worker come back at the kill
decision (the SIGTERM step), and a warm spare takes the doomed worker's slot the moment that worker
process has exited, while its tree is reaped - not at the ``killed`` result. These tests attack
what that could break: the queued turn runs exactly once, on the spare, never on the doomed worker;
an agent that survives SIGTERM keeps its slot (the pool never runs more than ``workers`` agents);
the doomed turn still ends ``killed`` whatever its worker says after the decision (TURN-ONE-OUTCOME)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from supervisor import Supervisor
from tests.support.events import first_event

pytestmark = pytest.mark.anyio

BOUND = 30


def starts(path: Path) -> list[tuple[str, int, float]]:
    """The ``note_start`` lines: (turn id, pid, monotonic start)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        turn_id, pid, at = line.split()
        out.append((turn_id, int(pid), float(at)))
    return out


async def wait_for_start(path: Path, turn_id: str) -> None:
    while not any(t == turn_id for t, _, _ in starts(path)):  # noqa: ASYNC110
        await anyio.sleep(0.005)  # allowed: waiting for the agent's own note, bounded by fail_after


async def full(sup: Supervisor, count: int) -> None:
    """Wait until ``count`` workers are ready: ``Supervisor`` start waits for ``workers`` only, and
    a spare still starting under load would make the pool look short for the wrong reason."""
    while sum(1 for w in (await sup.status())["workers"] if w["state"] in ("idle", "busy")) < count:  # noqa: ASYNC110
        await anyio.sleep(0.005)  # allowed: polling the pool's own status, bounded by fail_after


async def test_an_agent_that_survives_sigterm_keeps_its_slot_until_its_worker_is_gone(
    tmp_path: Path,
) -> None:
    """The doomed turn's agent ignores SIGTERM, so its worker lives until the SIGKILL step a second
    later: the queued turn behind it waits for that worker's exit (no second agent runs beside a
    stubborn one), then runs once, on the spare - not on the doomed worker."""
    path = tmp_path / "starts"
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=1, grace=0.0, kill_after=1.0) as sup:
            await full(sup, 2)
            doomed = await sup.submit("tests.agents.handover:survive_term")
            doomed_pid = (await first_event(doomed))["pid"]
            nxt = await sup.submit("tests.agents.handover:note_start", {"path": str(path)})
            await doomed.cancel()
            out = (await nxt.result()).output
            result = await doomed.result()
            record = sup.record(doomed.turn_id)
    assert result.outcome == "killed" and result.exit_code == -signal.SIGKILL, result
    assert out["pid"] != doomed_pid
    assert record.escalated_at is not None and record.ended_at is not None
    # The SIGKILL step is ``kill_after`` (1 s) after the decision; the next turn starts after it.
    assert out["t"] >= record.escalated_at + 0.9, (record.escalated_at, out, record.ended_at)
    assert [(t, p) for t, p, _ in starts(path)] == [(nxt.turn_id, out["pid"])]


async def test_the_spare_takes_the_slot_when_the_doomed_worker_exits(tmp_path: Path) -> None:
    """A doomed forker whose worker ends on SIGTERM (its own handler kills its tree): the queued
    turn runs once, on the spare that was already up (not on a replacement started after the
    kill), and the doomed turn is ``killed`` with every process of its tree gone."""
    path = tmp_path / "starts"
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=1, grace=0.0, kill_after=5.0) as sup:
            await full(sup, 2)
            before = {w["pid"] for w in (await sup.status())["workers"]}
            doomed = await sup.submit("examples.agents:forker", {"children": 2})
            info = await first_event(doomed)
            nxt = await sup.submit("tests.agents.handover:note_start", {"path": str(path)})
            await doomed.cancel()
            out = (await nxt.result()).output
            result = await doomed.result()
            left = [p for p in [*info["children"], info["daemon"], info["worker"]] if _alive(p)]
    assert result.outcome == "killed" and result.exit_code == -signal.SIGTERM, result
    assert left == []  # TURN-QUIESCENCE: the doomed tree is reaped before its result, handover or not
    assert out["pid"] in before and out["pid"] != info["worker"]
    assert [(t, p) for t, p, _ in starts(path)] == [(nxt.turn_id, out["pid"])]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_capacity_stays_at_workers_while_a_doomed_worker_dies(tmp_path: Path) -> None:
    """One slot: a doomed agent that survives SIGTERM holds it until its worker is gone; then the
    spare takes the second turn, and the third waits for a worker started after the ``killed``
    result (the pool never runs more than ``workers`` agents)."""
    path, hold = tmp_path / "starts", tmp_path / "go"
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=1, grace=0.0, kill_after=1.0) as sup:
            await full(sup, 2)
            doomed = await sup.submit("tests.agents.handover:survive_term")
            doomed_pid = (await first_event(doomed))["pid"]
            second = await sup.submit(
                "tests.agents.handover:note_start", {"path": str(path), "hold": str(hold)}
            )
            third = await sup.submit("tests.agents.handover:note_start", {"path": str(path)})
            await doomed.cancel()
            await wait_for_start(path, second.turn_id)
            # The third waits: no slot for it (queued; "handed" would still count as queued, TURN-HANDED).
            assert sup.record(third.turn_id).state in ("queued", "handed")
            assert (await doomed.result()).outcome == "killed"
            killed_at = sup.record(doomed.turn_id).ended_at
            assert [t for t, _, _ in starts(path)] == [second.turn_id]
            hold.touch()
            assert (await second.result()).outcome == "completed"
            assert (await third.result()).outcome == "completed"
    lines = starts(path)
    assert [t for t, _, _ in lines] == [second.turn_id, third.turn_id]
    assert doomed_pid not in {p for _, p, _ in lines}
    assert killed_at is not None and lines[1][2] >= killed_at


async def test_a_doomed_turn_that_reports_an_end_is_still_killed_and_the_next_runs_once(
    tmp_path: Path,
) -> None:
    """The doomed turn's agent returns on SIGTERM: its worker sends an ``End`` after the kill
    decision and stays alive until the SIGKILL step. The turn is ``killed`` (TURN-ONE-OUTCOME); the queued
    turn ran once, on the spare; the doomed worker, idle now, is never handed a turn."""
    path = tmp_path / "starts"
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=1, grace=0.0, kill_after=0.5) as sup:
            await full(sup, 2)
            doomed = await sup.submit("tests.agents.handover:end_on_term")
            doomed_pid = (await first_event(doomed))["pid"]
            handles = [
                await sup.submit("tests.agents.handover:note_start", {"path": str(path)}) for _ in range(3)
            ]
            await doomed.cancel()
            outs = [(await h.result()) for h in handles]
            result = await doomed.result()
    assert result.outcome == "killed" and result.exit_code == -signal.SIGKILL, result
    assert all(o.outcome == "completed" for o in outs), outs
    lines = starts(path)
    assert sorted(t for t, _, _ in lines) == sorted(h.turn_id for h in handles)
    assert doomed_pid not in {p for _, p, _ in lines}


async def test_without_a_spare_the_next_turn_waits_for_the_killed_result(tmp_path: Path) -> None:
    """No spare, no early start: the queued turn runs on the replacement, after ``killed``
    (the pool never runs more than ``workers`` turns)."""
    path = tmp_path / "starts"
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0, grace=0.0, kill_after=0.3) as sup:
            doomed = await sup.submit("tests.agents.handover:survive_term")
            await first_event(doomed)
            nxt = await sup.submit("tests.agents.handover:note_start", {"path": str(path)})
            await doomed.cancel()
            out = (await nxt.result()).output
            assert (await doomed.result()).outcome == "killed"
            ended_at = sup.record(doomed.turn_id).ended_at
    assert ended_at is not None and out["t"] >= ended_at


async def test_turns_handed_ahead_to_the_doomed_worker_come_back_at_the_kill_decision(tmp_path: Path) -> None:
    """Short turns make the pool prefetch: the turns queued behind the doomed one are handed ahead
    to its worker. At the kill decision they come back (its worker waits for an ``EndAck`` it is
    never sent, so it cannot have started them) and run on the spare once the doomed worker is
    gone, each once, in order; none runs on the doomed worker."""
    path = tmp_path / "starts"
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=1, grace=0.0, kill_after=1.0) as sup:
            await full(sup, 2)
            for _ in range(30):  # the mean turn time falls: turns are handed ahead from now on
                await sup.run("examples.agents:noop")
            doomed = await sup.submit("tests.agents.handover:survive_term")
            doomed_pid = (await first_event(doomed))["pid"]
            behind = [
                await sup.submit("tests.agents.handover:note_start", {"path": str(path)}) for _ in range(3)
            ]
            handed = [sup.record(h.turn_id).state for h in behind]
            assert "handed" in handed, handed  # (the case under test: prefetched to the doomed worker)
            await doomed.cancel()
            outs = [(await h.result()) for h in behind]
            result = await doomed.result()
            record = sup.record(doomed.turn_id)
    assert result.outcome == "killed", result
    assert all(o.outcome == "completed" for o in outs), outs
    lines = starts(path)
    assert [t for t, _, _ in lines] == [h.turn_id for h in behind]
    assert doomed_pid not in {p for _, p, _ in lines}
    assert record.escalated_at is not None
    assert all(at >= record.escalated_at + 0.9 for _, _, at in lines), (lines, record.escalated_at)
