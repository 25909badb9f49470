"""WORKER-CPU-SHARE: the workers' share of the CPUs against their supervisor's, by default.

Each worker leads its own session, and with ``sched_autogroup_enabled=1`` (the default of most
distributions) the kernel schedules each session as one group with the weight of one program:
384 streaming workers were 384 groups against their supervisor's one, and once they kept the CPUs
busy the supervisor got a 385th of them and fell behind delivering their events (emit → follower
p50 1.4-3 s at 384 turns × 20 events/s, the supervisor runnable but waiting 0.88 s of every second).

So each worker's autogroup gets a niceness chosen from the pool's size, such that all the workers
together weigh about ``POOL_PROGRAMS`` programs: a pool of one to four workers stays at 0, 64 workers
get 13, 384 get 19 (the floor: the kernel's lightest weight, 15 against 1,024). Only the group's
weight changes, never the threads' niceness: within a worker nothing changes, against its
supervisor the pool counts as a few programs instead of hundreds, and since the scheduler is
work-conserving, a weight is only a share under contention - an idle machine gives the agents all
of it. Measured at 384 × 20 events/s on the shared 2-core machine: p50 1.4-1.6 s → 62 ms, p99
2.8 s → 350 ms, the supervisor's wait 0.88 → 0.47 s per second, the agents' rate unchanged.
"""

from __future__ import annotations

import collections
import errno
from collections.abc import Callable
from typing import Any

# The kernel's weight of each niceness (kernel/sched/core.c ``sched_prio_to_weight``), 0 to 19.
WEIGHTS = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15)
POOL_PROGRAMS = 4  # all the workers together weigh about this many programs at niceness 0


def autogroup_nice(workers: int) -> int:
    """The niceness of each worker's autogroup in a pool of ``workers`` (WORKER-CPU-SHARE): the lowest
    whose weight, times ``workers``, is at most ``POOL_PROGRAMS`` programs' (19 past that)."""
    budget = WEIGHTS[0] * POOL_PROGRAMS / max(1, workers)
    for nice, weight in enumerate(WEIGHTS):
        if weight <= budget:
            return nice
    return len(WEIGHTS) - 1


def set_autogroup_nice(pid: int, nice: int) -> int:
    """Set the autogroup (session) niceness of ``pid`` (0 to 19: never above this process, which
    needs no privilege). 0 on success, else the errno: ``EAGAIN`` is the kernel's rate limit (a
    process without CAP_SYS_ADMIN may change an autogroup's niceness once per 100 ms, machine-wide);
    anything else (no autogroups here, the process gone) is final."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
        return 0
    except OSError as exc:
        return exc.errno or errno.EIO


RETRY = 0.11  # seconds between attempts the kernel's rate limit refused (it allows one per 100 ms)


class AutogroupShare:
    """WORKER-CPU-SHARE: set each new worker's autogroup niceness; what the kernel's rate limit refuses is
    retried, one a ``RETRY``, oldest first (a worker gone by then is skipped)."""

    def __init__(
        self,
        call_later: Callable[[float, Callable[[], None]], Any],
        write: Callable[[int, int], int] = set_autogroup_nice,
    ) -> None:
        self._call_later = call_later
        self._write = write
        self._pending: collections.deque[tuple[int, int]] = collections.deque()
        self._scheduled = False
        self.set = 0  # autogroups set (for tests and benchmarks)
        self.boosted: set[int] = set()  # WORKER-SHARE-AT-CANCEL: workers given their weight back

    def apply(self, pid: int, workers: int, worker_nice: int | None = None) -> None:
        """Worker ``pid`` of a pool of ``workers`` is ready: set its autogroup's niceness, never
        below ``worker_nice`` (WORKER-NICE: the threads' own, when one was asked for)."""
        nice = max(autogroup_nice(workers), worker_nice or 0)
        if self._pending:
            self._pending.append((pid, nice))  # behind those already waiting for the rate limit
            return
        self._try(pid, nice)

    def _try(self, pid: int, nice: int) -> None:
        got = self._write(pid, nice)
        if got == 0:
            self.set += 1
        elif got == errno.EAGAIN:
            self._pending.appendleft((pid, nice))
            if not self._scheduled:
                self._scheduled = True
                self._call_later(RETRY, self._retry)

    def _retry(self) -> None:
        self._scheduled = False
        if self._pending:
            self._try(*self._pending.popleft())
        if self._pending and not self._scheduled:
            self._scheduled = True
            self._call_later(RETRY, self._retry)

    def boost(self, pid: int, worker_nice: int | None = None) -> bool:
        """WORKER-SHARE-AT-CANCEL: worker ``pid``'s turn is cancelled: what it has left to do is stop (the
        agent's cleanup, its End, or the handlers of the ladder's signals), and at the pool's weight, behind
        hundreds of streaming workers, each of its wake-ups waited tens of ms. Its autogroup gets its weight
        back (niceness 0, or ``worker_nice``) until ``settle``; nothing is retried if the kernel refuses."""
        if pid in self.boosted:
            return True
        if self._write(pid, worker_nice or 0) != 0:
            return False
        self.boosted.add(pid)
        return True

    def settle(self, pid: int, workers: int, worker_nice: int | None = None) -> None:
        """The boosted worker's turn is over: back to the pool's share (``apply``)."""
        if pid in self.boosted:
            self.boosted.discard(pid)
            self.apply(pid, workers, worker_nice)

    def release(self, pids: list[int], worker_nice: int | None = None) -> int:
        """WORKER-SHARE-AT-CLOSE: the pool closes, so its workers' exits are all the work they have left,
        and at the pool's lightest weight, on a machine busy with other programs, they waited seconds for
        the CPU time to exit. Give each worker's autogroup back its weight (niceness 0, or
        ``worker_nice``: any process may set 0 to 19), as far as the kernel takes them at once (with
        CAP_SYS_ADMIN; without it, one change per 100 ms machine-wide): the first refusal ends it,
        nothing else changes. Returns how many were set."""
        self._pending.clear()
        nice = worker_nice or 0
        done = 0
        for pid in pids:
            got = self._write(pid, nice)
            if got == 0:
                done += 1
            elif got in (errno.EPERM, errno.EACCES, errno.EAGAIN):
                break  # not ours to raise (or rate-limited): the pool keeps its share
        return done

    def forget(self, pid: int) -> None:
        """The worker is gone: no attempt for it (its pid may name another process later)."""
        self.boosted.discard(pid)
        if self._pending:
            self._pending = collections.deque(p for p in self._pending if p[0] != pid)
