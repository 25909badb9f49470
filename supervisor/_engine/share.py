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
import os
from collections.abc import Callable
from typing import Any

from worker.proctree import set_autogroup_nice  # (also used by the pool's watcher: WORKER-SHARE-AT-DEATH)

# The kernel's weight of each niceness (kernel/sched/core.c ``sched_prio_to_weight``), 0 to 19.
WEIGHTS = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15)
# ... and of -1 to -10 (index 0 is -1): a niceness below 0 needs CAP_SYS_NICE (or RLIMIT_NICE).
RAISED_WEIGHTS = (1277, 1586, 1991, 2501, 3121, 3906, 4904, 6100, 7620, 9548)
POOL_PROGRAMS = 4  # all the workers together weigh about this many programs at niceness 0


def autogroup_nice(workers: int) -> int:
    """The niceness of each worker's autogroup in a pool of ``workers`` (WORKER-CPU-SHARE): the lowest
    whose weight, times ``workers``, is at most ``POOL_PROGRAMS`` programs' (19 past that)."""
    budget = WEIGHTS[0] * POOL_PROGRAMS / max(1, workers)
    for nice, weight in enumerate(WEIGHTS):
        if weight <= budget:
            return nice
    return len(WEIGHTS) - 1


def pool_weight(workers: int, worker_nice: int | None = None) -> int:
    """What a pool of ``workers`` weighs in all, its autogroups at their niceness (WORKER-CPU-SHARE)."""
    return max(1, workers) * WEIGHTS[max(autogroup_nice(workers), worker_nice or 0)]


def own_nice(weight: int) -> int:
    """WORKER-SUPERVISOR-WEIGHT: the autogroup niceness at which the supervisor weighs at least ``weight``
    (its pool's), down to -10; 0 when one program's weight already does."""
    if weight <= WEIGHTS[0]:
        return 0
    for i, w in enumerate(RAISED_WEIGHTS):
        if w >= weight:
            return -(i + 1)
    return -len(RAISED_WEIGHTS)


def autogroup_nice_of(pid: int | str = "self") -> int | None:
    """The niceness of ``pid``'s autogroup (None: no autogroups, or unreadable)."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


class OwnWeight:
    """WORKER-SUPERVISOR-WEIGHT: this process's autogroup weighs what its pools weigh, where it may.

    Hundreds of busy workers at the lightest weight (WORKER-CPU-SHARE) still weigh about four programs, their
    supervisor one: with the CPUs full, its event loop waited 0.52 s of every second for one (on one 0.17 s)
    and every step of a cancel or a kill queued behind that wait. A process with CAP_SYS_NICE (root) may
    give its own autogroup a niceness below 0: while pools run, it weighs at least what the largest of them
    weighs (``own_nice``); the niceness it had comes back when the last pool closes. Without the
    privilege the kernel refuses (EPERM/EACCES) or rate-limits (EAGAIN) the write: nothing changes and
    nothing is retried. One per process: the autogroup is the process's session's, shared by every pool in
    it. Only a process that leads its own session does it (a daemon, a service, a program started with
    ``setsid``): the session is then its own, and ends with it, so nothing stays raised after its exit,
    SIGKILL included; in a shell's or a host's session nothing changes."""

    def __init__(
        self,
        write: Callable[[int | str, int], int] | None = None,
        read: Callable[[int | str], int | None] = autogroup_nice_of,
        leads: Callable[[], bool] = lambda: os.getsid(0) == os.getpid(),
    ) -> None:
        self._write = write if write is not None else set_autogroup_nice
        self._read = read
        self._leads = leads
        self._holders: dict[int, int] = {}  # pool id -> the niceness it asked for
        self._was: int | None = None  # the niceness before the first raise (None: not raised)
        self.nice: int | None = None  # the niceness set now (None: not raised)

    def hold(self, pool: int, nice: int) -> int | None:
        """Pool ``pool`` runs and wants this process at niceness ``nice`` (or lower): the niceness it
        weighs at, below 0 (set now, or already that low: another process of the session raised it), or
        None when it is not raised (not needed, or not allowed)."""
        if not self._leads():
            return None  # the session is another program's (a shell's, a host's): never weigh it
        self._holders[pool] = nice
        self._apply()
        if self.nice is not None:
            return self.nice
        current = self._read("self") if nice < 0 else None
        return current if current is not None and current <= nice else None

    def release(self, pool: int) -> None:
        """Pool ``pool`` closed: the niceness the others ask for, or back to the one it had."""
        if self._holders.pop(pool, None) is not None:
            self._apply()

    def _apply(self) -> None:
        want = min(self._holders.values(), default=0)
        if self._was is None:
            current = self._read("self")
            if current is None or want >= current:
                return
            if self._write("self", want) == 0:
                self._was, self.nice = current, want
            return
        target = want if self._holders and want < self._was else self._was
        if target != self.nice and self._write("self", target) == 0:
            self.nice = target
        if not self._holders:
            self._was = self.nice = None


OWN = OwnWeight()  # WORKER-SUPERVISOR-WEIGHT: this process's


RAISED_AT_ONCE = 1  # WORKER-SUPERVISOR-WEIGHT: stopping workers given the supervisor's weight at a time
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
        # WORKER-SUPERVISOR-WEIGHT: the worker given the supervisor's weight (``hurry``).
        self.raised: set[int] = set()

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

    def hurry(self, pid: int, nice: int) -> bool:
        """WORKER-SUPERVISOR-WEIGHT: worker ``pid`` is stopping (its turn cancelled, or the kill decided):
        while no other worker holds it, its autogroup weighs what the supervisor's does (``nice``, below
        0), so its cleanup, its End, its handler and its exit (the kernel's teardown of its memory: 3.9 ms
        of CPU for a worker here) do not queue behind the pool. One worker at a time (``RAISED_AT_ONCE``):
        a mass cancel of agents that ignore it weighs at most one supervisor more, the rest a program each
        (WORKER-SHARE-AT-CANCEL). Best effort, never retried; given back at ``settle``, forgotten at the
        exit."""
        if pid in self.raised:
            return True
        if len(self.raised) >= RAISED_AT_ONCE or self._write(pid, nice) != 0:
            return False
        self.raised.add(pid)
        self.boosted.add(pid)
        return True

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
            self.raised.discard(pid)
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
        self.raised.discard(pid)
        if self._pending:
            self._pending = collections.deque(p for p in self._pending if p[0] != pid)
