"""One task that fires every deadline: grace, kill_after, timeout.

A heap of entries and a single sleeper that wakes for the earliest one, instead of a task
per running turn. Cancelling an entry marks it dead; it is dropped when it reaches the top.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import anyio


class Timer:
    __slots__ = ("when", "seq", "fn", "args", "active")

    def __init__(self, when: float, seq: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.when = when
        self.seq = seq
        self.fn = fn
        self.args = args
        self.active = True

    def cancel(self) -> None:
        self.active = False

    def __lt__(self, other: Timer) -> bool:
        return (self.when, self.seq) < (other.when, other.seq)


class Timers:
    """``clock`` is the owner's event-loop clock. Timers are armed from loop callbacks too (a
    reader callback, a journal commit handed over from its thread), where anyio cannot tell which
    event loop runs (``anyio.current_time()`` raises there): the supervisor sets its loop's
    ``time`` once it runs."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock: Callable[[], float] = clock or anyio.current_time
        self._heap: list[Timer] = []
        self._seq = itertools.count()
        self._wake = anyio.Event()

    def call_at(self, when: float, fn: Callable[..., Any], *args: Any) -> Timer:
        timer = Timer(when, next(self._seq), fn, args)
        heapq.heappush(self._heap, timer)
        if self._heap[0] is timer:
            self._wake.set()
        return timer

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer:
        return self.call_at(self.clock() + delay, fn, *args)

    async def run(self) -> None:
        heap = self._heap
        while True:
            while heap and not heap[0].active:
                heapq.heappop(heap)
            if not heap:
                await self._wake.wait()
                self._wake = anyio.Event()
                continue
            delay = heap[0].when - self.clock()
            if delay > 0:
                with anyio.move_on_after(delay):
                    await self._wake.wait()
                if self._wake.is_set():
                    self._wake = anyio.Event()
                continue
            timer = heapq.heappop(heap)
            if timer.active:
                timer.active = False
                timer.fn(*timer.args)
