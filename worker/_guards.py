"""The worker's process-level guards: whatever happens to the turn loop, nothing outlives it.

Kept apart from the turn loop (``_loop``) because these run in signal handlers, a watcher
thread and a forked guardian, where the loop's state must not be touched:

* the worker is the child subreaper of its own descendants, so a grandchild that double-forks
  stays in this worker's tree where a kill finds it;
* on SIGTERM it freezes and kills its whole tree, then dies of SIGTERM (reaping the tree first
  only when its supervisor is gone: LADDER-NO-WAIT in docs/design.md);
* when the supervisor dies (parent-death signal, or EOF on the inherited life pipe, watched by
  the stale flusher's thread: WORKER-ONE-THREAD) it does
  the same, so killing the supervisor with SIGKILL leaves no process behind;
* the guardian (``start_guardian``) does it for the worker when the worker cannot, and sweeps
  what the worker left when it exits;
* after each turn, ``sweep_leftovers`` kills what the turn left running.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, NoReturn

from . import _flusher, _guardian, _watcher
from .proctree import _cgroup, _sweep, _tree

PARENT_DEATH_SIGNAL = signal.SIGUSR2
_BATON_FD = -1  # set by start_guardian: see _take_baton
_SWEEP: _sweep.TurnSweep | None = None  # set by install_process_guards
_KILLING = False  # this process has begun killing its tree
_PARENT_PID = -1  # the supervisor's pid (set by install_process_guards)
# WORKER-JOIN-CGROUP: the move into the worker's cgroup, while it starts
_JOIN: threading.Thread | None = None
_WATCHER: _flusher.StaleFlusher | None = None  # the life-pipe watcher, later the stale flusher

# API-NO-NESTING: which turnpool process this is ("worker", "zygote"; a zygote's fork inherits it), or None
# in any other program. A supervisor refuses to start where it is set (``lowlevel.process_role``).
_ROLE: str | None = None


def mark_role(role: str) -> None:
    global _ROLE
    _ROLE = role


def process_role() -> str | None:
    """``"worker"`` or ``"zygote"`` inside turnpool's own processes, else ``None``."""
    return _ROLE


EXIT_LINK_LOST = 75  # the connection to the supervisor dropped: this worker can never report again


def _take_baton() -> bool:
    """Exactly one of the worker and its guardian may kill the tree: two processes freezing each
    other's trees could stop each other for good. The baton is one byte in a pipe they share;
    whoever reads it acts, the other stands by. Without a guardian the worker always acts."""
    if _BATON_FD < 0:
        return True
    try:
        return os.read(_BATON_FD, 1) == b"x"
    except OSError:  # already taken (the pipe is empty and non-blocking)
        return False


def kill_own_tree_and_exit(
    sig: int = signal.SIGTERM, exit_code: int | None = None, *, reap: bool = True
) -> None:
    """Freeze, kill and reap every descendant, then die of ``sig`` (default action), or exit
    with ``exit_code`` when one is given. If the guardian holds the baton, it is killing this
    tree already (this worker included): wait for it.

    With ``reap=False`` the descendants are frozen and SIGKILLed but not waited for (LADDER-NO-WAIT):
    for the supervisor's SIGTERM step, while the supervisor lives. They die all the same (a
    SIGKILL is not refused, a stopped process included); their exits then run in parallel with
    this worker's own instead of before it, and the supervisor - their subreaper once this worker
    is gone - reaps every one of them before the turn's ``killed`` result (LADDER-STEPS)."""
    global _KILLING
    if _KILLING:
        # This process is at it already: a second signal (the parent-death signal can come more
        # than once) interrupted the first handler, or another watcher thread got here too.
        # Return, so that the first one can finish.
        return
    _KILLING = True
    if not _take_baton():
        while True:
            time.sleep(3600)
    main = threading.current_thread() is threading.main_thread()
    try:
        pids = _tree.freeze_tree(os.getpid(), include_root=False)
        _tree.signal_all(pids, signal.SIGKILL)
        if not reap:
            return  # (the finally below: die now)
        if main:  # signal.* works in the main thread only
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(3)  # a descendant stuck in uninterruptible sleep must not keep us forever
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
    finally:
        if exit_code is not None:
            os._exit(exit_code)
        try:
            if main:
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
            os.kill(os.getpid(), sig)
        finally:
            os._exit(128 + int(sig))


def _on_term(signum: int, frame: Any) -> None:
    # LADDER-NO-WAIT: the supervisor, alive, reaps what this worker kills; without it, reap here.
    kill_own_tree_and_exit(signal.SIGTERM, reap=os.getppid() != _PARENT_PID)


