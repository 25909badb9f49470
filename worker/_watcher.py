"""TREE-WATCHER: one watcher for every worker a zygote forks, instead of a guardian process per worker.

The guardian (``_guardian``) was a second Python process per worker (1.5 MiB of PSS each, a fork
per start, a child the supervisor had to find and reap at every exit). The zygote forks this
watcher once, after its imports and before any worker; each worker it forks registers with it
first thing (``register``: its pid and start time, its cgroup, its tree marker, and its end of the
baton) over a seqpacket socket inherited from the zygote, then closes that socket. The watcher does
for all of them what each guardian did for one:

* a worker exits (its pidfd): with a cgroup, the cgroup is killed, emptied and removed at once;
  without one, the worker is kept on a list of the recently dead (``DEAD_KEEP`` seconds: the
  supervisor, alive, sweeps its orphans itself right after the exit);
* the supervisor dies (EOF on the life pipe): it gives every live worker's autogroup its default
  weight back (WORKER-SHARE-AT-DEATH), then, for every one (taking its baton, so that a worker that has
  not begun on its tree stands by), it freezes and SIGKILLs the worker's tree, the worker last (it
  needs no GIL of the worker's: a worker stuck in a C call that holds it is killed too); then it
  sweeps every worker it knew - live and recently dead - by cgroup, or by one scan of /proc for their
  sessions and tree markers; then exits.

It is the zygote's child, not the supervisor's: a host that SIGKILLs its direct children (the
workers, the zygote) and then itself, as Ray does, leaves it running (re-parented) to sweep. It has
no parent-death signal and sits outside every worker's cgroup. It exits once every worker is gone
after the zygote said goodbye (``goodbye``: the supervisor closed the zygote's requests, and sweeps
what is left itself); a zygote that died without one (killed) leaves it waiting for the supervisor's
death to sweep. Workers started as fresh interpreters (no zygote) still fork their own guardian.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import time

from .proctree import _cgroup, _tree

DEAD_KEEP = 60.0  # seconds a dead worker stays on the list swept if the supervisor dies too
KILL_WAIT = 5.0  # seconds the killed workers are waited for before the sweep


class _Worker:
    __slots__ = ("baton", "cgroup", "died", "fd", "marker", "pid", "start")

    def __init__(
        self, pid: int, start: int | None, cgroup: str | None, marker: str | None, baton: int
    ) -> None:
        self.pid = pid
        self.start = start
        self.cgroup = cgroup
        self.marker = marker
        self.baton = baton
        self.fd = -1
        self.died = 0.0


def register(sock_fd: int, baton: int, cgroup: str | None, marker: str | None) -> bool:
    """In a worker: hand the watcher this process's identity and a copy of the baton's read end;
    False if the watcher is gone (the caller forks its own guardian instead). ``sock_fd`` is closed
    either way: nothing the worker forks later holds it."""
    me = os.getpid()
    msg = f"{me} {_tree.start_time(me)} {cgroup or '-'} {marker or '-'}".encode()
    try:
        sock = socket.socket(fileno=sock_fd)
    except OSError:
        return False
    try:
        sock.setblocking(True)
        socket.send_fds(sock, [msg], [baton])
        return True
    except OSError:
        return False
    finally:
        sock.close()


def start(life_fd: int) -> tuple[int, int]:
    """In the zygote: fork the watcher; returns (its pid, the registration socket's end that the
    workers inherit)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid:
        ours.close()
        return pid, theirs.detach()
    try:
        theirs.close()
        # Nothing of the zygote's but the life pipe and our output: its request socket and its
        # answer pipe must reach EOF when the zygote goes, whether or not we are still here.
        keep = {0, 1, 2, life_fd, ours.fileno()}
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in keep:
                with contextlib.suppress(OSError):  # (the listing's own descriptor)
                    os.close(fd)
        _run(life_fd, ours)
    finally:
        os._exit(0)


