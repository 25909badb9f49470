"""Waiting for a process's memory to come back (MEM-TRIM: the daemon hands freed memory back to the
system once a second, so one reading right after a burst measures the allocator, not what is held)."""

from __future__ import annotations

import anyio
import psutil


async def rss_under(proc: psutil.Process, below: int, limit: float = 30.0) -> int:
    """Wait (bounded by ``limit``) until ``proc``'s RSS is under ``below``; returns it, or the last
    reading when it never came, for the caller's assertion to report."""
    with anyio.move_on_after(limit):
        while True:
            rss = proc.memory_info().rss
            if rss < below:
                return rss
            await anyio.sleep(0.1)  # allowed: pacing a bounded poll of a process's memory (no event)
    return proc.memory_info().rss