def _on_supervisor_death() -> None:
    # WORKER-SHARE-AT-DEATH: our session's default weight back first (the pool's share made it the lightest):
    # the tree's kill and every exit in it run at it. One write; the watcher does it too, for every worker.
    _tree.set_autogroup_nice("self", 0)
    kill_own_tree_and_exit(signal.SIGKILL)


def _on_parent_death(signum: int, frame: Any) -> None:
    _on_supervisor_death()


def start_guardian(life_fd: int, *, cgroup: str | None = None, marker: str | None = None) -> int:
    """Fork the guardian: a tiny process that outlives this worker and cleans up after it.

    It watches two things: the life pipe (EOF: the supervisor died) and this worker's pidfd
    (the worker exited, however: a crash, a host's SIGKILL, a clean Shutdown).

    * Supervisor gone: it takes the baton (``_take_baton``) and freezes and SIGKILLs this
      worker's whole tree, itself excepted, the worker last. The worker's own watchers (the
      life-pipe thread, the SIGUSR2 handler) need the worker's GIL; an agent blocked in a C call
      that holds it would keep them from ever running, and the guardian needs nothing from the
      worker. If the worker took the baton first, it is killing its tree itself: stand down.
    * Worker gone: what it left (now re-parented away from it) is swept: the worker's cgroup is
      killed, emptied and removed; without one, every process in the worker's session or
      carrying its tree marker is frozen and SIGKILLed. Nothing else is ever touched.

    It has no parent-death signal (it must outlive the worker: a host that SIGKILLs its direct
    children, as Ray does, kills the worker but not this grandchild), is forked before any
    thread, ZeroMQ context or cgroup move (so it is outside the worker's cgroup and survives
    its kill), sits in the worker's session (so the supervisor's tree kill and orphan scan find
    and reap it), and costs one fork at start-up.
    """
    worker_pid = os.getpid()
    worker_start = _tree.start_time(worker_pid)
    _make_baton()
    try:
        worker_fd: int | None = os.pidfd_open(worker_pid)
    except (OSError, AttributeError):
        worker_fd = None
    pid = os.fork()
    if pid:
        if worker_fd is not None:
            os.close(worker_fd)
        return pid
    try:  # the guardian: never returns
        _guardian.run(worker_pid, worker_start, worker_fd, life_fd, cgroup, marker, _take_baton)
    finally:
        os._exit(0)


def _make_baton() -> int:
    """The baton (``_take_baton``): a pipe holding one byte; returns (and keeps) its read end."""
    global _BATON_FD
    baton, w = os.pipe()  # not inheritable: agents' children never see it
    os.write(w, b"x")
    os.close(w)
    os.set_blocking(baton, False)
    _BATON_FD = baton
    return baton


def install_process_guards(
    parent_pid: int, life_fd: int | None, cgroup: str | None = None, watcher_fd: int = -1
) -> None:
    """Subreaper, guardian (or the zygote's watcher: ``watcher_fd``), then the worker's own cgroup
    (if any), before anything else forks."""
    global _SWEEP, _PARENT_PID
    _PARENT_PID = parent_pid
    _tree.set_child_subreaper()
    guardian = -1
    marker = os.environ.get(_tree.TREE_ENV)
    # TREE-WATCHER: a zygote-forked worker registers with the zygote's one watcher instead of forking
    # a guardian of its own; if the watcher is gone, the guardian as before.
    if watcher_fd >= 0 and not _watcher.register(watcher_fd, _make_baton(), cgroup, marker):
        global _BATON_FD
        os.close(_BATON_FD)
        _BATON_FD = -1
        watcher_fd = -1
    if life_fd is not None and watcher_fd < 0:
        # First: no thread and no ZeroMQ context exist yet, and it stays outside the cgroup.
        guardian = start_guardian(life_fd, cgroup=cgroup, marker=marker)
    if cgroup is not None:
        # WORKER-JOIN-CGROUP: the move into the cgroup waits in the kernel for an RCU grace period (6-12 ms
        # here) when no migration happened just before; a thread waits for it while the worker
        # starts its link and warm-up, and ``cgroup_joined`` (before Ready) waits for the thread.
        # Nothing forks meanwhile, and the move takes every thread of the process with it.
        global _JOIN
        _JOIN = threading.Thread(target=_join, args=(cgroup,), name="turnpool-cgroup-join", daemon=True)
        _JOIN.start()
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(PARENT_DEATH_SIGNAL, _on_parent_death)
    _tree.set_parent_death_signal(PARENT_DEATH_SIGNAL)
    if os.getppid() != parent_pid:  # the supervisor died before the prctl took effect
        _on_supervisor_death()
    if life_fd is not None:
        os.set_inheritable(life_fd, False)
        # WORKER-ONE-THREAD: one thread watches the life pipe and, once the turn loop runs, flushes its
        # stale batches (``_flusher``).
        global _WATCHER
        _WATCHER = _flusher.StaleFlusher(
            {signal.SIGTERM, PARENT_DEATH_SIGNAL}, life_fd=life_fd, on_life_lost=_on_supervisor_death
        )
        _WATCHER.start()
    _SWEEP = _sweep.TurnSweep(guardian)


