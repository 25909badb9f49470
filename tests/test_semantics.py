"""The RFC's turn semantics across the process boundary: sessions, child turns, deadlines,
strict causes, first-wins, disposal-wins and truthful quiescence, under the RFC's races."""

from __future__ import annotations

from itertools import pairwise

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor import Supervisor, SupervisorClosed
from tests.test_foundation import first_event

pytestmark = pytest.mark.anyio


def start_watch(sup: Supervisor) -> dict[str, anyio.Event]:
    """Events set when a turn is reported started, keyed by the turn's agent or parent."""
    seen: dict[str, anyio.Event] = {}

    def hook(turn, pid):  # type: ignore[no-untyped-def]
        for key in (turn.id, f"child-of:{turn.parent}"):
            seen.setdefault(key, anyio.Event()).set()

    sup.add_hooks(on_start=hook)
    return seen


async def wait_started(seen: dict[str, anyio.Event], key: str) -> None:
    with anyio.fail_after(30):
        await seen.setdefault(key, anyio.Event()).wait()


async def test_session_turns_run_one_at_a_time_in_order() -> None:
    """Turns of one session run one at a time in submission order; other sessions use other workers."""
    async with Supervisor(workers=3, spares=0) as sup:
        a = [await sup.submit("examples.agents:slow", {"seconds": 0.15}, session="A") for _ in range(4)]
        b = [await sup.submit("examples.agents:slow", {"seconds": 0.15}, session="B") for _ in range(2)]
        with anyio.fail_after(60):
            ra = [await h.result() for h in a]
            rb = [await h.result() for h in b]
    for prev, nxt in pairwise(ra):
        assert nxt.started_at >= prev.ended_at
    # Session B did not wait for session A.
    assert rb[0].started_at < ra[-1].started_at


async def test_cancel_session_clears_only_what_was_queued_at_the_call() -> None:
    """``cancel_session`` cancels the running turn and the session's queued turns; a turn
    submitted afterwards runs normally with a fresh holder."""
    async with Supervisor(workers=1, spares=0, grace=20) as sup:
        running = await sup.submit("examples.agents:slow", {"seconds": 60}, session="s")
        await first_event(running)
        q1 = await sup.submit("examples.agents:echo", 1, session="s")
        q2 = await sup.submit("examples.agents:echo", 2, session="s")
        other = await sup.submit("examples.agents:echo", 3, session="t")
        cancelled = await sup.cancel_session("s")
        after = await sup.submit("examples.agents:echo", 4, session="s")
        with anyio.fail_after(30):
            results = [await h.result() for h in (running, q1, q2, other, after)]
    assert set(cancelled) == {running.turn_id, q1.turn_id, q2.turn_id}
    r_running, r1, r2, r_other, r_after = results
    assert r_running.outcome == "aborted" and r_running.started
    assert (r1.outcome, r1.started, r2.outcome, r2.started) == ("aborted", False, "aborted", False)
    assert r_other.outcome == "completed"
    assert r_after.outcome == "completed" and r_after.cause is None
    assert r_after.started_at >= r_running.ended_at


async def test_repeated_cancel_session_first_cause_wins_and_clears_new_queued() -> None:
    """A second ``cancel_session`` keeps the running turn's first cause but clears turns queued
    since the first call."""
    async with Supervisor(workers=1, spares=0, grace=1.0, kill_after=1.0) as sup:
        stubborn = await sup.submit("examples.agents:stubborn", session="s")
        await first_event(stubborn)
        assert await sup.cancel_session("s", {"kind": "parent"}) == [stubborn.turn_id]
        newer = await sup.submit("examples.agents:echo", 1, session="s")
        second = await sup.cancel_session("s", {"kind": "user"})
        assert newer.turn_id in second
        assert await stubborn.cancel() == {"kind": "parent"}
        with anyio.fail_after(30):
            r_stub, r_newer = await stubborn.result(), await newer.result()
    assert r_stub.outcome == "killed" and r_stub.cause == {"kind": "parent"}
    assert r_newer.outcome == "aborted" and not r_newer.started and r_newer.cause == {"kind": "user"}


async def test_replacement_from_a_follower_starts_after_quiescence() -> None:
    """A follower cancels a stubborn turn and at once submits a replacement in the same session:
    the replacement gets a fresh holder and starts only after the old turn was killed and reaped."""
    async with Supervisor(workers=2, spares=0, grace=0.3, kill_after=1.0) as sup:
        old = await sup.submit("examples.agents:stubborn", session="s")
        replacement = None
        with anyio.fail_after(30):
            async for _event in old.events():
                await old.cancel()
                replacement = await sup.submit("tests.agents:signal_state", session="s")
                break
            assert replacement is not None
            r_old, r_new = await old.result(), await replacement.result()
    assert r_old.outcome == "killed"
    assert r_new.outcome == "completed" and r_new.cause is None
    assert r_new.output["cancelled"] is False
    assert r_new.started_at >= r_old.ended_at


