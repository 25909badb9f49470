"""A turn is measured against ``max_rss_mb`` with its own memory, not with what the turns before it
left in their worker (MEM-TRIM, MEM-RETIRE).

Attacks, each on a real pool with the memory watchdog on: turns that build hundreds of MiB and drop
them (``malloc`` keeps the pages: before, the next turn on that worker started at ≈ 300 MiB and was
cancelled for memory it never allocated), twice in a row so that the second reuses what the first
freed; and a turn that keeps its memory in a module cache past the limit, with turns handed ahead to
its worker (before, each of them ran on it and was cancelled for the cache).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import psutil
import pytest

from supervisor import Supervisor

pytestmark = pytest.mark.anyio

ROOT = str(Path(__file__).resolve().parents[1])

# Watchdog ticks a turn under the limit runs through without a cancel (20 × 0.05 s).
QUIET_TICKS = 20
RSS_INTERVAL = 0.05


async def _events(handle: Any, count: int, bound: float = 60.0) -> list[Any]:
    """The turn's first ``count`` events (bounded)."""
    got: list[Any] = []
    with anyio.fail_after(bound):
        async with aclosing(handle.events()) as events:
            async for event in events:
                got.append(event)
                if len(got) == count:
                    return got
    raise AssertionError(f"the turn ended after {len(got)} events")


async def _not_cancelled_while_it_holds(handle: Any) -> None:
    """The turn has allocated (its second event) and is under the limit: no watchdog tick in
    ``QUIET_TICKS`` cancels it; then it is cancelled by the user and says so."""
    with anyio.move_on_after(QUIET_TICKS * RSS_INTERVAL):
        result = await handle.result()
        raise AssertionError(f"ended on its own while under the limit: {result.outcome} {result.cause}")
    assert await handle.cancel() == {"kind": "user"}
    with anyio.fail_after(60):
        result = await handle.result()
    assert result.cause == {"kind": "user"}, result


async def test_a_turn_does_not_start_with_the_memory_the_turns_before_it_freed() -> None:
    """Two turns each build ≈ 250 MiB on one worker and drop it (the second reusing the pages the
    first freed). The next turn on that same worker starts with the memory handed back, so its own
    100 MiB keep it under a 330 MiB limit: before MEM-TRIM it started at ≈ 290 MiB and was cancelled
    for memory within a watchdog tick."""
    async with Supervisor(workers=1, spares=0, max_rss_mb=330, rss_interval=RSS_INTERVAL) as sup:
        with anyio.fail_after(120):
            built = [await sup.run("tests.agents.memory:build_and_drop", {"mb": 240}) for _ in range(2)]
        for result in built:
            assert result.outcome == "completed" and result.cause is None, result
            # The premise: malloc kept what the turn dropped (measured inside the turn, before any trim).
            assert result.output["after_mb"] > 0.7 * result.output["peak_mb"], result.output
        handle = await sup.submit("tests.agents.memory:allocate_and_wait", {"mb": 100})
        start, allocated = await _events(handle, 2)
        assert start["pid"] == built[0].worker_pid == built[1].worker_pid  # the same worker
        assert start["start_mb"] < 120, (start, [r.output for r in built])
        assert allocated["rss_mb"] < 250, allocated
        await _not_cancelled_while_it_holds(handle)


async def test_a_worker_that_keeps_memory_past_the_limit_is_replaced_before_its_next_turn() -> None:
    """A turn puts 250 MiB in a module cache (in use: nothing to hand back) and is cancelled for memory
    under a 200 MiB limit; it ends cooperatively, its worker alive. Turns submitted while it ran
    (handed ahead to that worker) are revoked and run on a fresh worker, each starting small and
    none cancelled for memory; the worker with the cache is retired and gone."""
    async with Supervisor(workers=1, spares=0, max_rss_mb=200, rss_interval=RSS_INTERVAL, grace=30) as sup:
        hog = await sup.submit("tests.agents.memory:grow_cache", {"mb": 250})
        (grown,) = await _events(hog, 1)
        after = [await sup.submit("tests.agents.memory:allocate_and_wait", {"mb": 10}) for _ in range(2)]
        with anyio.fail_after(60):
            result = await hog.result()
        assert result.cause == {"kind": "memory"} and result.outcome in ("aborted", "completed"), result
        assert result.worker_pid == grown["pid"]
        for handle in after:
            start, _ = await _events(handle, 2)
            assert start["pid"] != grown["pid"], "ran on the worker that kept 250 MiB"
            assert start["start_mb"] < 120, start
            await _not_cancelled_while_it_holds(handle)
        # Retired (not killed: nothing escalated) and reaped by the pool: its pid is gone.
        with contextlib.suppress(psutil.NoSuchProcess):  # gone already
            await anyio.to_thread.run_sync(psutil.Process(grown["pid"]).wait, 60)  # TimeoutExpired if not
        assert grown["pid"] not in [w["pid"] for w in (await sup.status())["workers"]]


_KEEPER_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import os
from worker.lowlevel import HeapKeeper

def resident_bytes():
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def mib(n):
    return round(n / 2**20, 1)

keeper = HeapKeeper()
steps = {"start": mib(resident_bytes())}
held = [bytes(1000) for _ in range(150 * 2**20 // 1000)]
steps["in_use_due"] = keeper.due()  # grown, all of it in use: nothing to hand back
steps["in_use"] = mib(resident_bytes())
pin = []
for i, _ in enumerate(held):
    if i % 64 == 0:
        pin.append(bytes(600))  # interleaved survivors: malloc cannot give the heap's top back
del held
steps["freed"] = mib(resident_bytes())
steps["freed_due"] = keeper.due()
keeper.trim_now()
steps["trimmed"] = mib(resident_bytes())
steps["after_trim_due"] = keeper.due()
print(json.dumps(steps))
"""


async def test_the_heap_keeper_trims_what_was_freed_and_never_what_is_in_use() -> None:
    """MEM-TRIM's rule on its own, in a fresh process: 150 MiB in use is not due; freed (with small
    survivors between, as a cache leaves them) it stays resident and is due; one trim hands it
    back, and right after it nothing is due."""
    proc = await anyio.run_process([sys.executable, "-c", _KEEPER_PROBE, ROOT], stderr=subprocess.STDOUT)
    steps = json.loads(proc.stdout)
    print(steps)
    assert steps["in_use"] - steps["start"] > 120 and steps["in_use_due"] is False, steps
    assert steps["freed"] - steps["start"] > 100, f"the premise: malloc kept what was freed: {steps}"
    assert steps["freed_due"] is True, steps
    assert steps["freed"] - steps["trimmed"] > 90, steps
    assert steps["after_trim_due"] is False, steps
