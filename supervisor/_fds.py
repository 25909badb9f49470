"""File descriptors: the process limit, what is in use, and the share each front end may take.

libzmq aborts the whole process (SIGABRT) when some of its internal calls fail with ``EMFILE`` (an
``accept`` on an ``ipc://`` listener, for one: the worker link and the default client endpoint
both are). The defence is never to come near the limit:

* ``raise_nofile_limit`` lifts the soft ``RLIMIT_NOFILE`` to the hard one at start (a shell's soft
  1024 is common while the hard limit is far higher), as nginx, PostgreSQL and systemd services do;
* ``FdBudget`` keeps ``reserve`` descriptors for the engine's own use (its sockets, the life pipe,
  each worker's pidfd, output pipe and link connection, the journal) and splits the rest between
  the front ends that accept connections from outside (HTTP, ZeroMQ clients): each closes what it
  accepts past its share at once, so a flood costs the daemon a bounded number of descriptors;
* ``FdShortage`` counts the ``EMFILE``/``ENFILE`` errors the engine met anyway (a host application
  that leaks descriptors, a machine-wide shortage), by where; every one of them is retried later.
"""

from __future__ import annotations

import collections
import errno
import logging
import math
import os
import resource
import time
from collections.abc import Callable

log = logging.getLogger("turnpool.supervisor")

SHORTAGE = (errno.EMFILE, errno.ENFILE)
# Descriptors the engine keeps for itself beyond the front ends' shares: a fixed part (the event
# loop, the worker link and its monitor, ZeroMQ's internal pipes, the journal and its WAL, the
# metrics listener, logs) and a part per worker (pidfd, output pipe, link connection, cgroup files
# opened while reaping, a spare for the worker being replaced).
RESERVE_FIXED = 64
RESERVE_PER_WORKER = 8
# The least a front end is allowed, whatever the limit (a daemon run under a tiny limit still
# serves a few clients; the reserve then shrinks instead).
MIN_SHARE = 4


def is_shortage(exc: BaseException) -> bool:
    """Whether ``exc`` is the process (``EMFILE``) or the system (``ENFILE``) running out of descriptors."""
    return isinstance(exc, OSError) and exc.errno in SHORTAGE


def raise_nofile_limit() -> tuple[int, int]:
    """Lift the soft ``RLIMIT_NOFILE`` to the hard limit (capped at ``2**20``: some kernels report an
    unlimited hard limit that ``setrlimit`` refuses as the soft one). Returns ``(soft, hard)`` as they
    are afterwards; a refusal leaves the limit as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 2**20
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as exc:
            log.info("could not raise the file descriptor limit from %d to %d: %s", soft, want, exc)
        else:
            soft = want
    return soft, hard


def nofile_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 2**20


def open_fds() -> int | None:
    """How many descriptors this process has open (``None`` when it cannot be read: it takes one).

    DAEMON-FD-COUNT: the size Linux (6.2 on) gives ``/proc/self/fd`` is that count, from the process's
    table of descriptors in one ``stat``; listing the directory instead costs about a microsecond per
    descriptor (5-17 ms with the 4,000 of a daemon with 1,000 workers, measured), so it is listed only
    where the size reads 0 (older kernels)."""
    try:
        size = os.stat("/proc/self/fd").st_size
        if size > 0:
            return size
        return len(os.listdir("/proc/self/fd")) - 1  # the directory's own descriptor
    except OSError:
        return None


class FdShortage:
    """``EMFILE``/``ENFILE`` errors met, by where (``worker_start``, ``accept_http``, …)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def count(self, where: str, exc: BaseException) -> None:
        self.counts[where] += 1
        n = self.counts[where]
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th…: a shortage must not flood the log too
            log.error("out of file descriptors (%s, %d so far): %s", where, n, exc)


class SpawnRoom:
    """WORKER-FD-ESTIMATE: whether a worker start leaves ``headroom`` descriptors free, without listing
    /proc/self/fd at every start (a microsecond per open descriptor: starting N workers that way is
    O(N²), about a second of CPU for 512). The count is made again when it is older than ``every``
    seconds or when the estimate - the last count plus ``per_start`` for each start since - comes
    within ``headroom`` of the limit, so a start near the limit is always judged on a fresh count. A
    start that meets ``EMFILE`` anyway is a failed start, retried (WORKER-FD-RETRY)."""

    def __init__(
        self,
        headroom: int,
        per_start: int,
        *,
        every: float = 1.0,
        count: Callable[[], int | None] = lambda: open_fds(),
        limit: Callable[[], int] = lambda: nofile_limit(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.headroom = headroom
        self.per_start = per_start
        self.every = every
        self._count, self._limit, self._clock = count, limit, clock
        self._open: int | None = None
        self._at = -math.inf
        self._starts = 0

    def ok(self) -> bool:
        """Whether one more start fits (counted as made)."""
        now, limit = self._clock(), self._limit()
        if (
            self._open is None
            or now - self._at >= self.every
            or self._open + self._starts * self.per_start + self.headroom > limit
        ):
            self._open, self._at, self._starts = self._count(), now, 0
        if self._open is None:
            return False
        fits = self._open + self._starts * self.per_start + self.headroom <= limit
        self._starts += 1
        return fits


OPEN_EVERY = 1.0  # seconds: status()'s count of open descriptors is at most this old (DAEMON-FD-COUNT)


class FdBudget:
    """The share of the descriptor limit each front end may hold (see the module docstring)."""

    def __init__(
        self,
        *,
        limit: int,
        workers: int,
        front_ends: int = 2,
        count: Callable[[], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self._count = count or open_fds
        self._clock = clock
        self._open: int | None = None
        self._open_at = -math.inf
        reserve = RESERVE_FIXED + RESERVE_PER_WORKER * max(1, workers)
        share = (limit - reserve) // max(1, front_ends)
        if share < MIN_SHARE:
            share = MIN_SHARE
            reserve = max(0, limit - share * front_ends)
        self.reserve = reserve
        self.share = share

    def facts(self) -> dict[str, int | None]:
        """DAEMON-FD's figures for ``status()``. ``open`` is counted at most every ``OPEN_EVERY`` seconds
        (DAEMON-FD-COUNT): listing /proc/self/fd costs about a microsecond per descriptor in the kernel,
        and a daemon with 1,000 workers holds thousands (4-6 ms of a status() answer, measured)."""
        now = self._clock()
        if now - self._open_at >= OPEN_EVERY:
            self._open, self._open_at = self._count(), now
        return {"limit": self.limit, "open": self._open, "reserve": self.reserve, "per_front_end": self.share}
