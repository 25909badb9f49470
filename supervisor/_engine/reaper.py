"""Reaping a dead worker with its whole tree (LADDER-STEPS), and what many exits at once share.

A worker's pid exited: ``Reaper.reap`` collects it, kills its cgroup, finds what it left among this
process's children (``OrphanIndex``, LADDER-ORPHANS), kills and reaps that, and forgets the slot.
For a worker that held a turn this happens before any of its turns' results is out: quiescence.

LADDER-BATCH: a worker that held nothing (no turn, nothing handed ahead: an idle worker retired at
``aclose()`` or a daemon's SIGTERM, one recycled) has no result for its tree to precede. Its tree is
swept with every other such worker that exited in the same turn of the event loop: one listing of
our children and one pass over them for the whole batch, instead of one of each per exit - the
kernel's ``children`` file of a supervisor holding N workers lists N pids, so N exits each reading
it cost O(N²). The pool's close waits for the batch (``settled``): ``aclose()`` still returns only
once every descendant is reaped.

LADDER-PROOF: a worker whose tree is provably gone (``left_nothing``: its cgroup and process group empty,
no zombie of ours waiting, no process mapping its proof page) needs neither: no listing at all.

WORKER-CWD at the close: a reaped worker's directory goes while the others still exit, the directories of the
workers reaped meanwhile in one thread call; ``settled`` waits for them too.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from worker import proctree

from . import procs as _procs
from .orphans import OrphanIndex, Target
from .workspace import remove_tree

if TYPE_CHECKING:
    from .pool import WorkerPool, WorkerSlot

ROUNDS = 8  # listings after killing what the last one found (their own orphans come to us then)


class Reaper:
    """The process side of a worker's exit for ``pool``; see the module docstring."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.orphans = OrphanIndex()  # LADDER-ORPHANS: what dead workers left among our children
        self._batch: list[WorkerSlot] = []  # LADDER-BATCH: idle workers' trees for the next sweep
        self._swept: anyio.Event | None = None  # set when the batch being swept is done
        self._dirs: list[str] = []  # WORKER-CWD: reaped workers' directories, while the pool closes
        self._removed: anyio.Event | None = None  # set when the directories being removed are gone

    def _exclude(self) -> set[int]:
        """Our children that are no dead worker's: live workers, the zygote and its embryos."""
        pool = self.pool
        exclude = {s.pid for s in pool.slots.values()}
        if pool.zygote is not None:
            exclude.add(pool.zygote.pid)
            exclude |= pool.zygote.embryos
        return exclude

    async def reap(self, slot: WorkerSlot) -> int | None:
        """``slot``'s pid exited: reap it, then kill and reap every descendant of it (LADDER-STEPS:
        quiescence, before any of its turns' results is out; LADDER-BATCH: with the batch, for a
        worker that held nothing), and forget the slot. Returns its exit code."""
        pool = self.pool
        code = _procs.reap(slot.pid)
        slot.exit_code = code
        if slot.timer is not None:
            slot.timer.cancel()
        pool.link.peers.pop(slot.ident, None)
        left: list[int] = []
        if slot.cgroup is not None:
            # Atomic: everything in the worker's cgroup dies at once, whatever sessions it made.
            # Not excluded below: one reaped too early (its parent still dying) is a zombie of
            # ours later, and the scan finds it by its cgroup.
            left = await _procs.kill_cgroup(slot.cgroup)
            _procs.CGROUPS.pop(slot.pid, None)  # the pid is reaped: it may name another worker soon
        if not left and left_nothing(slot):
            # LADDER-PROOF: nothing of its tree is left anywhere: no listing of our children.
            assert slot.cgroup is not None
            proctree.cgroup_remove(slot.cgroup)
        elif slot.turn is None and not slot.ahead:
            self._later(slot)
        else:
            await self._sweep([slot], self._exclude())
        pool.share.forget(slot.pid)
        del pool.slots[slot.id]
        slot.out = []
        if slot.workdir is not None:
            # WORKER-CWD: what its agents left in their directory goes with it, off the event loop
            # (while the pool closes, batched: one thread removes the directories of the workers
            # reaped meanwhile, during the other exits, not all of them after the last one).
            assert pool.tg is not None
            if pool.closing:
                self._dirs.append(slot.workdir)
                if self._removed is None:
                    self._removed = anyio.Event()
                    pool.tg.start_soon(self._remove_dirs)
            else:
                pool.tg.start_soon(anyio.to_thread.run_sync, remove_tree, slot.workdir)
            slot.workdir = None
        return code

    async def _remove_dirs(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                while self._dirs:
                    batch, self._dirs = self._dirs, []
                    await anyio.to_thread.run_sync(_remove_all, batch)
            finally:
                removed, self._removed = self._removed, None
                if removed is not None:
                    removed.set()

    async def _sweep(self, slots: list[WorkerSlot], exclude: set[int]) -> None:
        """Kill and reap what the dead workers ``slots`` left among our children (LADDER-ORPHANS),
        then remove their cgroups."""
        targets = [Target(s.pid, s.marker, s.cgroup) for s in slots]
        pending: set[int] = set()
        for s in slots:
            pending |= s.known - {s.pid}
        for _ in range(ROUNDS):  # LADDER-ORPHANS: each child of ours is read once, not at every exit
            found = set(self.orphans.of_any(targets, exclude)) - pending
            if not pending and not found:
                break
            await _procs.kill_and_reap(pending | found)
            self.orphans.forget(pending | found)
            exclude |= pending | found
            pending = set()
        for s in slots:
            if s.cgroup is not None:
                proctree.cgroup_remove(s.cgroup)  # empty by now; the pool's removal retries what is not

    def _later(self, slot: WorkerSlot) -> None:
        """LADDER-BATCH: sweep ``slot``'s tree with the others that exit in this turn of the loop, or,
        while the pool closes, with every other worker's at its close (``settled``)."""
        self._batch.append(slot)
        if self._swept is None and not self.pool.closing:
            self._swept = anyio.Event()
            assert self.pool.tg is not None
            # A task: it runs after the callbacks already due, among them the other exits seen in
            # the same wake-up of the loop.
            self.pool.tg.start_soon(self._sweep_batches)

    async def _sweep_batches(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                while self._batch:
                    batch, self._batch = self._batch, []
                    await self._sweep(batch, self._exclude())
            finally:
                swept, self._swept = self._swept, None
                if swept is not None:
                    swept.set()

    async def settled(self) -> None:
        """Return once every batched tree is swept (the pool's close: every descendant reaped) and
        every reaped worker's directory removed."""
        while self._swept is not None:
            await self._swept.wait()
        if self._batch:
            self._swept = anyio.Event()
            await self._sweep_batches()
        while self._removed is not None:
            await self._removed.wait()


def left_nothing(slot: WorkerSlot) -> bool:
    """LADDER-PROOF: whether the dead (reaped) worker ``slot`` provably left no process, alive or a zombie,
    so that no listing of our children is needed. Each condition is one system call:

    * its cgroup is empty (read by the caller: ``kill_cgroup`` found nobody), and the SIGTERM step
      listed no descendant of it (``known``: those are reaped by the sweep);
    * no process maps its proof page any more (LADDER-PROOF: every fork of the worker inherited it, and
      closing descriptors, ``setsid`` or leaving the cgroup do not remove it);
    * no process is left in its process group (the guardian of a fresh interpreter, an exec'd child);
    * no child of ours is a zombie waiting to be reaped (``WNOWAIT``: nothing is taken from another
      waiter) - a descendant that died after its parent is ours to reap, and carries no mapping.

    Anything else - a worker without a cgroup or a proof page, a crash that left a process, a zombie of
    the host's - and the scan looks for what it left, as before."""
    if slot.pid <= 0 or slot.cgroup is None or slot.files is None or slot.known - {slot.pid}:
        return False
    if not slot.files.tree_gone():
        return False
    try:
        os.killpg(slot.pid, 0)
        return False  # a process is still in its group
    except ProcessLookupError:
        pass
    except OSError:
        return False
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:  # no child at all
        return True


def _remove_all(paths: list[str]) -> None:
    for path in paths:
        remove_tree(path)
