"""Event streams under load (issue 16): what a waiting streaming turn costs its worker, so that a
pool of them leaves the CPUs to the supervisor that delivers their events (docs/design.md WORKER-PARK),
and a follower that keeps up with a flood gets every event (EVENTS-KEEP, docs/guarantees.md)."""

from __future__ import annotations

import os
from contextlib import aclosing
from typing import Any

import anyio
import pytest

from supervisor import Client, EventsDropped, Supervisor
from supervisor.lowlevel import HOLD_BYTES
from tests.support.daemonkit import FAST, serving
from tests.support.events import assert_accounted

pytestmark = pytest.mark.anyio

BOUND = 60


async def test_a_turn_waiting_between_emits_leaves_the_watcher_thread_asleep() -> None:
    """WORKER-PARK: a turn that emits every 20 ms and waits in between (an LLM turn streaming deltas)
    gives its worker's watcher thread (stale flusher, LADDER-EARLY) nothing to do: the thread sleeps until
    a batch is posted instead of waking every 5 ms tick while the turn runs. 50 events over a
    second: before, ≈ 200 wake-ups; now ≈ 20 (50 ms of ticks after the turn's start and after each
    heartbeat's batch)."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0) as sup:
            result = await sup.run("tests.agents.stream_load:slow_stream", {"n": 50, "period": 0.02})
    assert result.outcome == "completed", result
    assert result.output["wakes"] < 80, result.output


async def test_heartbeats_leave_the_watcher_thread_asleep() -> None:
    """WORKER-HEARTBEAT-NOW: a worker's heartbeat leaves at once instead of beginning a batch, so it
    never wakes the parked watcher thread (WORKER-PARK) for its ticks. With a heartbeat every 20 ms
    and a turn that waits between its events for a second, the thread stayed awake the whole time
    before (≈ 200 wake-ups: each heartbeat's batch restarted its 50 ms of ticks); now it sleeps."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0, heartbeat=0.02) as sup:
            result = await sup.run("tests.agents.stream_load:slow_stream", {"n": 25, "period": 0.04})
    assert result.outcome == "completed", result
    assert result.output["wakes"] < 40, result.output


async def _read_all(handle: Any) -> tuple[list[int], list[EventsDropped]]:
    got: list[int] = []
    markers: list[EventsDropped] = []
    async with aclosing(handle.events()) as events:
        async for event in events:
            if isinstance(event, EventsDropped):
                markers.append(event)
            else:
                got.append(event["i"])
    return got, markers


async def test_a_client_follower_reading_a_flood_as_fast_as_it_can_gets_every_event() -> None:
    """EVENTS-KEEP: one turn emits 200,000 small events as fast as ``emit`` allows (faster than a
    ``Client`` can take them for stretches: the worker, the daemon and the client share 2 cores),
    through a daemon with the default 10,000-event buffer. The follower reads the whole time, so it
    keeps up in the documented sense (it takes events while the buffer fills): it gets all 200,000,
    in order, and no ``EventsDropped``. Before, it received 73-176k of them."""
    n = 200_000
    with serving(*FAST, "--no-journal") as d:
        async with Client.connect(d.endpoint, timeout=60) as client:
            handle = await client.submit("tests.agents.stream:burst", {"n": n})
            with anyio.fail_after(BOUND * 4):
                got, markers = await _read_all(handle)
                result = await handle.result()
    assert result.outcome == "completed", result
    assert markers == [], markers[:3]
    assert len(got) == n and got == list(range(n))


async def test_an_embedded_follower_reading_a_flood_as_fast_as_it_can_gets_every_event() -> None:
    """EVENTS-KEEP, embedded: the same 200,000-event flood with the default buffer, followed by
    ``handle.events()`` in the supervisor's own process: every event, in order, no marker."""
    n = 200_000
    async with Supervisor(workers=1, spares=0) as sup:
        handle = await sup.submit("tests.agents.stream:burst", {"n": n})
        with anyio.fail_after(BOUND * 4):
            got, markers = await _read_all(handle)
            result = await handle.result()
    assert result.outcome == "completed", result
    assert markers == [], markers[:3]
    assert got == list(range(n))


async def test_a_follower_that_reads_slower_than_the_agent_holds_at_most_hold_bytes() -> None:
    """EVENTS-KEEP's bound: a follower that keeps reading, but far slower than the agent, holds the
    turn's buffer past ``max_events`` only up to ``HOLD_BYTES``: 4,000 events of 16 KiB (64 MiB)
    with a 100-event buffer leave at most 32 MiB (+ one event) kept; the follower is told exactly
    what it missed (each ``EventsDropped`` where its events stop being contiguous, received +
    dropped = emitted, in order)."""
    n, size = 4_000, 16 * 1024
    items: list[Any] = []
    async with Supervisor(workers=1, spares=0, max_events=100) as sup:
        handle = await sup.submit("tests.agents.stream_load:big_then_wait", {"n": n, "size": size})
        with anyio.fail_after(BOUND * 2):
            async with aclosing(handle.events()) as events:
                async for event in events:
                    items.append(event if isinstance(event, EventsDropped) else event["i"])
                    if sup.turn_info(handle.turn_id)["events"] >= n:
                        break
                    await anyio.sleep(0.001)  # allowed: the follower's behaviour (it reads slowly)
                record = sup.record(handle.turn_id)
                assert record.events_bytes <= HOLD_BYTES + size + 1024, record.events_bytes
                assert len(record.events) < n
                await handle.cancel()
                items.extend([e if isinstance(e, EventsDropped) else e["i"] async for e in events])
            await handle.result()
    assert any(isinstance(i, EventsDropped) for i in items), "64 MiB behind: it loses events, and is told"
    assert_accounted(items, n)


async def test_workers_run_at_the_worker_nice_they_were_given() -> None:
    """WORKER-NICE: ``Supervisor(worker_nice=10)`` runs every worker below the supervisor: the worker's
    threads and its session's autogroup (each worker leads a session, so without this the kernel
    gives each worker as large a share of the CPUs as its supervisor) at niceness 10. The default
    leaves them alone; a bad value is refused at the call."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0, worker_nice=10) as sup:
            got = (await sup.run("tests.agents.stream_load:niceness")).output
        async with Supervisor(workers=1, spares=0) as sup:
            default = (await sup.run("tests.agents.stream_load:niceness")).output
    assert got["nice"] == 10, got
    assert got["autogroup"] in (None, 10), got
    assert default["nice"] == os.getpriority(os.PRIO_PROCESS, 0), default
    for bad in (-1, 20, 1.5, True, "5"):
        with pytest.raises((TypeError, ValueError), match="worker_nice"):
            Supervisor(worker_nice=bad)
