"""One task that fires every deadline: grace, kill_after, timeout.

A heap of entries and a single sleeper that wakes for the earliest one, instead of a task
per running turn. Cancelling an entry marks it dead; it is dropped when it reaches the top.

LADDER-TIMERFD: the sleeper wakes through a ``timerfd`` (Linux) armed at the earliest deadline, in
nanoseconds. The event loop's own timeout goes through ``epoll_wait``, whose unit is the
millisecond, rounded up: a grace of 50 ms fired 0.4-1 ms late (measured), which was a tenth of a
kill's whole overshoot. Elsewhere (or if the timerfd cannot be made) the loop's timeout is used.
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio

log = logging.getLogger("turnpool.supervisor")

_CLOCK_MONOTONIC = 1  # what time.monotonic() and asyncio's loop.time() read
_TFD_CLOEXEC = 0o2000000
_TFD_NONBLOCK = 0o4000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class TimerFd:
    """A CLOCK_MONOTONIC ``timerfd``, armed at an absolute ``time.monotonic()`` reading."""

    _libc: Any = None

    def __init__(self) -> None:
        if TimerFd._libc is None:
            TimerFd._libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc = TimerFd._libc
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_CLOEXEC | _TFD_NONBLOCK)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd: int = fd
        self._spec = _Itimerspec()
        self._settime = libc.timerfd_settime
        self._armed = math.nan

    @classmethod
    def open(cls) -> TimerFd | None:
        """A timerfd, or ``None`` where there is none (not Linux, no libc, an old kernel)."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            return cls()
        except (OSError, AttributeError) as exc:
            log.debug("no timerfd here (%s): timers fire on the event loop's millisecond clock", exc)
            return None

    def arm(self, when: float) -> None:
        """Fire at ``when`` (a ``time.monotonic()`` value; one in the past fires at once)."""
        if when == self._armed:
            return
        self._armed = when
        sec = math.floor(when)
        value = self._spec.it_value
        value.tv_sec = max(sec, 0)
        value.tv_nsec = max(min(int((when - sec) * 1e9), 999_999_999), 1) if sec >= 0 else 1
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) < 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def clear(self) -> None:
        """Consume an expiry (the fd stays readable until read)."""
        self._armed = math.nan
        try:  # noqa: SIM105 - once per expiry: suppress() would add a context manager
            os.read(self.fd, 8)
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Timer:
    __slots__ = ("active", "args", "fn", "seq", "when")

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
        # LADDER-TIMERFD: the timerfd is used only where its clock is the owner's (asyncio's loop
        # clock and time.monotonic() are both CLOCK_MONOTONIC).
        self.precise = True

    def call_at(self, when: float, fn: Callable[..., Any], *args: Any) -> Timer:
        timer = Timer(when, next(self._seq), fn, args)
        heapq.heappush(self._heap, timer)
        if self._heap[0] is timer:
            self._wake.set()
        return timer

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer:
        return self.call_at(self.clock() + delay, fn, *args)

    def fire_due(self) -> int:
        """Fire, in order, every timer due by ``clock()`` now (those a fired one arms for now
        included); how many fired. For a caller that drives the clock itself (the policy's unit
        tests, with a manual clock); ``run`` is what an engine uses."""
        heap = self._heap
        fired = 0
        while heap and (not heap[0].active or heap[0].when <= self.clock()):
            timer = heapq.heappop(heap)
            if timer.active:
                self._fire(timer)
                fired += 1
        return fired

    async def run(self) -> None:
        tfd = TimerFd.open() if self.precise and self._monotonic() else None
        if tfd is None:
            await self._run(None)
            return
        loop = asyncio.get_running_loop()

        def expired() -> None:
            tfd.clear()
            self._wake.set()

        loop.add_reader(tfd.fd, expired)
        try:
            await self._run(tfd)
        finally:
            loop.remove_reader(tfd.fd)
            tfd.close()

    def _monotonic(self) -> bool:
        """Whether the owner's clock reads CLOCK_MONOTONIC (the timerfd's clock)."""
        try:
            return abs(self.clock() - time.monotonic()) < 0.01
        except Exception:  # noqa: BLE001 - a clock that cannot be read here: the coarse path
            return False

    async def _run(self, tfd: TimerFd | None) -> None:
        """Fire timers in order; between two, wait for the head's time through the timerfd when
        there is one (LADDER-TIMERFD), else with the loop's own timeout (millisecond rounding)."""
        heap = self._heap
        while True:
            while heap and not heap[0].active:
                heapq.heappop(heap)
            if not heap:
                await self._wake.wait()
                self._wake = anyio.Event()
                continue
            when = heap[0].when
            delay = when - self.clock()
            if delay > 0:
                if tfd is not None:
                    tfd.arm(when)
                    await self._wake.wait()
                else:
                    with anyio.move_on_after(delay):
                        await self._wake.wait()
                if self._wake.is_set():
                    self._wake = anyio.Event()
                continue
            self._fire(heapq.heappop(heap))

    @staticmethod
    def _fire(timer: Timer) -> None:
        if timer.active:
            timer.active = False
            timer.fn(*timer.args)
