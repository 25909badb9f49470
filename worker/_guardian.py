"""The guardian's body (forked by ``_guards.start_guardian``; see its docstring for the why).

Runs in a process forked from the worker before any thread exists; uses only os-level calls.
It never kills anything that does not descend from its worker: a process counts as such when
it is in the worker's cgroup, in the worker's session (while the worker's pid is not reused),
or carries the worker's tree marker (environment or memfd, see ``_tree``).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Callable

from .proctree import _cgroup, _tree


# TREE-GUARDIAN: the guardian outlives its worker and sweeps after it (RAY-GUARDIAN: also when a
# host such as a Ray actor SIGKILLs its direct children, the workers among them).
def run(
    worker_pid: int,
    worker_start: int | None,
    worker_fd: int | None,
    life_fd: int,
    cgroup: str | None,
    marker: str | None,
    take_baton: Callable[[], bool],
) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _tree.set_parent_death_signal(0)  # forks inherit none, but be explicit: we must outlive the worker
    if os.getppid() != worker_pid and not _is(worker_pid, worker_start):
        pass  # the worker is already gone: sweep right away
    elif not _wait(worker_pid, worker_fd, life_fd):
        # The supervisor died and the worker lives: its session's default weight back (WORKER-SHARE-AT-DEATH;
        # ours too, we are in it) whoever kills the tree.
        _tree.set_autogroup_nice(worker_pid, 0)
        if not take_baton():
            return  # the worker is killing its tree itself (us included)
        me = os.getpid()
        pids = _tree.freeze_tree(worker_pid, include_root=True, exclude=frozenset({me}))
        _tree.signal_all([p for p in pids if p != worker_pid], signal.SIGKILL)
        _tree.signal_all([worker_pid], signal.SIGKILL)  # last: what it forks meanwhile is frozen
        if worker_fd is not None:
            select.select([worker_fd], [], [], 5.0)
    elif cgroup is None or not os.path.isdir(cgroup):
        # The worker is gone and the supervisor lives. Without a cgroup the sweep is a scan of
        # every process on the machine (tens of ms); the supervisor does the same work among its
        # adopted orphans, and kills and reaps this guardian with them. So wait: only if the
        # supervisor dies first (a host that kills its workers, then itself) is the scan ours.
        wait_eof(life_fd)
    sweep(worker_pid, worker_start, cgroup, marker)


def wait_eof(fd: int) -> None:
    """Block until EOF (or an error) on ``fd``, a pipe's read end, blocking or not."""
    while True:
        try:
            if not os.read(fd, 1):
                return
        except InterruptedError:
            continue
        except BlockingIOError:
            select.select([fd], [], [])
        except OSError:
            return


def _is(pid: int, start: int | None) -> bool:
    return start is not None and _tree.start_time(pid) == start


def _wait(worker_pid: int, worker_fd: int | None, life_fd: int) -> bool:
    """Block until the worker exits (True) or the supervisor dies (False)."""
    poller = select.poll()
    poller.register(life_fd, select.POLLIN)
    if worker_fd is not None:
        poller.register(worker_fd, select.POLLIN)
    while True:
        try:
            # Without a pidfd (kernel < 5.3) the worker's exit shows as our re-parenting: look
            # once a second, the only fallback there is.
            events = poller.poll(None if worker_fd is not None else 1000)
        except InterruptedError:
            continue
        for fd, _ in events:
            if fd == worker_fd:
                return True
        if worker_fd is None and os.getppid() != worker_pid:
            return True
        for fd, _ in events:
            if fd == life_fd:
                try:
                    if os.read(life_fd, 1):
                        continue
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                return False


def sweep(worker_pid: int, worker_start: int | None, cgroup: str | None, marker: str | None) -> None:
    """Kill what the (dead) worker left: its cgroup, else its session and marked processes."""
    if cgroup is not None and os.path.isdir(cgroup):
        _cgroup.kill_and_remove(cgroup)
        return
    me = os.getpid()
    stopped: set[int] = {me}
    for _ in range(16):  # bounded: each round only adds what was forked meanwhile
        found = [
            pid
            for pid in _tree.all_pids()
            if pid not in stopped and _ours(pid, worker_pid, worker_start, marker)
        ]
        if not found:
            break
        for pid in found:
            stopped.add(pid)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
    stopped.discard(me)
    _tree.signal_all(sorted(stopped), signal.SIGKILL)


def _ours(pid: int, worker_pid: int, worker_start: int | None, marker: str | None) -> bool:
    if pid == worker_pid:
        return _is(pid, worker_start)
    if _tree.session_of(pid) == worker_pid:
        # The worker led this session. Its pid could be reused only once it is reaped; a new
        # session leader with that pid would then show another start time.
        leader = _tree.start_time(worker_pid)
        if leader is None or leader == worker_start:
            return True
    return marker is not None and _tree.has_marker(pid, marker)
