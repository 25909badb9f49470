"""The engine's timers (grace, kill-after, deadlines) fire in time order, never early, and a
cancelled one never fires — through the timerfd (LADDER-TIMERFD) and through the loop's own timeout
(the path taken when the owner's clock is not CLOCK_MONOTONIC)."""

from __future__ import annotations

import time

import anyio
import pytest

from supervisor.lowlevel import Timers

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the engine runs on asyncio only


@pytest.mark.parametrize("precise", [True, False], ids=["timerfd", "loop-timeout"])
async def test_timers_fire_in_order_never_early_and_cancelled_ones_never(precise: bool) -> None:
    timers = Timers(time.monotonic)
    timers.precise = precise
    fired: list[tuple[str, float]] = []
    done = anyio.Event()

    def note(name: str) -> None:
        fired.append((name, time.monotonic()))
        if name == "last":
            done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(timers.run)
        t0 = time.monotonic()
        timers.call_later(0.06, note, "last")
        timers.call_later(0.02, note, "first")
        dropped = timers.call_later(0.04, note, "cancelled")
        timers.call_later(0.04, note, "second")
        dropped.cancel()
        with anyio.fail_after(10):
            await done.wait()
        tg.cancel_scope.cancel()
    assert [name for name, _ in fired] == ["first", "second", "last"]
    for (name, at), due in zip(fired, (0.02, 0.04, 0.06), strict=True):
        assert at - t0 >= due - 0.001, (name, at - t0)