def _run(life_fd: int, reg: socket.socket) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _tree.set_parent_death_signal(0)  # it must outlive the supervisor and the zygote
    poller = select.poll()
    poller.register(life_fd, select.POLLIN)
    poller.register(reg.fileno(), select.POLLIN)
    live: dict[int, _Worker] = {}  # pidfd -> worker
    dead: list[_Worker] = []
    bye = False
    while not (bye and not live):
        try:
            events = poller.poll(None)
        except InterruptedError:
            continue
        for fd, _ in events:
            if fd == life_fd:
                if _life_lost(life_fd):
                    _supervisor_gone(list(live.values()), dead)
                    return
            elif fd == reg.fileno():
                worker = _take(reg)
                if worker is BYE:
                    bye = True  # the supervisor closed the zygote: it sweeps what is left itself
                    continue
                if worker is None:
                    # EOF without a goodbye: the zygote was killed (a host killing its children).
                    # Wait for the workers, and for the supervisor's death to sweep after them.
                    poller.unregister(reg.fileno())
                    continue
                if not _watch(worker):
                    _worker_gone(worker, dead)
                    continue
                live[worker.fd] = worker
                poller.register(worker.fd, select.POLLIN)
            elif fd in live:
                worker = live.pop(fd)
                poller.unregister(fd)
                _worker_gone(worker, dead)
        cutoff = time.monotonic() - DEAD_KEEP
        if dead and dead[0].died < cutoff:
            dead[:] = [w for w in dead if w.died >= cutoff]


def _life_lost(fd: int) -> bool:
    try:
        return not os.read(fd, 1)
    except BlockingIOError:
        return False
    except OSError:
        return True


def goodbye(sock_fd: int) -> None:
    """In the zygote, leaving because the supervisor closed its requests (not killed): the
    watcher exits once its last worker has, without waiting for the supervisor's death."""
    with contextlib.suppress(OSError):
        os.write(sock_fd, BYE_MSG)


BYE_MSG = b"bye"
BYE = _Worker(0, None, None, None, -1)  # ``_take``: the zygote's goodbye


def _take(reg: socket.socket) -> _Worker | None:
    """One registration; None on EOF, ``BYE`` on the zygote's goodbye. A malformed one is dropped
    (a dummy that is never watched)."""
    try:
        data, fds, _, _ = socket.recv_fds(reg, 4096, 1)
    except OSError:
        return None
    if not data:
        return None
    if data == BYE_MSG and not fds:
        return BYE
    try:
        pid_text, start_text, cgroup, marker = data.decode().split(" ")
        baton = fds[0]
        return _Worker(
            int(pid_text),
            None if start_text == "None" else int(start_text),
            None if cgroup == "-" else cgroup,
            None if marker == "-" else marker,
            baton,
        )
    except (ValueError, IndexError):
        for fd in fds:
            os.close(fd)
        return _Worker(0, None, None, None, -1)


def _watch(worker: _Worker) -> bool:
    """Open the worker's pidfd; False if it is gone already (or was never a worker)."""
    if worker.pid <= 0:
        return False
    try:
        worker.fd = os.pidfd_open(worker.pid)
    except OSError:
        return False
    if worker.start is not None and _tree.start_time(worker.pid) != worker.start:
        os.close(worker.fd)  # the pid names another process now: ours exited
        worker.fd = -1
        return False
    return True


def _release(worker: _Worker) -> None:
    for name in ("fd", "baton"):
        fd = getattr(worker, name)
        if fd >= 0:
            os.close(fd)
            setattr(worker, name, -1)


def _worker_gone(worker: _Worker, dead: list[_Worker]) -> None:
    """The worker exited, its supervisor alive: kill and remove its cgroup now (what it left there
    dies at once); otherwise the supervisor sweeps its session and marker itself."""
    _release(worker)
    if worker.pid <= 0:
        return
    if worker.cgroup is not None and os.path.isdir(worker.cgroup):
        _cgroup.kill_and_remove(worker.cgroup)
    worker.died = time.monotonic()
    dead.append(worker)


def _take_baton(worker: _Worker) -> bool:
    try:
        return os.read(worker.baton, 1) == b"x"
    except OSError:  # taken already: the worker is killing its tree itself
        return False


def supervisor_gone(
    pid: int, baton: int, kill_wait: float = KILL_WAIT, marker: str | None = None
) -> list[int]:
    """What the watcher does at the supervisor's death, for one worker ``pid`` whose baton's read end
    is ``baton`` (closed here) and whose tree marker is ``marker``, waiting at most ``kill_wait`` for
    it before the sweep; returns the pids whose markers the sweep read. For tests that play a worker
    (``worker.lowlevel``)."""
    worker = _Worker(pid, _tree.start_time(pid), None, marker, baton)
    if _watch(worker):
        return _supervisor_gone([worker], [], kill_wait)
    _release(worker)
    return []


