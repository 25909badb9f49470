"""Issue 16, the kill and recovery paths made shorter (docs/design.md WORKER-ONE-THREAD, LADDER-TERM-FIRST,
LADDER-REAP, WORKER-WARM, WORKER-SPARE): each change keeps the tree-kill and reaping promises."""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import psutil
import pytest

from supervisor import Supervisor
from tests.support.events import first_event

pytestmark = pytest.mark.anyio

BOUND = 30


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid)


async def test_a_worker_runs_one_thread_of_its_own_besides_main() -> None:
    """WORKER-ONE-THREAD: a worker has its main thread, ZeroMQ's two and one watcher (stale flusher and
    life pipe together): a killed worker has four threads to end, not five. The life pipe is
    still watched: ``tests/test_supervisor_death.py`` kills the supervisor under it."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0) as sup:
            out = (await sup.run("tests.agents.kill_speed:threads")).output
    assert len(out["names"]) == 4, out
    assert "life-pipe" not in out["names"]


async def test_the_sigterm_step_never_stops_the_worker(tmp_path: Path) -> None:
    """LADDER-TERM-FIRST: at the SIGTERM step the worker is signalled without being frozen and thawed (its
    handler starts at once); a worker that ignores SIGTERM is still killed by the SIGKILL step,
    tree reaped, and never saw a SIGCONT."""
    path = tmp_path / "cont"
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0, grace=0.05, kill_after=0.3) as sup:
            handle = await sup.submit("tests.agents.kill_speed:watch_sigcont", {"path": str(path)})
            pid = (await first_event(handle))["pid"]
            await handle.cancel()
            result = await handle.result()
    assert result.outcome == "killed" and result.exit_code == -signal.SIGKILL, result
    assert _gone(pid)
    assert not path.exists(), path.read_text()


async def test_a_forker_killed_at_the_sigterm_step_leaves_nothing() -> None:
    """LADDER-TERM-FIRST with LADDER-NO-WAIT: the worker's handler kills its tree while the supervisor, which
    listed that tree before signalling the worker, reaps every process of it before ``killed``."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0, grace=0.05, kill_after=2.0) as sup:
            for _ in range(3):
                handle = await sup.submit("examples.agents:forker", {"children": 2})
                info = await first_event(handle)
                pids = [*info["children"], info["daemon"], info["worker"]]
                await handle.cancel()
                result = await handle.result()
                assert result.outcome == "killed" and result.exit_code == -signal.SIGTERM, result
                assert [p for p in pids if not _gone(p)] == []


async def test_the_warm_up_turn_runs_before_ready_and_leaves_no_trace() -> None:
    """WORKER-WARM: a worker runs one private no-op turn before it says it is ready; the supervisor
    never hears of it (no frame, no turn, no bad frame), the start marker names no turn, and the
    warm-up agent is not left in the worker's agent cache."""

    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0) as sup:
            slot = next(iter(sup.pool.slots.values()))
            assert sup.pool.read_noted(slot) is None
            result = await sup.run("tests.agents.kill_speed:warm_state")
    assert result.outcome == "completed", result
    assert result.output == {"ran": True, "cached": False}
    assert sup.bad_frames == 0


async def test_a_second_kill_before_the_spare_is_replaced_still_recovers() -> None:
    """WORKER-SPARE: the replacement for a spare that took over starts a little later; a second kill
    in that window (no spare left) starts a worker at once, the queued turns all run, and the
    pool is back to ``workers + spares`` live workers."""
    with anyio.fail_after(BOUND):
        async with Supervisor(
            workers=1, spares=1, grace=0.0, kill_after=1.0, preload=("benchmarks._agents",)
        ) as sup:
            first = await sup.submit("benchmarks._agents:spin")
            await first_event(first)
            second = await sup.submit("benchmarks._agents:spin")
            third = await sup.submit("benchmarks._agents:stamp")
            await first.cancel()
            assert (await first.result()).outcome == "killed"
            await first_event(second)  # on the spare, before its replacement exists
            await second.cancel()
            assert (await second.result()).outcome == "killed"
            assert (await third.result()).outcome == "completed"
            while sum(1 for w in (await sup.status())["workers"] if w["state"] in ("idle", "busy")) < 2:  # noqa: ASYNC110
                await anyio.sleep(0.01)  # allowed: polling the pool's own status, bounded by fail_after


async def test_a_killed_worker_leaves_no_marker_or_end_log_behind() -> None:
    """LADDER-SETTLE: a killed worker that held only its escalated turn is settled without reading its
    start marker and End log; the turn is still ``killed``, the next turn runs, and both are
    dropped (after the result, in a loop callback): the supervisor keeps no mapping of them."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0, grace=0.0, kill_after=1.0) as sup:
            handle = await sup.submit("benchmarks._agents:spin")
            await first_event(handle)
            slot = next(s for s in sup.pool.slots.values() if s.turn is not None)
            files = slot.files
            assert files is not None and files.marker is not None and files.endlog is not None
            await handle.cancel()
            assert (await handle.result()).outcome == "killed"
            assert (await sup.run("examples.agents:noop")).outcome == "completed"
            assert slot.files is None and files.marker is None and files.endlog is None
