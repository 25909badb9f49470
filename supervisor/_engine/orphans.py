"""LADDER-ORPHANS: which of this process's children descend from a dead worker, each child read once.

When a worker dies, what it left (its guardian, a setsid daemon, a grandchild whose parent died
with it) is re-parented to the supervisor, the child subreaper, and must be killed and reaped before
the worker's turns end (LADDER-STEPS). Telling them from the host's own children and from what other dead
workers left takes /proc reads (session, cgroup, environment, descriptors, mappings). Made for every
child at every exit, that cost O(N) per exit: a mass exit of N workers (``aclose()``, SIGTERM of
``turnpool serve``), whose N guardians are all our children until their own worker is reaped, then
cost O(N²) - 65,000 classifications and 7 s for 256 idle workers. Here each child is classified once
(its session, its tree markers, its cgroup) and the facts kept while it stays our child, so a
worker's exit costs one listing of our children plus the reads of the children that are new.

Facts are taken when a child is first seen among ours: a dead worker's descendant already carries
everything that names it (what it does later cannot add a name, only remove one, so the facts first
read name it at least as well). A pid that leaves our children is forgotten at the next listing, and
facts older than ``FRESH`` seconds are read again: a pid that another reaper (the host's own
``waitpid(-1)``) collected between two listings is reused only after the kernel's pid counter has
gone all the way round, which no machine does in ``FRESH`` seconds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from worker import proctree

FRESH = 1.0  # seconds the facts read about a child are used before they are read again


class Facts(NamedTuple):
    session: int | None
    markers: frozenset[str]
    cgroup: str | None  # a removed cgroup's path too (TREE-ZOMBIES)
    read_at: float


class Target(NamedTuple):
    """A dead worker whose descendants are looked for: its pid (its session), marker and cgroup."""

    pid: int
    marker: str
    cgroup: str | None


def read_facts(pid: int, now: float) -> Facts:
    return Facts(
        proctree.session_of(pid), proctree.markers_of(pid), proctree.cgroup_of(pid, removed=True), now
    )


def adopted() -> list[int]:
    """Our children as a dead worker's orphans are found among them: the kernel hands an orphan to
    the subreaper's first live thread, its leader, so one read of the leader's ``children`` file
    finds them all (every thread's was read before: one file per thread of the supervisor - the
    loop's, ZeroMQ's, anyio's workers - at every exit). Every thread's while the leader has exited."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/stat", "rb") as f:
            stat = f.read()
        if stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X"):
            with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
                return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        pass
    return proctree.children(pid)


class OrphanIndex:
    """This process's children with what names their origin, read once per child (LADDER-ORPHANS)."""

    def __init__(
        self,
        *,
        children: Callable[[], Iterable[int]] | None = None,
        read: Callable[[int, float], Facts] = read_facts,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._children = children
        self._read = read
        self._clock = clock
        self._facts: dict[int, Facts] = {}

    def of(self, worker_pid: int, marker: str, exclude: set[int], cgroup: str | None = None) -> list[int]:
        """Our children that descend from the (dead) worker ``worker_pid``: its session, its tree
        marker (environment or memfd: a setsid one), or its cgroup (zombies keep theirs, even once
        it is removed). ``exclude``: children that are not a dead worker's (live workers, the
        zygote and its embryos): never read."""
        return self.of_any([Target(worker_pid, marker, cgroup)], exclude)

    def of_any(self, targets: Iterable[Target], exclude: set[int]) -> list[int]:
        """``of`` for several dead workers at once (LADDER-BATCH): one listing, one pass."""
        sessions = set()
        markers = set()
        cgroups = set()
        for t in targets:
            sessions.add(t.pid)
            markers.add(t.marker)
            if t.cgroup is not None:
                cgroups.add(t.cgroup)
        now = self._clock()
        current = set(self._children() if self._children is not None else adopted())
        facts = self._facts
        for pid in [p for p in facts if p not in current]:
            del facts[pid]  # no longer our child: reaped (its pid may come back as another process)
        found: list[int] = []
        for pid in current:
            if pid in exclude:
                continue
            known = facts.get(pid)
            if known is None or now - known.read_at > FRESH:
                known = facts[pid] = self._read(pid, now)
            if known.session in sessions or not markers.isdisjoint(known.markers) or known.cgroup in cgroups:
                found.append(pid)
        return found

    def forget(self, pids: Iterable[int]) -> None:
        """``pids`` were reaped: their numbers may name other processes from now on."""
        for pid in pids:
            self._facts.pop(pid, None)

    def __len__(self) -> int:
        return len(self._facts)