def _supervisor_gone(live: list[_Worker], dead: list[_Worker], kill_wait: float = KILL_WAIT) -> list[int]:
    me = os.getpid()
    for worker in live:
        # WORKER-SHARE-AT-DEATH: the pool's share (WORKER-CPU-SHARE) made each worker's autogroup the
        # lightest; their exits - the kernel's teardown of each process's memory, run at the process's own
        # weight - must not queue behind a loaded machine at it.
        if worker.start is not None and _tree.start_time(worker.pid) == worker.start:
            _tree.set_autogroup_nice(worker.pid, 0)
    for worker in live:
        if worker.baton >= 0:
            os.set_blocking(worker.baton, False)
        # A worker that has not begun on its tree stands by once the baton is ours. One that took it
        # first is killed all the same: we are in no worker's tree, so neither can stop the other for
        # good, and a worker at its pool's weight on a loaded machine took seconds to finish (TREE-WATCHER).
        _take_baton(worker)
        pids = _tree.freeze_tree(worker.pid, include_root=True, exclude=frozenset({me}))
        _tree.signal_all([p for p in pids if p != worker.pid], signal.SIGKILL)
        _tree.signal_all([worker.pid], signal.SIGKILL)  # last: what it forks meanwhile is frozen
    deadline = time.monotonic() + kill_wait
    for worker in live:
        if worker.fd >= 0:
            select.select([worker.fd], [], [], max(0.0, deadline - time.monotonic()))
    for worker in live:
        _release(worker)
    return _sweep([*live, *dead])


def _sweep(workers: list[_Worker]) -> list[int]:
    """Kill what the (dead) workers left: each one's cgroup; then a scan of /proc for what is in a
    dead worker's session (the pid not reused) or carries one of their tree markers. Returns the
    pids whose markers it read.

    TREE-SWEEP-YOUNG: only a process started since the first of these workers can descend from one,
    so only those are looked at: reading a process's markers (its environment, descriptors and
    memory map) costs about 1 ms of CPU here, and a scan of every process on a loaded machine took
    seconds at the watcher's weight. Each later round looks only at what started since the round
    before it began (what it forked meanwhile): nothing is read twice."""
    for worker in workers:
        if worker.cgroup is not None and os.path.isdir(worker.cgroup):
            _cgroup.kill_and_remove(worker.cgroup)
    sessions = {w.pid: w.start for w in workers if w.pid > 0}
    markers = {w.marker for w in workers if w.marker}
    read: list[int] = []
    if not sessions and not markers:
        return read
    starts = [w.start for w in workers if w.pid > 0]
    known = [t for t in starts if t is not None]
    since = min(known) if known and len(known) == len(starts) else 0  # (a start unknown: no filter)
    me = os.getpid()
    stopped: set[int] = {me}
    for _ in range(16):  # bounded: each round only adds what was forked meanwhile
        began = _tree.boot_ticks() - 1  # (a tick early: the kernel's start times are whole ticks)
        found = [
            pid
            for pid in _tree.all_pids()
            if pid not in stopped and _ours(pid, sessions, markers, since, read)
        ]
        if not found:
            break
        for pid in found:
            stopped.add(pid)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        since = began
    stopped.discard(me)
    _tree.signal_all(sorted(stopped), signal.SIGKILL)
    return read


def _ours(pid: int, sessions: dict[int, int | None], markers: set[str], since: int, read: list[int]) -> bool:
    fields = _tree.stat_fields(pid)
    try:
        session, start = int(fields[3]), int(fields[19])  # type: ignore[index]
    except (TypeError, IndexError, ValueError):
        return False  # gone
    if start < since:
        return False  # older than every worker (or looked at by an earlier round)
    if pid in sessions:
        return sessions[pid] is not None and start == sessions[pid]
    if session in sessions:
        # Its worker led this session; a new leader with that pid shows another start time.
        leader = _tree.start_time(session)
        if leader is None or leader == sessions[session]:
            return True
    if not markers:
        return False
    read.append(pid)
    return bool(_tree.markers_of(pid) & markers)
