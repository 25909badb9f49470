"""The end-of-turn sweep: whatever a turn started is killed and reaped before its End is sent.

The worker is the child subreaper of its descendants, so everything a turn started (a plain
child, a double-forked setsid daemon, the orphans of either) is in the worker's own tree while
the worker lives. Whether anything is there is one ``pread`` per thread that may have forked
(≈ 2 µs for an async agent: the main thread, which also adopts orphans); only when something
other than the guardian shows up does the sweep freeze, kill and reap the tree.

A no-op turn costs ≈ 15 µs end to end here, so the check must stay that cheap: it reads the
kernel's ``/proc/self/task/TID/children`` through descriptors opened once (re-opened only when
the set of Python threads changes), instead of listing tasks or scanning processes each time.
"""

from __future__ import annotations

import _thread
import concurrent.futures.thread
import os
import sys
import threading
from types import CodeType, FrameType

from .. import _flusher
from . import _tree

_THREADS = threading._active  # type: ignore[attr-defined]  # the running threads, by ident
# What an idle ``ThreadPoolExecutor`` thread runs (blocked in its queue's C ``get``): asyncio's
# default executor (``asyncio.to_thread``) keeps such threads between calls.
_POOL_WORKER = concurrent.futures.thread._worker.__code__


_BOOTSTRAP = threading.Thread._bootstrap.__code__  # type: ignore[attr-defined]  # every threading thread's first frame


def _outermost(frame: FrameType) -> CodeType:
    while frame.f_back is not None:
        frame = frame.f_back
    return frame.f_code


def _idle_pool_thread(thread: threading.Thread) -> bool:
    """Whether ``thread`` is a thread pool's worker waiting for work (it runs nothing of a turn)."""
    idle = getattr(thread, "idle_workers", None)
    if idle is not None and type(thread).__name__ == "WorkerThread":
        return thread in idle  # anyio's: back in the idle deque once its call returned
    frame = sys._current_frames().get(thread.ident or -1)
    return frame is not None and frame.f_code is _POOL_WORKER


# TREE-SWEEP: a turn's end sweeps its processes.
class TurnSweep:
    def __init__(self, guardian: int = -1, skip_threads: tuple[str, ...] = (_flusher.THREAD_NAME,)) -> None:
        self.me = os.getpid()
        self.guardian = guardian
        self._skip = skip_threads
        self._clean = {b"", f"{guardian} ".encode()}  # what a thread's children file reads when clean
        self._fds: list[int] = []
        self._threads = -1
        self._ok = os.path.exists(f"/proc/{self.me}/task/{self.me}/children")
        self._engine: frozenset[int] | None = None  # the engine's threads (TREE-THREADS)
        # TREE-KEPT-CHILDREN: the worker's own children (worker-wide MCP servers) -> the thread that
        # waits for each (asyncio's child watcher on 3.11), if any: neither is a turn's leftover.
        self.kept: dict[int, int | None] = {}

    def mark_engine_threads(self) -> None:
        """Note the threads alive now as the engine's own (once the turn loop runs, before any
        turn of the supervisor's): any other thread alive after a turn is the turn's."""
        self._engine = frozenset(sys._current_frames())

    # TREE-THREADS: a thread a turn left running retires its worker.
    def agent_threads(self) -> list[str]:
        """The names of the threads a turn left running: neither the engine's nor a thread pool's
        idle worker. Threads started with ``_thread`` (not in ``threading``'s table) count too.

        Python cannot stop a thread; one that forks (or does anything) after its turn returned
        would go on doing it in an idle worker and in the next turn. Usually one set comparison
        and one count (no thread besides the engine's)."""
        engine = self._engine
        if engine is None:
            return []
        if self.kept:
            engine = engine | {t for t in self.kept.values() if t is not None}
        if _THREADS.keys() <= engine and _thread._count() == len(_THREADS) - 1:
            return []  # every running thread is threading's (the main one is not counted), all the engine's
        left = []
        for ident, frame in sys._current_frames().items():
            if ident in engine:
                continue
            thread = _THREADS.get(ident)
            if thread is None:
                # Not in threading's table: started with ``_thread``, or a threading thread that
                # has finished and is being torn down (start() returns only once a thread is in
                # the table, so it is not one still starting).
                if _outermost(frame) is not _BOOTSTRAP:
                    left.append("a _thread thread")
            elif not _idle_pool_thread(thread):
                left.append(thread.name)
        return left

    def _refresh(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        # The main thread adopts orphans (the kernel hands them to the first live thread of the
        # group); other threads hold what they forked themselves (plain ``def`` agents).
        # ZeroMQ's own threads are not Python threads and never fork.
        tids = {self.me}
        for t in threading.enumerate():
            if t.native_id is not None and t.name not in self._skip:
                tids.add(t.native_id)
        for tid in tids:
            try:
                self._fds.append(os.open(f"/proc/{self.me}/task/{tid}/children", os.O_RDONLY))
            except OSError:
                continue
        self._threads = len(_THREADS)

    def leftovers(self) -> bool:
        """Whether this process has any child besides its guardian (zombies included)."""
        if not self._ok or self.kept:
            return bool(set(_tree.children(self.me)) - {self.guardian} - self.kept.keys())
        # len() of threading's table of running threads: no lock (active_count() takes one) -
        # this runs once per turn, and a thread that is only starting has forked nothing yet.
        if len(_THREADS) != self._threads:
            self._refresh()
        clean = self._clean
        try:
            for fd in self._fds:
                # A few bytes are enough: more than the guardian's pid means leftovers anyway.
                if os.pread(fd, 24, 0) not in clean:
                    return True
        except OSError:  # a thread ended: list them again
            self._threads = -1
            return self.leftovers()
        return False

    def sweep(self) -> list[int]:
        """Kill and reap every descendant but the guardian; the pids killed (usually none)."""
        if not self.leftovers():
            return []
        return _tree.kill_descendants(self.me, exclude=self._spared())

    def _spared(self) -> frozenset[int]:
        """The guardian, and each kept child with everything it started (TREE-KEPT-CHILDREN)."""
        spared = {self.guardian, *self.kept}
        for pid in self.kept:
            spared.update(_tree.descendants(pid))
        return frozenset(spared)

    def still_forking(self) -> bool:
        """After a sweep that killed something: whether a child appeared since (something in
        this process - a thread Python does not know, a C library's - forks on). Every thread's
        children are listed, not only the Python threads' the quick check reads."""
        return bool(set(_tree.children(self.me)) - {self.guardian} - self.kept.keys())
