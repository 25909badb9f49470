"""MEM-STATUS-SAMPLE: the workers' memory as ``status()`` reports it, without reading /proc for every
process of a large pool on every call.

Each worker's entry in ``status()`` carries its tree's summed RSS and PSS. Read on every call,
that cost a /proc walk per process (and, for the RSS, a psutil scan of every process on the
machine per worker): 0.3 s for 16 workers on a loaded machine, seconds for 1,000. Now the RSS
comes from each tree process's ``statm`` (the tree listed from its cgroup or its /proc children,
as the PSS was), and for a pool above ``SYNC_WORKERS`` workers the figures are those of the last
sample, taken in a worker thread when the previous one is more than ``REFRESH`` seconds old or a
worker is not in it; such a worker reports 0 until the sample lands (measuring it at once cost the
first call of a 1,000-worker daemon 2.6 s). A pool of ``SYNC_WORKERS`` or fewer is measured on
every call, as before. The memory limit (``max_rss_mb``) has its own, exact, measurement.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from worker import proctree

from . import procs as _procs

SYNC_WORKERS = 64  # pools up to this size are measured on every status() call
REFRESH = 2.0  # seconds: a sample older than this is taken again (in a thread) by the next call
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


# (RSS bytes, RSS MiB, PSS bytes, PSS MiB) of a worker's tree as status() shows them; these: not known.
Figures = tuple[int, float, int, float]
UNKNOWN: Figures = (0, 0.0, 0, 0.0)


def measure(pid: int) -> Figures:
    """(summed RSS, its MiB, PSS, its MiB) of worker ``pid``'s tree: bytes, and MiB rounded to 0.1 here,
    once per sample, not on every status() call (two ``round`` per worker were 2.3 of the 2.9 ms its
    1,000 entries cost); zeros when it cannot be read now."""
    try:
        pids = _procs.tree_pids(pid)
        rss, pss = rss_bytes(pids), proctree.cgroup_pss_bytes(pids)
    except OSError:  # no descriptor free to read /proc (WORKER-FD-RETRY): unknown now
        return UNKNOWN
    return rss, round(rss / 1048576, 1), pss, round(pss / 1048576, 1)


class TreeMemory:
    """The workers' memory for ``status()``, owned by the pool (``WorkerPool.memory``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cache: dict[int, Figures] = {}
        self._at = -math.inf
        self._busy = False

    def figures(self, pids: list[int], spawn: Callable[..., Any] | None = None) -> dict[int, Figures]:
        """``measure``'s figures of each worker in ``pids``; ``spawn(fn, *args)`` starts a task (the pool's
        task group) for a background sample, or None to measure everything now."""
        if len(pids) <= SYNC_WORKERS or spawn is None:
            return {pid: measure(pid) for pid in pids}
        cache = self._cache
        complete = all(pid in cache for pid in pids)
        if not self._busy and (not complete or self._clock() - self._at > REFRESH):
            self._busy = True
            spawn(self._sample, list(pids))
        # The sample itself when it has every worker (it is replaced whole, never changed): no copy
        # of a thousand entries on every call.
        return cache if complete else {pid: cache.get(pid, UNKNOWN) for pid in pids}

    async def _sample(self, pids: list[int]) -> None:
        try:
            fresh = await anyio.to_thread.run_sync(lambda: {pid: measure(pid) for pid in pids})
            self._cache = fresh  # (workers gone since are dropped with the old sample)
            self._at = self._clock()
        finally:
            self._busy = False