async def test_idle_cancellation_is_harmless() -> None:
    """Cancelling with nothing running: ended turns are unchanged, an empty session clears nothing."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(30):
            done = await sup.run("examples.agents:echo", 1, session="s")
        assert await sup.cancel_session("s") == []
        assert await sup.cancel_session("never-used") == []
        assert await sup.cancel(done.turn_id) is None
        with pytest.raises(ValueError):
            await sup.cancel_session("s", {"kind": "bogus"})
        with pytest.raises(TypeError):
            await sup.cancel_session(None)  # type: ignore[arg-type]


async def test_stale_abort_after_a_new_turn_started_is_dropped() -> None:
    """Turn 1 is cancelled; turn 2 then runs on the same worker with a fresh signal, and a late
    Abort for turn 1 does not touch it."""
    import wire
    from wire import worker_link

    async with Supervisor(workers=1, spares=0, grace=20) as sup:
        one = await sup.submit("examples.agents:slow", {"seconds": 60})
        await first_event(one)
        await one.cancel()
        with anyio.fail_after(30):
            assert (await one.result()).outcome == "aborted"
        two = await sup.submit("tests.agents:wait_signal")
        await first_event(two)
        slot = next(s for s in sup.pool.slots.values() if s.turn is not None)
        sup.link.send(slot, worker_link.Abort(one.turn_id, wire.USER))
        # Frames to one worker arrive in order: the stale Abort is handled before this one.
        with anyio.fail_after(30):
            await two.cancel({"kind": "deadline"})
            r_two = await two.result()
    assert r_two.outcome == "completed" and r_two.output == {"saw": "deadline"}


async def test_parent_cancel_cancels_the_child_first() -> None:
    """A parent cancelled while its child runs in another worker: the child ends with cause
    ``parent`` before the parent's result is delivered."""
    async with Supervisor(workers=2, spares=0, grace=20) as sup:
        seen = start_watch(sup)
        parent = await sup.submit(
            "examples.agents:parent", {"child": "examples.agents:slow", "child_input": {"seconds": 60}}
        )
        await wait_started(seen, f"child-of:{parent.turn_id}")
        child_id = next(t.id for t in sup.records() if t.parent == parent.turn_id)
        await parent.cancel()
        with anyio.fail_after(30):
            r_parent = await parent.result()
            r_child = await sup.handle(child_id).result()
    assert r_parent.outcome == "aborted" and r_parent.cause == {"kind": "user"}
    assert r_child.outcome in ("aborted", "killed") and r_child.cause == {"kind": "parent"}
    assert r_child.parent == parent.turn_id
    assert r_child.worker_pid != r_parent.worker_pid
    assert r_child.ended_at <= r_parent.ended_at


async def test_three_level_tree_cancelled_at_the_root() -> None:
    """root → mid → leaf; cancelling the root cancels mid and leaf with cause ``parent``, each
    child ending before its parent's result."""
    async with Supervisor(workers=3, spares=0, grace=20) as sup:
        seen = start_watch(sup)
        root = await sup.submit("tests.agents:spawn_tree", {"depth": 2})
        await wait_started(seen, f"child-of:{root.turn_id}")
        mid = next(t.id for t in sup.records() if t.parent == root.turn_id)
        await wait_started(seen, f"child-of:{mid}")
        leaf = next(t.id for t in sup.records() if t.parent == mid)
        await wait_started(seen, leaf)
        await root.cancel()
        with anyio.fail_after(30):
            r_root = await root.result()
            r_mid = await sup.handle(mid).result()
            r_leaf = await sup.handle(leaf).result()
    assert r_root.cause == {"kind": "user"} and r_root.outcome == "aborted"
    assert r_mid.cause == {"kind": "parent"} and r_leaf.cause == {"kind": "parent"}
    assert r_leaf.ended_at <= r_mid.ended_at <= r_root.ended_at


