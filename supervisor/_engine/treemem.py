"""MEM-STATUS-SAMPLE: the workers' memory as ``status()`` reports it, without reading /proc for every
process of a large pool on every call.

Each worker's entry in ``status()`` carries its tree's summed RSS and PSS. Read on every call,
that cost a /proc walk per process (and, for the RSS, a psutil scan of every process on the
machine per worker): 0.3 s for 16 workers on a loaded machine, seconds for 1,000. Now the RSS
comes from each tree process's ``statm`` (the tree listed from its cgroup or its /proc children,
as the PSS was), and for a pool above ``SYNC_WORKERS`` workers the figures are those of the last
sample, taken in a worker thread when the previous one is more than ``REFRESH`` seconds old (and has
paid for itself: MEM-STATUS-SHARE below) or a worker is not in it; such a worker, measured alone,
reports 0 until its figures land (measuring it at once cost the first call of a 1,000-worker daemon
2.6 s). A pool of ``SYNC_WORKERS`` or fewer is measured on every call, as before. The memory limit
(``max_rss_mb``) has its own, exact, measurement.

MEM-STATUS-SHARE: a sample costs about 2.4 ms of CPU per worker on the loaded 2-core machine (its tree
listed, then ``statm`` and ``smaps_rollup`` - a page-table walk - for each process): 2.4 s at 1,000
workers, half of all the daemon's CPU when a status() every few seconds kept one running, in the
daemon's own process and under its GIL. So a whole sample is taken again only once ``1 / SHARE`` times
its own CPU time has passed since the last one (and at least ``REFRESH``): it never takes more than
``SHARE`` of one CPU, whatever the pool's size or how often status() is asked - the figures of a
1,000-worker pool are then up to about 50 s old there, a 100-worker pool's about 5 s. A worker not in
the sample (new since) is measured alone, in the background, at the next call.
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
REFRESH = 2.0  # seconds: a sample older than this is taken again (in a thread) by the next call...
SHARE = 0.05  # ... and older than its own CPU time / SHARE (MEM-STATUS-SHARE)
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
    """The workers' memory for ``status()``, owned by the pool (``WorkerPool.memory``); ``cpu_clock``: the
    sampling thread's CPU clock (MEM-STATUS-SHARE)."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, cpu_clock: Callable[[], float] = time.thread_time
    ) -> None:
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._cache: dict[int, Figures] = {}
        self._at = -math.inf
        self._due = REFRESH  # seconds after ``_at`` that the next whole sample is due
        self._busy = False

    def figures(self, pids: list[int], spawn: Callable[..., Any] | None = None) -> dict[int, Figures]:
        """``measure``'s figures of each worker in ``pids``; ``spawn(fn, *args)`` starts a task (the pool's
        task group) for a background sample, or None to measure everything now."""
        if len(pids) <= SYNC_WORKERS or spawn is None:
            return {pid: measure(pid) for pid in pids}
        cache = self._cache
        missing = [pid for pid in pids if pid not in cache]
        if not self._busy:
            if self._clock() - self._at > self._due:
                self._busy = True
                spawn(self._sample, list(pids), False)
            elif missing:
                self._busy = True
                spawn(self._sample, missing, True)  # only the workers new since (MEM-STATUS-SHARE)
        # The sample itself when it has every worker (it is replaced whole, never changed): no copy
        # of a thousand entries on every call.
        return {pid: cache.get(pid, UNKNOWN) for pid in pids} if missing else cache

    async def _sample(self, pids: list[int], added: bool) -> None:
        try:
            fresh, cost = await anyio.to_thread.run_sync(self._measure, pids)
            if added:
                self._cache = {**self._cache, **fresh}  # a new dict: callers may hold the old one
            else:
                self._cache = fresh  # (workers gone since are dropped with the old sample)
                self._at = self._clock()
                self._due = max(REFRESH, cost / SHARE)
        finally:
            self._busy = False

    def _measure(self, pids: list[int]) -> tuple[dict[int, Figures], float]:
        """(the figures of ``pids``, the CPU time they took): in the sampling thread."""
        start = self._cpu_clock()
        fresh = {pid: measure(pid) for pid in pids}
        return fresh, self._cpu_clock() - start
