"""The foundation: every outcome end to end, cooperative abort, the escalation ladder, trees."""

from __future__ import annotations

import os
import signal
import time

import anyio
import psutil
import pytest

import supervisor
import wire
from supervisor import Supervisor, TurnResult
from tests.support.events import first_event
from wire import worker_link

pytestmark = pytest.mark.anyio


def gone(pid: int) -> bool:
    """True when ``pid`` no longer exists at all (exited and reaped)."""
    return not psutil.pid_exists(pid)


async def test_completed_fills_the_result() -> None:
    """An agent that returns ends ``completed`` with its output and the result's fields set."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(30):
            result = await sup.run("examples.agents:echo", {"text": "hi"}, session="s1")
    assert isinstance(result, TurnResult)
    assert result.outcome == "completed"
    assert result.output == {"text": "hi"}
    assert result.error is None and result.cause is None
    assert result.started is True
    assert result.session == "s1"
    assert result.worker_pid and result.exit_code is None
    assert result.queued_s >= 0 and result.run_s >= 0


async def test_sync_def_agent_runs_in_a_thread() -> None:
    """A plain ``def`` agent runs (in a worker thread) and returns."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(30):
            result = await sup.run("examples.agents:echo_sync", [1, 2])
    assert result.outcome == "completed" and result.output == [1, 2]


async def test_failed_keeps_the_worker() -> None:
    """An agent that raises ends ``failed`` with type and message; the same worker serves next."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(30):
            failed = await sup.run("examples.agents:failing", {"message": "boom"})
            after = await sup.run("examples.agents:echo", 1)
    assert failed.outcome == "failed"
    assert failed.error == wire.TurnError("ValueError", "boom")
    assert after.outcome == "completed" and after.worker_pid == failed.worker_pid


async def test_import_error_fails_the_turn_not_the_worker() -> None:
    """An agent that cannot be imported ends ``failed`` with the import error's type."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(30):
            missing = await sup.run("examples.no_such_module:agent")
            no_attr = await sup.run("examples.agents:no_such_agent")
            after = await sup.run("examples.agents:echo", 2)
    assert missing.outcome == "failed" and missing.error and missing.error.type == "ModuleNotFoundError"
    assert no_attr.outcome == "failed" and no_attr.error and no_attr.error.type == "AttributeError"
    assert after.outcome == "completed" and after.worker_pid == missing.worker_pid