async def test_spawn_in_a_full_pool_lends_the_parents_slot() -> None:
    """With one worker, a parent waiting on its child lends its slot: the child runs, no deadlock."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(60):
            result = await sup.run("tests.agents:spawn_echo", {"x": 1})
        assert result.outcome == "completed"
        assert result.output["outcome"] == "completed" and result.output["output"] == {"x": 1}
        assert result.output["parent"] == result.turn_id
        with anyio.fail_after(60):
            results = [
                await h.result() for h in [await sup.submit("tests.agents:spawn_echo", i) for i in range(3)]
            ]
    assert all(r.outcome == "completed" for r in results)


async def test_abandoned_spawn_await_cancels_the_child() -> None:
    """A parent that stops awaiting ``turn.spawn`` cancels its child (cause ``parent``)."""
    async with Supervisor(workers=2, spares=0, grace=20) as sup:
        with anyio.fail_after(60):
            result = await sup.run("tests.agents:spawn_with_timeout", {"after": 0.3})
        child = next(t for t in sup.records() if t.parent == result.turn_id)
        with anyio.fail_after(30):
            r_child = await sup.handle(child.id).result()
    assert result.outcome == "completed" and result.output == {"gave_up": True}
    assert r_child.outcome == "aborted" and r_child.cause == {"kind": "parent"}
    assert r_child.ended_at <= result.ended_at


async def test_supervisor_default_timeout_and_override() -> None:
    """A supervisor-wide ``timeout`` applies to every turn; a per-turn ``timeout`` overrides it."""
    async with Supervisor(workers=2, spares=0, timeout=0.2, grace=20) as sup:
        a = await sup.submit("examples.agents:slow", {"seconds": 60})
        b = await sup.submit("examples.agents:slow", {"seconds": 0.4}, timeout=30)
        with anyio.fail_after(30):
            ra, rb = await a.result(), await b.result()
    assert ra.outcome == "aborted" and ra.cause == {"kind": "deadline"}
    assert rb.outcome == "completed"


async def test_disposal_keeps_unrelated_failures_failed() -> None:
    """Disposal wins for interrupted turns, but a turn that fails for an unrelated reason while
    being disposed still ends ``failed``."""
    async with Supervisor(workers=1, spares=0, grace=20) as sup:
        handle = await sup.submit("tests.agents:catches_and_fails")
        await first_event(handle)
    result = await handle.result()
    assert result.outcome == "failed" and result.error and result.error.type == "RuntimeError"


async def test_when_idle_waits_for_the_kill_and_reap() -> None:
    """``when_idle`` returns only after a stubborn turn's worker was killed and reaped."""
    import psutil

    async with Supervisor(workers=1, spares=0, grace=0.2, kill_after=1.0) as sup:
        handle = await sup.submit("examples.agents:stubborn")
        info = await first_event(handle)
        await handle.cancel()
        with anyio.fail_after(30):
            await sup.when_idle()
        assert not psutil.pid_exists(info["pid"])
        assert (await handle.result()).outcome == "killed"


OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.sampled_from(["a", "b", None]),
            st.sampled_from(["echo", "slow", "stubborn"]),
        ),
        st.tuples(st.just("cancel"), st.integers(0, 40), st.sampled_from(["user", "parent"])),
        st.tuples(st.just("cancel_session"), st.sampled_from(["a", "b"])),
        st.tuples(st.just("yield"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=20,
)
AGENTS = {
    "echo": ("examples.agents:echo", 1),
    "slow": ("examples.agents:slow", {"seconds": 0.15}),
    "stubborn": ("examples.agents:stubborn", {"seconds": 0.4}),
}


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS, dispose_at=st.integers(0, 20))
def test_random_interleavings_keep_the_invariants(ops: list[tuple], dispose_at: int) -> None:
    """Random submit / cancel / cancel_session / dispose interleavings: exactly one outcome per
    turn, session order kept, no turn started after a cancel that found it queued, and (by the
    autouse fixture) no process left."""

    async def scenario() -> None:
        handles = []
        never_start: set[str] = set()
        sup = Supervisor(workers=2, spares=0, grace=0.1, kill_after=0.3)
        async with sup:
            for i, op in enumerate(ops):
                if i == dispose_at:
                    break
                match op:
                    case ("submit", session, kind):
                        agent, inp = AGENTS[kind]
                        handles.append(await sup.submit(agent, inp, session=session))
                    case ("cancel", index, kind) if handles:
                        h = handles[index % len(handles)]
                        if sup.record(h.turn_id).state == "queued":
                            never_start.add(h.turn_id)
                        await h.cancel({"kind": kind})
                    case ("cancel_session", session):
                        never_start.update(t.id for t in sup.queue.queued_of_session(session))
                        await sup.cancel_session(session)
                    case ("yield", n):
                        for _ in range(n):
                            await anyio.lowlevel.checkpoint()
        with anyio.fail_after(30):
            results = [await h.result() for h in handles]
        assert sum((await sup.status())["outcomes"].values()) == len(handles)
        assert len({r.turn_id for r in results}) == len(results)
        for r in results:
            assert r.outcome in ("completed", "aborted", "killed")
            if r.turn_id in never_start:
                assert not r.started and r.outcome == "aborted"
        for session in ("a", "b"):
            ran = [r for r in results if r.session == session and r.started]
            for prev, nxt in pairwise(ran):
                assert nxt.started_at >= prev.ended_at
        with pytest.raises(SupervisorClosed):
            await sup.submit("examples.agents:echo", 1)

    anyio.run(scenario)
