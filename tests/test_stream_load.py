"""Many streaming turns at once (issue 16, the 200-streams row): what a waiting streaming turn
costs its worker, so that a pool of them leaves the CPUs to the supervisor that delivers their
events (docs/design.md S-PARK)."""

from __future__ import annotations

import anyio
import pytest

from supervisor import Supervisor

pytestmark = pytest.mark.anyio

BOUND = 60


async def test_a_turn_waiting_between_emits_leaves_the_watcher_thread_asleep() -> None:
    """S-PARK: a turn that emits every 20 ms and waits in between (an LLM turn streaming deltas)
    gives its worker's watcher thread (stale flusher, S1) nothing to do: the thread sleeps until
    a batch is posted instead of waking every 5 ms tick while the turn runs. 50 events over a
    second: before, ≈ 200 wake-ups; now a handful (the heartbeat's batch wakes it)."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0) as sup:
            result = await sup.run("tests.agents.stream_load:slow_stream", {"n": 50, "period": 0.02})
    assert result.outcome == "completed", result
    assert result.output["wakes"] < 40, result.output