def _join(cgroup: str) -> None:
    if not _cgroup.join(cgroup):
        print(f"turnpool worker: could not join cgroup {cgroup}; the tree markers stand in", file=sys.stderr)


def cgroup_joined() -> None:
    """WORKER-JOIN-CGROUP: return once the worker is in its cgroup (or could not join it): before ``Ready``,
    so no turn's code runs, and nothing forks, outside it."""
    global _JOIN
    if _JOIN is not None:
        _JOIN.join()
        _JOIN = None


def watcher() -> _flusher.StaleFlusher | None:
    """The thread watching the life pipe, for the turn loop to make its stale flusher too."""
    return _WATCHER


THREAD_SETTLE = 0.05  # seconds a thread seen after a turn has to end or go idle before the worker retires
EXIT_RETIRED = 76  # TREE-THREADS: the worker retired itself after its turn's End was logged


def mark_engine_threads() -> None:
    """TREE-THREADS: the threads alive now are the engine's (called once the loop runs)."""
    if _SWEEP is not None:
        _SWEEP.mark_engine_threads()


def keep_child(pid: int, thread: int | None = None) -> None:
    """TREE-KEPT-CHILDREN: ``pid`` (a direct child) is the worker's own, not a turn's: the end-of-turn
    sweep spares it and what it started, and ``thread`` (the ident of the thread waiting for it, if
    any) is no thread a turn left running. The ladder and the worker's exit still kill it."""
    if _SWEEP is not None:
        _SWEEP.kept[pid] = thread


def release_child(pid: int) -> None:
    """``pid`` is no longer kept (it has exited, or is being closed)."""
    if _SWEEP is not None:
        _SWEEP.kept.pop(pid, None)


def keeps_children() -> bool:
    """Whether the worker holds kept children (TREE-KEPT-CHILDREN) that its exit must close."""
    return _SWEEP is not None and bool(_SWEEP.kept)


def sweep_leftovers() -> bool:
    """Kill and reap what the turn that just ended left running (TREE-SWEEP: before its End).
    False when this worker cannot be made clean and must retire (``retire``): the turn left a
    thread running (TREE-THREADS), or something went on forking through the sweep."""
    if _SWEEP is None:
        return True
    left = _SWEEP.agent_threads()
    # A pool's thread that has just handed back its result (the turn's await returned) may still
    # be on its way back to its queue, and a helper thread may be ending: give them a moment.
    # No event tells another thread's idleness, so this is a bounded poll, paid only when a
    # thread besides the engine's is seen at all.
    settle = time.monotonic() + THREAD_SETTLE
    while left and time.monotonic() < settle:
        time.sleep(0.0005)
        left = _SWEEP.agent_threads()
    if left:
        names = ", ".join(sorted(set(left)))
        print(
            f"turnpool worker: the turn left {len(left)} thread(s) running ({names}); retiring",
            file=sys.stderr,
            flush=True,
        )
        return False
    killed = _SWEEP.sweep()
    if killed:
        print(
            f"turnpool worker: killed {len(killed)} process(es) left by the turn",
            file=sys.stderr,
            flush=True,
        )
        if _SWEEP.still_forking():
            print(
                "turnpool worker: processes appeared during the sweep; retiring", file=sys.stderr, flush=True
            )
            return False
    return True


def retire() -> NoReturn:
    """TREE-THREADS: end this worker now. Its descendants are frozen and SIGKILLed (not waited
    for: a thread that forks on would keep a reaping loop busy), then the process exits, which
    ends every thread at once; what a thread forked meanwhile is left to the supervisor (its
    subreaper: the worker's cgroup, session and tree markers name it) and the guardian."""
    kill_own_tree_and_exit(signal.SIGKILL, exit_code=EXIT_RETIRED, reap=False)
    os._exit(EXIT_RETIRED)  # a signal handler was killing the tree already: never serve on
