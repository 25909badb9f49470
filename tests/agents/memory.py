"""Agents that leave memory behind in their worker (``tests.agents.memory:NAME``), for
``tests/test_memory_kept.py`` (MEM-TRIM, MEM-RETIRE)."""

from __future__ import annotations

import os
from typing import Any

import worker

_CACHE: list[Any] = []  # what a module-level cache, a pool or a leak would hold across turns


def rss_mb() -> float:
    """This process's resident set size in MiB."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _touched(mb: int) -> bytearray:
    block = bytearray(mb * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return block


async def build_and_drop(turn: worker.Turn) -> dict[str, float]:
    """Builds ``mb`` MiB of 1,000-byte objects, keeping one small object of every 64 in the module's
    cache (as a cache or a connection pool would), then drops the rest and returns. ``malloc`` keeps
    the pages it got: the worker stays resident at about its peak."""
    big = []
    for i in range(int(turn.input["mb"]) * 2**20 // 1000):
        big.append(bytes(1000))
        if i % 64 == 0:
            _CACHE.append(bytes(600))
    peak = rss_mb()
    del big
    return {"peak_mb": peak, "after_mb": rss_mb()}


async def grow_cache(turn: worker.Turn) -> dict[str, float]:
    """Keeps ``mb`` MiB in the module's cache (in use: nothing to hand back), says so, and returns
    once it is cancelled (cooperatively: no escalation)."""
    _CACHE.append(_touched(int(turn.input["mb"])))
    await turn.emit({"rss_mb": rss_mb(), "pid": os.getpid()})
    await turn.signal.wait()
    return {"rss_mb": rss_mb()}


async def allocate_and_wait(turn: worker.Turn) -> dict[str, float]:
    """Says how much its worker holds as it starts, allocates ``mb`` MiB, says so, and waits until
    it is cancelled; returns what it saw."""
    start = rss_mb()
    await turn.emit({"start_mb": start, "pid": os.getpid()})
    block = _touched(int(turn.input.get("mb", 0)))
    await turn.emit({"allocated_mb": len(block) / 2**20, "rss_mb": rss_mb()})
    await turn.signal.wait()
    return {"start_mb": start}


def private_dirty_kib() -> int:
    """This process's private dirty memory in KiB (``smaps_rollup``): what it wrote since its fork."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1])
    raise RuntimeError("no Private_Dirty in smaps_rollup")


async def full_collection(turn: worker.Turn) -> dict[str, int]:
    """Runs a full garbage collection, as a long-lived worker's collector eventually does by itself,
    and says how much more memory its process then holds privately (KiB)."""
    import gc

    before = private_dirty_kib()
    gc.collect()
    return {"before_kib": before, "after_kib": private_dirty_kib()}