async def test_unencodable_output_fails() -> None:
    """An output msgspec cannot encode ends the turn ``failed`` with a TypeError."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(30):
            result = await sup.run("tests.agents:bad_output")
    assert result.outcome == "failed" and result.error and result.error.type == "TypeError"


async def test_cooperative_cancel_is_aborted_well_before_grace() -> None:
    """``slow`` cancelled → ``aborted`` long before the grace; the worker is the same afterwards."""
    grace = 20.0
    async with Supervisor(workers=1, spares=0, grace=grace) as sup:
        handle = await sup.submit("examples.agents:slow", {"seconds": 60})
        started = await first_event(handle)
        t0 = time.monotonic()
        assert await handle.cancel() == {"kind": "user"}
        with anyio.fail_after(30):
            result = await handle.result()
        elapsed = time.monotonic() - t0
        with anyio.fail_after(30):
            after = await sup.run("tests.agents:signal_state")
    assert result.outcome == "aborted" and result.cause == {"kind": "user"} and result.started
    assert elapsed < grace / 2
    assert result.worker_pid == started["pid"] == after.worker_pid
    # A new turn on the same worker gets a fresh signal.
    assert after.output["cancelled"] is False and after.output["cause"] is None


async def test_checkpoint_raises_the_cancellation() -> None:
    """``await turn.checkpoint()`` raises once cancelled; letting it propagate ends ``aborted``."""
    async with Supervisor(workers=1, spares=0, grace=20) as sup:
        handle = await sup.submit("tests.agents:checkpoint_loop")
        await first_event(handle)
        await handle.cancel({"kind": "parent"})
        with anyio.fail_after(30):
            result = await handle.result()
    assert result.outcome == "aborted" and result.cause == {"kind": "parent"}


async def test_sync_agent_honours_the_signal() -> None:
    """A plain ``def`` agent sees ``turn.signal`` set and bails out with TurnCancelled → ``aborted``."""
    async with Supervisor(workers=1, spares=0, grace=20) as sup:
        handle = await sup.submit("tests.agents:sync_cooperative")
        assert await first_event(handle) == {"type": "sync-started"}
        await handle.cancel()
        with anyio.fail_after(30):
            result = await handle.result()
    assert result.outcome == "aborted"


async def test_unrelated_error_after_cancel_is_failed() -> None:
    """A turn that is cancelled but then raises something unrelated ends ``failed``."""
    async with Supervisor(workers=1, spares=0, grace=20) as sup:
        handle = await sup.submit("tests.agents:catches_and_fails")
        await first_event(handle)
        await handle.cancel()
        with anyio.fail_after(30):
            result = await handle.result()
    assert result.outcome == "failed" and result.error and result.error.type == "RuntimeError"


async def test_stubborn_turn_is_killed_after_grace() -> None:
    """A turn that never awaits is killed no sooner than ``grace`` after the cancel, and within
    ``grace + kill_after`` plus slack; SIGTERM (handled by the worker) suffices; a new pid serves next."""
    grace, kill_after = 0.5, 3.0
    async with Supervisor(workers=1, spares=0, grace=grace, kill_after=kill_after) as sup:
        handle = await sup.submit("examples.agents:stubborn")
        info = await first_event(handle)
        t0 = time.monotonic()
        await handle.cancel()
        with anyio.fail_after(30):
            result = await handle.result()
        elapsed = time.monotonic() - t0
        assert gone(info["pid"])
        with anyio.fail_after(30):
            after = await sup.run("examples.agents:echo", 1)
    assert result.outcome == "killed" and result.cause == {"kind": "user"}
    assert result.exit_code == -signal.SIGTERM
    assert grace <= elapsed < grace + kill_after + 10
    assert after.outcome == "completed" and after.worker_pid != info["pid"]


async def test_sigterm_ignorer_needs_sigkill() -> None:
    """A turn that ignores SIGTERM is killed by the SIGKILL step, no sooner than grace + kill_after."""
    grace, kill_after = 0.3, 0.5
    async with Supervisor(workers=1, spares=1, grace=grace, kill_after=kill_after) as sup:
        handle = await sup.submit("examples.agents:sigterm_ignorer")
        info = await first_event(handle)
        t0 = time.monotonic()
        await handle.cancel()
        with anyio.fail_after(30):
            result = await handle.result()
        elapsed = time.monotonic() - t0
        assert gone(info["pid"])
    assert result.outcome == "killed" and result.exit_code == -signal.SIGKILL
    assert grace + kill_after <= elapsed < grace + kill_after + 10


async def test_sigterm_blocker_is_killed() -> None:
    """A turn that blocks SIGTERM in its thread's signal mask is still killed (another thread of
    the worker takes the signal, or the SIGKILL step does)."""
    async with Supervisor(workers=1, spares=0, grace=0.2, kill_after=0.3) as sup:
        handle = await sup.submit("examples.agents:sigterm_blocker")
        info = await first_event(handle)
        await handle.cancel()
        with anyio.fail_after(30):
            result = await handle.result()
        assert gone(info["pid"])
    assert result.outcome == "killed" and result.exit_code in (-signal.SIGTERM, -signal.SIGKILL)


async def test_forker_tree_is_gone_after_the_result() -> None:
    """``forker`` cancelled → once the result is out, its grandchildren and its double-forked
    setsid daemon are all gone (killed and reaped)."""
    async with Supervisor(workers=1, spares=0, grace=0.3, kill_after=0.5) as sup:
        handle = await sup.submit("examples.agents:forker", {"children": 2})
        info = await first_event(handle)
        pids = [*info["children"], info["daemon"], info["worker"]]
        assert all(psutil.pid_exists(p) for p in pids)
        await handle.cancel()
        with anyio.fail_after(30):
            result = await handle.result()
        assert result.outcome == "killed"
        assert [p for p in pids if not gone(p)] == []


async def test_forker_tree_is_gone_after_sigkill_step() -> None:
    """Same, when the worker ignores SIGTERM: the supervisor's own freeze-and-kill finds the tree."""
    async with Supervisor(workers=1, spares=0, grace=0.2, kill_after=0.2) as sup:
        handle = await sup.submit("examples.agents:forker", {"children": 1, "ignore_sigterm": True})
        info = await first_event(handle)
        pids = [*info["children"], info["daemon"], info["worker"]]
        await handle.cancel()
        with anyio.fail_after(30):
            result = await handle.result()
        assert result.outcome == "killed" and result.exit_code == -signal.SIGKILL
        assert [p for p in pids if not gone(p)] == []


