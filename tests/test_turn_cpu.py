"""What cutting the per-turn CPU could break (issue 16): the worker's cancel scope, the lean turn
record (MEM-LEAN) and the release of a turn's ``done`` event once its result is out."""

from __future__ import annotations

import gc

import anyio
import msgspec
import pytest

from supervisor import Supervisor, UnknownTurn
from supervisor.lowlevel import TurnRecord
from tests.support.events import first_event

pytestmark = pytest.mark.anyio


async def test_abort_keeps_a_level_triggered_scope_with_shield() -> None:
    """WORKER-SCOPE: the worker builds each turn's cancel scope from a cached class. It must still be
    anyio's own scope: an agent that swallows the first cancellation is cancelled again at its
    next await, a shielded cleanup inside it runs to its end, the outcome is ``aborted``; the
    next turn on that worker gets a fresh scope (it completes, nothing stale cancels it)."""
    async with Supervisor(workers=1, spares=0, grace=30) as sup:
        for _ in range(2):  # twice on the same worker: the cached class builds a new scope each time
            handle = await sup.submit("tests.agents.turncpu:level_cancel")
            assert await first_event(handle) == {"step": "running"}
            await handle.cancel()
            with anyio.fail_after(60):
                events = [e async for e in handle.events()]
                result = await handle.result()
            assert result.outcome == "aborted", result
            assert result.cause is not None and result.cause.kind == "user"
            assert events == [{"step": "running"}, {"step": "cleaned"}]
        with anyio.fail_after(60):
            after = await sup.run("examples.agents:echo", {"x": 1})
        assert after.outcome == "completed" and after.output == {"x": 1}
        assert after.worker_pid == result.worker_pid


async def test_a_kept_turn_holds_few_objects_the_collector_tracks() -> None:
    """MEM-LEAN: a kept turn without events, followers or children holds at most two objects that
    Python's cyclic collector tracks (its record and its result): no empty containers of its own,
    and no ``done`` event once its result is out, even when ``result()`` was awaited before the
    turn ended (as each lane of ``run_batch`` does). Before: five to seven per turn, which made the
    collections cost the supervisor more CPU per turn than any step of its path."""
    n = 400
    async with Supervisor(workers=2, spares=0) as sup:
        with anyio.fail_after(120):
            for _ in range(20):
                await sup.run("examples.agents:echo", {"i": 0})
            gc.collect()
            before = len(gc.get_objects())
            results = []

            async def one(i: int) -> None:
                handle = await sup.submit("examples.agents:echo", {"i": i}, turn_id=f"lean-{i}")
                results.append(await handle.result())  # awaited before the turn ends

            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
            del one
            gc.collect()
            per_turn = (len(gc.get_objects()) - before) / n
    assert len(results) == n and {r.outcome for r in results} == {"completed"}
    assert per_turn <= 2.5, f"{per_turn:.2f} tracked objects per kept turn"


async def test_shared_empties_stay_empty_and_turns_keep_their_own() -> None:
    """MEM-LEAN: turns with events, followers and children get containers of their own; the shared
    empty values of the turns without stay empty (a stray write would raise, never be shared),
    so a turn that emits nothing follows as empty while another streams."""
    async with Supervisor(workers=3, spares=0) as sup:
        with anyio.fail_after(120):
            streaming = await sup.submit("tests.agents.turncpu:emits", 5)
            quiet = await sup.submit("tests.agents.turncpu:emits", 0)
            parent = await sup.submit("tests.agents.turncpu:two_children")
            got = [e async for e in streaming.events()]
            none = [e async for e in quiet.events()]
            rp = await parent.result()
            rs = await streaming.result()
            rq = await quiet.result()
    assert got == [{"i": i} for i in range(5)] and rs.output == 5
    assert none == [] and rq.output == 0
    assert rp.outcome == "completed" and rp.output == ["completed", "completed"]
    # The shared empties: one value for every record, still empty, and a write to one raises.
    records = [
        TurnRecord(
            turn_id=f"r{i}",
            agent="m:a",
            input=msgspec.Raw(b"\xc0"),
            session=None,
            parent=None,
            timeout=None,
            grace=1.0,
            kill_after=1.0,
            now=0.0,
        )
        for i in range(2)
    ]
    a, b = records
    assert a.events is b.events and a.waiters is b.waiters and a.children is b.children
    assert len(a.events) == 0 and len(a.waiters) == 0 and len(a.children) == 0
    with pytest.raises(AttributeError):
        a.events.append(msgspec.Raw(b"\xc0"))
    with pytest.raises(AttributeError):
        a.children.add("x")
    a.add_child("c1")
    assert a.children == {"c1"} and len(b.children) == 0


@pytest.mark.parametrize("agent", ["examples.agents:crasher", "examples.agents:stubborn"])
async def test_waiters_of_a_crashed_or_killed_turn_each_get_its_one_outcome(agent: str) -> None:
    """API-BARE-FUTURE, MEM-LEAN: ``result()`` waits on a future of its own, and the record drops the
    waiters' list once set. Several ``result()`` waiters that started before the end (fifty
    more cancelled while waiting, which leave nothing behind) and a
    ``result()`` after the end all see the turn's one outcome - ``crashed`` for a worker that
    dies on its own, ``killed`` for one that ignores its cancel - and the next turn runs."""
    async with Supervisor(workers=1, spares=0, grace=0.2, kill_after=0.2) as sup:
        with anyio.fail_after(120):
            handle = await sup.submit(agent)
            got: list[object] = []

            async def wait_result() -> None:
                got.append(await handle.result())

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(wait_result)
                with anyio.move_on_after(0):  # (the crasher's result may already be out)
                    await handle.result()
                if agent.endswith("stubborn"):  # runs until cancelled: every wait below waits
                    for _ in range(50):  # cancelled at their first wait: only they end
                        with anyio.move_on_after(0) as gone:
                            await handle.result()
                        assert gone.cancelled_caught
                    # API-BARE-FUTURE: a cancelled wait leaves nothing behind; the three live ones wait.
                    (record,) = [r for r in sup.records() if r.id == handle.turn_id]
                    assert record.done is not None and len(record.done) == 3
                if agent.endswith("stubborn"):
                    first = await first_event(handle)  # running (a crasher may die before its
                    await handle.cancel()  # event leaves: ZeroMQ sends after the call returns)
            again = await handle.result()
            nxt = await sup.run("examples.agents:echo", 7)
    want = "crashed" if agent.endswith("crasher") else "killed"
    assert again.outcome == want, again
    assert len(got) == 3 and all(r == again for r in got)
    if agent.endswith("stubborn"):
        assert first.get("type") == "started"
    assert nxt.outcome == "completed" and nxt.output == 7


async def test_an_evicted_turn_stays_reachable_exactly_while_something_holds_it() -> None:
    """MEM-LEAN: an ended turn pushed out of ``keep_results`` is weakly held only when something
    else still refers to it. A turn whose handle is kept still answers by id and gives its
    result; one nobody holds is forgotten at once (``UnknownTurn``), as the bound promises."""
    async with Supervisor(workers=1, spares=0, keep_results=2) as sup:
        with anyio.fail_after(60):
            kept = await sup.submit("examples.agents:echo", "kept")
            dropped_id = (await sup.submit("examples.agents:echo", "dropped")).turn_id
            await kept.result()
            for i in range(6):  # pushes both out of the last two kept
                await sup.run("examples.agents:echo", i)
            assert (await sup.handle(kept.turn_id).result()).output == "kept"
            with pytest.raises(UnknownTurn):
                sup.handle(dropped_id)
