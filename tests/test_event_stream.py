"""Event streams to an embedded follower: every event to a follower that keeps up, in order, and an
explicit ``EventsDropped`` marker exactly where a follower that fell behind lost events."""

from __future__ import annotations

import anyio
import pytest

from supervisor import EventsDropped, Supervisor

pytestmark = pytest.mark.anyio


async def test_follower_that_keeps_up_gets_every_event_in_order() -> None:
    """A follower reading the whole time gets every one of a fast burst, in order, no marker.

    Attacks LINK-FAIR: the worker link once handled every frame it could read in one callback, so
    while a worker streamed faster than the supervisor read, the follower's task never ran and
    the per-turn buffer overflowed under it (a reader missed events it was there for)."""
    n = 60_000
    async with Supervisor(workers=1, spares=0, max_events=2_000) as sup:
        handle = await sup.submit("tests.agents.stream:burst", {"n": n})
        with anyio.fail_after(120):
            got = [event async for event in handle.events()]
            result = await handle.result()
    assert result.outcome == "completed", result
    markers = [e for e in got if isinstance(e, EventsDropped)]
    assert markers == []
    assert [e["i"] for e in got] == list(range(n))


async def test_gap_marker_stands_where_a_slow_follower_lost_events() -> None:
    """A follower that stops reading while the turn emits far more than the buffer gets one
    ``EventsDropped`` whose ``count`` and ``first`` say exactly which events it lost, then the rest
    in order; a late follower gets one at the start (EVENTS-DROPPED)."""
    n, keep = 10_000, 1_000
    async with Supervisor(workers=1, spares=0, max_events=keep) as sup:
        handle = await sup.submit("tests.agents.stream:burst_then_wait", {"n": n})
        got: list[object] = []
        with anyio.fail_after(120):
            events = handle.events()
            got.append(await events.__anext__())  # the first event, then it stops reading
            while sup.turn_info(handle.turn_id)["events"] < n:  # noqa: ASYNC110 - waits on the turn's own count
                await anyio.sleep(0.01)  # allowed: polling the turn's state with a bound, not a timing
            late = handle.events()
            late_first = await late.__anext__()
            await handle.cancel()
            got += [e async for e in events]
            rest = [e async for e in late]
            await handle.result()
    assert got[0] == {"i": 0}
    assert isinstance(got[1], EventsDropped), got[:3]
    marker = got[1]
    assert marker.first == 1 and marker.count >= 1
    tail = got[2:]
    assert not any(isinstance(e, EventsDropped) for e in tail)
    assert [e["i"] for e in tail] == list(range(1 + marker.count, n))  # type: ignore[index]
    assert isinstance(late_first, EventsDropped) and late_first.first == 0
    assert [e["i"] for e in rest] == list(range(late_first.count, n))  # type: ignore[index]


async def test_follower_behind_but_within_the_buffer_gets_no_marker() -> None:
    """A follower that lags behind by less than the buffer loses nothing and sees no marker: the
    marker is never yielded where no event was dropped."""
    n = 400
    async with Supervisor(workers=1, spares=0, max_events=1_000) as sup:
        handle = await sup.submit("tests.agents.stream:burst_then_wait", {"n": n})
        with anyio.fail_after(60):
            while sup.turn_info(handle.turn_id)["events"] < n:  # noqa: ASYNC110 - waits on the turn's own count
                await anyio.sleep(0.01)  # allowed: polling the turn's state with a bound, not a timing
            await handle.cancel()
            got = [e async for e in handle.events()]
            await handle.result()
    assert [e["i"] for e in got] == list(range(n))


async def test_a_turn_that_only_emits_still_sees_its_abort() -> None:
    """A turn that does nothing but emit (``emit`` yields to the loop at most once a millisecond
    now, EVENTS-EMIT-NOW) still learns of its cancel: the Abort is read within a millisecond of the
    emits, ``turn.signal`` shows it, and the turn ends ``aborted`` long before any escalation."""
    async with Supervisor(workers=1, spares=0, grace=30) as sup:
        handle = await sup.submit("tests.agents.stream:emit_while_cancelled")
        with anyio.fail_after(60):
            async for _ in handle.events():
                break
            await handle.cancel()
            result = await handle.result()
    assert result.outcome == "aborted", result
    assert sup.escalations == {}