@pytest.mark.parametrize(("how", "code"), [("exit", 3), ("segv", -signal.SIGSEGV)])
async def test_crash_is_recorded_and_the_pool_keeps_serving(how: str, code: int) -> None:
    """A worker that dies on its own mid-turn: ``crashed`` with the exit code; the next turn runs."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(30):
            result = await sup.run("examples.agents:crasher", {"how": how, "code": 3})
            after = await sup.run("examples.agents:echo", "next")
    assert result.outcome == "crashed" and result.exit_code == code and result.started
    assert after.outcome == "completed" and after.worker_pid != result.worker_pid


async def test_killed_from_outside_is_crashed() -> None:
    """SIGKILL of the worker by someone else while it runs a turn → ``crashed``, exit -9."""
    async with Supervisor(workers=1, spares=0) as sup:
        handle = await sup.submit("examples.agents:slow", {"seconds": 60})
        info = await first_event(handle)
        os.kill(info["pid"], signal.SIGKILL)
        with anyio.fail_after(30):
            result = await handle.result()
    assert result.outcome == "crashed" and result.exit_code == -signal.SIGKILL


async def test_cancel_of_a_queued_turn_never_starts_it() -> None:
    """Cancelling a queued turn removes it: ``aborted``, ``started`` false, and it never runs."""
    async with Supervisor(workers=1, spares=0, grace=10) as sup:
        blocker = await sup.submit("examples.agents:slow", {"seconds": 60})
        await first_event(blocker)
        queued = await sup.submit("examples.agents:echo", "never")
        assert await queued.cancel() == {"kind": "user"}
        with anyio.fail_after(30):
            result = await queued.result()
        assert result.outcome == "aborted" and result.started is False and result.worker_pid is None
        await blocker.cancel()
        with anyio.fail_after(30):
            assert (await blocker.result()).outcome == "aborted"


BAD_CAUSES: list[tuple[object, type[Exception]]] = [
    ("user", TypeError),
    ({"kind": "nope"}, ValueError),
    ({"kind": "user", "extra": 1}, ValueError),
    ({}, ValueError),
    ([("kind", "user")], TypeError),
    (ValueError("user"), TypeError),
    (object(), TypeError),
    ({"kind": 1}, TypeError),
    ({1: "user"}, TypeError),
]


async def test_bad_causes_are_rejected_at_the_call() -> None:
    """A bad cause raises at the call, even when idle, and changes nothing. (One pool for every bad
    cause: each is checked on an ended turn, a session and a running turn that then completes.)"""
    async with Supervisor(workers=1, spares=0) as sup:
        for cause, error in BAD_CAUSES:
            with anyio.fail_after(30):
                done = await sup.run("examples.agents:echo", 1)
            with pytest.raises(error):
                await sup.cancel(done.turn_id, cause)
            with pytest.raises(error):
                await sup.cancel_session("s", cause)
            handle = await sup.submit("examples.agents:slow", {"seconds": 0.2})
            with pytest.raises(error):
                await handle.cancel(cause)
            with anyio.fail_after(30):
                assert (await handle.result()).outcome == "completed", cause


async def test_first_cause_wins_and_ended_turns_are_unchanged() -> None:
    """Repeated cancels return the first cause; after the end nothing changes."""
    async with Supervisor(workers=1, spares=0, grace=10) as sup:
        handle = await sup.submit("examples.agents:slow", {"seconds": 60})
        await first_event(handle)
        assert await handle.cancel({"kind": "parent"}) == {"kind": "parent"}
        assert await handle.cancel() == {"kind": "parent"}
        with anyio.fail_after(30):
            result = await handle.result()
        assert result.cause == {"kind": "parent"}
        assert await handle.cancel({"kind": "deadline"}) == {"kind": "parent"}
        with anyio.fail_after(30):
            done = await sup.run("examples.agents:echo", 1)
        assert await sup.cancel(done.turn_id) is None
        assert (await sup.handle(done.turn_id).result()).cause is None
        with pytest.raises(supervisor.UnknownTurn):
            await sup.cancel("no-such-turn")
        with pytest.raises(supervisor.UnknownTurn):
            sup.handle("no-such-turn")


async def test_stale_abort_is_dropped_by_the_worker() -> None:
    """An ``Abort`` whose turn id is not the running turn changes nothing."""
    async with Supervisor(workers=1, spares=0) as sup:
        handle = await sup.submit("tests.agents:wait_signal")
        await first_event(handle)
        slot = next(s for s in sup.pool.slots.values() if s.turn is not None)
        sup.link.send(slot, worker_link.Abort("some-earlier-turn", wire.USER))
        # The worker handled the stale abort before this round trip completes.
        with anyio.fail_after(30):
            probe = await sup.submit("examples.agents:echo", 1)
            await handle.cancel({"kind": "deadline"})
            result = await handle.result()
            await probe.result()
    assert result.outcome == "completed" and result.output == {"saw": "deadline"}


async def test_deadline_counts_from_start() -> None:
    """``timeout`` is counted from the start, not from submission, and ends with cause ``deadline``."""
    async with Supervisor(workers=1, spares=0, grace=10) as sup:
        first = await sup.submit("examples.agents:slow", {"seconds": 0.6})
        second = await sup.submit("examples.agents:slow", {"seconds": 0.1}, timeout=0.5)
        timed = await sup.submit("examples.agents:slow", {"seconds": 60}, timeout=0.2)
        with anyio.fail_after(30):
            r1, r2, r3 = await first.result(), await second.result(), await timed.result()
    assert r1.outcome == "completed" and r2.outcome == "completed"
    assert r3.outcome == "aborted" and r3.cause == {"kind": "deadline"}


async def test_events_are_followed_in_order_even_late() -> None:
    """``events()`` yields every emitted event in order; a late follower still gets them all."""
    async with Supervisor(workers=1, spares=0) as sup:
        handle = await sup.submit("examples.agents:streamer", {"count": 20})
        with anyio.fail_after(30):
            result = await handle.result()
            late = [e async for e in handle.events()]
    assert result.output == {"events": 20}
    assert [e["i"] for e in late] == list(range(20))


async def test_max_turns_per_worker_recycles() -> None:
    """``max_turns_per_worker=1``: each turn runs in a fresh worker."""
    async with Supervisor(workers=1, spares=0, max_turns_per_worker=1) as sup:
        with anyio.fail_after(60):
            pids = [(await sup.run("examples.agents:echo", i)).worker_pid for i in range(3)]
    assert len(set(pids)) == 3


async def test_memory_limit_cancels_with_cause_memory() -> None:
    """A worker tree above ``max_rss_mb`` is cancelled with cause ``memory``."""
    async with Supervisor(workers=1, spares=0, max_rss_mb=150, rss_interval=0.05, grace=5) as sup:
        with anyio.fail_after(60):
            result = await sup.run("examples.agents:hog", {"mb": 300})
    assert result.outcome == "aborted" and result.cause == {"kind": "memory"}


async def test_disposal_cancels_everything_with_cause_disposed() -> None:
    """Leaving the block disposes: queued → aborted, cooperative → aborted, stubborn → killed,
    all with cause ``disposed`` (even after a user cancel); every worker is reaped."""
    async with Supervisor(workers=2, spares=0, grace=0.3, kill_after=0.5) as sup:
        coop = await sup.submit("examples.agents:slow", {"seconds": 60})
        stub = await sup.submit("examples.agents:stubborn")
        queued = await sup.submit("examples.agents:echo", 1)
        await first_event(coop)
        info = await first_event(stub)
        await coop.cancel()  # user first; disposal still wins in the result
        pids = [s.pid for s in sup.pool.slots.values()]
    results = {h: await h.result() for h in (coop, stub, queued)}
    assert results[queued].outcome == "aborted" and not results[queued].started
    assert results[stub].outcome == "killed"
    assert all(r.cause == {"kind": "disposed"} for r in results.values())
    assert results[coop].outcome in ("aborted", "killed")
    assert all(gone(p) for p in [*pids, info["pid"]])
    with pytest.raises(supervisor.SupervisorClosed):
        await sup.submit("examples.agents:echo", 1)


async def test_bad_input_is_rejected_at_the_call() -> None:
    """Unknown agent syntax, non-encodable input, bad times and a closed supervisor raise clearly."""
    async with Supervisor(workers=1, spares=0, max_queue=1) as sup:
        with pytest.raises(supervisor.InvalidAgent):
            await sup.submit("not an agent")
        with pytest.raises(supervisor.InvalidAgent):
            await sup.submit("module_without_attr")
        with pytest.raises(TypeError):
            await sup.submit("examples.agents:echo", object())
        with pytest.raises(ValueError):
            await sup.submit("examples.agents:echo", 1, timeout=-1)
        with pytest.raises(TypeError):
            await sup.submit("examples.agents:echo", 1, session=3)
        blocker = await sup.submit("examples.agents:slow", {"seconds": 60})
        await first_event(blocker)
        await sup.submit("examples.agents:echo", 1)
        with pytest.raises(supervisor.QueueFull):
            await sup.submit("examples.agents:echo", 2)
    with pytest.raises(ValueError):
        Supervisor(workers=0)
    with pytest.raises(TypeError):
        Supervisor(grace="5")


async def test_idempotent_turn_id() -> None:
    """Submitting an existing ``turn_id`` with the same request returns that turn; it never runs
    twice (another request under the id is ``TurnIdConflict``: tests/test_turn_ids.py)."""
    async with Supervisor(workers=1, spares=0) as sup:
        a = await sup.submit("examples.agents:echo", 1, turn_id="job-1")
        b = await sup.submit("examples.agents:echo", 1, turn_id="job-1")
        with anyio.fail_after(30):
            ra, rb = await a.result(), await b.result()
        assert a.turn_id == b.turn_id == "job-1" and ra is rb and ra.output == 1
        assert (await sup.status())["outcomes"] == {"completed": 1}


async def test_status_and_when_idle() -> None:
    """``status()`` lists workers (pid, state, turn, turns run, rss) and the queue; ``when_idle``
    returns once nothing is queued or running."""
    async with Supervisor(workers=2, spares=1) as sup:
        handles = [await sup.submit("examples.agents:slow", {"seconds": 0.05}) for _ in range(6)]
        with anyio.fail_after(30):
            await sup.when_idle()
        assert all(h for h in handles)
        status = await sup.status()
    assert len(status["workers"]) == 3
    assert {"id", "pid", "state", "turn_id", "turns_run", "rss", "rss_mb"} <= set(status["workers"][0])
    assert all(w["rss"] > 0 for w in status["workers"])
    assert status["queue"] == 0 and status["running"] == 0 and status["outcomes"] == {"completed": 6}


def test_sync_supervisor() -> None:
    """``SyncSupervisor`` offers the same methods, blocking."""
    with supervisor.SyncSupervisor(workers=1, spares=0, grace=10) as sup:
        assert sup.run("examples.agents:echo", {"x": 1}).output == {"x": 1}
        handle = sup.submit("examples.agents:streamer", {"count": 3})
        assert [e["i"] for e in handle.events()] == [0, 1, 2]
        assert handle.result().outcome == "completed"
        slow = sup.submit("examples.agents:slow", {"seconds": 60})
        for _ in slow.events():
            break
        assert slow.cancel() == {"kind": "user"}
        assert slow.result().outcome == "aborted"
        assert sup.handle(slow.turn_id).result().outcome == "aborted"
        sup.when_idle()
        assert sup.status()["outcomes"]["aborted"] == 1


def test_public_exports_are_pinned() -> None:
    """The names SPEC.md makes public stay importable."""
    import worker
    from supervisor import Supervisor, SyncSupervisor, TurnResult  # noqa: F401

    assert {"Turn", "CancelSignal", "TurnCancelled"} <= set(worker.__all__)
    assert {"Supervisor", "SyncSupervisor", "TurnResult", "TurnHandle", "QueueFull", "UnknownTurn"} <= set(
        supervisor.__all__
    )
