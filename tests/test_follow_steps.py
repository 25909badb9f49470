"""How often the daemon's follower task runs per event it sends (CLIENT-ONE-STEP).

The daemon's own follower (``Requests._follow``) on a real ``TurnRecord``/``TurnTable`` and client
table, its replies collected from ``send``; its task's steps counted by a coroutine that wraps it.
With hundreds of turns each followed by one client, every task step is a loop pass the daemon pays
per event: a follower must run once per wake-up, and send all that is ready in that one step.
"""

from __future__ import annotations

import anyio
import pytest

from tests.support.followkit import Rig
from wire import client_link

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("window", [0, 256])
async def test_a_follower_of_events_that_come_one_at_a_time_runs_once_per_event(window: int) -> None:
    """Each event arrives alone (as a ticking agent's do): the follower wakes, sends it, and waits
    again in that same step. Attacks the follower that sent, yielded, then came back only to find
    nothing and wait: two task steps per event, so 384 followed turns cost the daemon twice the loop
    passes per event."""
    rig = Rig(window)
    counted, task = rig.start()
    await rig.until_sent(0)
    await anyio.sleep(0.01)  # allowed: the follower reaches its first wait (there is no event for it)
    n = 40
    before = counted.steps
    for i in range(n):
        await anyio.sleep(0.006)  # allowed: paces the events past COALESCE, as a ticking agent's are
        rig.emit(1)
        await rig.until_sent(i + 1)
        if window:
            rig.stream.grant(1)  # the client reads each event: its window never runs dry
    steps = counted.steps - before
    await rig.end(task)
    assert rig.events_sent() == n
    assert [m.seq for m in rig.frames if isinstance(m, client_link.Events)] == list(range(n))
    assert isinstance(rig.frames[-1], client_link.FollowEnd)
    assert steps <= n + 2, f"{steps} follower steps for {n} events sent one at a time"


async def test_a_follower_sends_what_is_queued_in_one_batch_per_wake_up() -> None:
    """500 events queued at once: one frame, sent in the step the follower woke in."""
    rig = Rig(0)
    counted, task = rig.start()
    await anyio.sleep(0.01)  # allowed: the follower reaches its first wait (there is no event for it)
    before = counted.steps
    rig.emit(500)
    await rig.until_sent(500)
    await anyio.sleep(0.01)  # allowed: lets a follower that would run again do so before counting
    steps = counted.steps - before
    await rig.end(task)
    events = [m for m in rig.frames if isinstance(m, client_link.Events)]
    assert [len(m.data) for m in events] == [500]
    assert steps == 1, f"{steps} follower steps for one batch"
