"""Worker processes as the supervisor sees them: start, watch, signal the tree, reap.

Exits become events through ``pidfd_open`` (no polling loop, no ``waitpid(-1)`` that would
steal statuses from the host's own subprocess handling): each pid is reaped by number.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
from collections.abc import Iterable
from typing import Any

import anyio
import psutil

from worker import proctree

log = logging.getLogger("turnpool.supervisor")

TREE_ENV = proctree.TREE_ENV

# Worker pid -> its cgroup v2 directory, for workers that run in one. Kept here (not passed by
# every caller) so that each escalation step, retire and unreachable-worker kill gets the
# atomic ``cgroup.kill`` without knowing about cgroups.
CGROUPS: dict[int, str] = {}
TOKEN_ENV = "TURNPOOL_SPAWN_TOKEN"


def spawn_worker(
    *,
    endpoint: str,
    worker_id: str,
    token: str,
    marker: str,
    life_fd: int,
    heartbeat: float,
    out_fd: int,
    cwd: str,
    pythonpath: str,
    python: str | None = None,
    extra_args: Iterable[str] = (),
    cgroup: str | None = None,
    own_fds: tuple[int, int] = (-1, -1),
) -> int:
    """Start ``python -P -m worker`` in its own session with ``out_fd`` as its stdout and stderr
    (never our stderr: ``_output``), importing from ``pythonpath`` only (WORKER-PATH), and moving to
    ``cwd`` (its own directory: WORKER-CWD) before it imports anything of an agent. ``own_fds``: its
    start marker and End log (SEC-WORKER-FILES), inherited at numbers above every fd it is given."""
    exe = python or sys.executable
    actions = output_actions(out_fd)
    own_args: list[str] = []
    target = max(2, out_fd, life_fd, *own_fds) + 1
    for flag, fd in zip(("--marker-fd", "--endlog-fd"), own_fds, strict=True):
        if fd >= 0:
            # dup2 to a number no other source uses: the copy is inherited (no close-on-exec),
            # while our own descriptor stays close-on-exec for every other child.
            actions.append((os.POSIX_SPAWN_DUP2, fd, target))
            own_args += [flag, str(target)]
            target += 1
    argv = [
        exe,
        *SAFE_FLAGS,
        *extra_args,
        "-m",
        "worker",
        "--endpoint",
        endpoint,
        "--id",
        worker_id,
        "--parent-pid",
        str(os.getpid()),
        "--life-fd",
        str(life_fd),
        "--heartbeat",
        repr(heartbeat),
        "--cwd",
        cwd,
        *(("--cgroup", cgroup) if cgroup else ()),
        *own_args,
    ]
    env = worker_env(pythonpath)
    if own_fds[0] < 0:
        # no start marker to carry it (SEC-WORKER-FILES: it is carried there otherwise)
        env[TOKEN_ENV] = token
    env[TREE_ENV] = marker
    # An empty signal mask, whatever the spawning thread blocks (a blocking front's loop thread
    # blocks SIGINT so Ctrl-C reaches the main thread; Ray's workers start with SIGINT blocked).
    return os.posix_spawn(exe, argv, env, setsid=True, setsigmask=(), file_actions=actions)


# ``-P`` (Python ≥ 3.11 safe-path mode): ``-m`` no longer puts the current directory first on
# ``sys.path``. A flag, not ``PYTHONSAFEPATH`` in the environment, so that it stays with the
# worker: an agent's own ``python tool.py`` subprocesses keep Python's usual path rules.
SAFE_FLAGS = ("-P",)


def output_actions(out_fd: int) -> list[tuple[int, int, int]]:
    """posix_spawn file actions making ``out_fd`` the child's fd 1 and fd 2."""
    return [(os.POSIX_SPAWN_DUP2, out_fd, 1), (os.POSIX_SPAWN_DUP2, out_fd, 2)]


def check_agent_path(value: Any) -> tuple[str, ...] | None:
    """Validate ``Supervisor(agent_path=...)``: ``None`` or a sequence of directories, made
    absolute now (a relative one means the current directory of the call, said explicitly)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, os.PathLike)) or not isinstance(value, Iterable):
        raise TypeError(f"agent_path must be a list of directories (or None), got {value!r}")
    out = []
    for entry in value:
        if not isinstance(entry, (str, os.PathLike)) or isinstance(entry, bytes) or not str(entry):
            raise TypeError(f"agent_path entries must be directory paths, got {entry!r}")
        path = os.path.abspath(os.fspath(entry))
        if not os.path.isdir(path):
            raise ValueError(f"agent_path entry {entry!r} is not a directory")
        out.append(path)
    return tuple(out)


def import_path(agent_path: tuple[str, ...] | None) -> str:
    """The ``PYTHONPATH`` of workers (WORKER-PATH).

    ``None`` (an embedded ``Supervisor``'s default): the host's own ``sys.path`` as it is now,
    the embedding program's choice (its script's directory, pytest's rootdir); an empty entry,
    which means "the current directory" in the host, is written out as the host's cwd, since the
    worker runs elsewhere. Otherwise exactly ``agent_path`` (absolute directories), then the
    absolute entries of an inherited ``PYTHONPATH``: relative and empty entries, which would
    mean whatever directory the process started in, are left out. Either way the interpreter's
    own path (standard library, site-packages, installed packages) follows.
    """
    if agent_path is None:
        cwd = os.getcwd()
        entries = [os.path.join(cwd, p) if not os.path.isabs(p) else p for p in sys.path]
    else:
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
        entries = [*agent_path, *inherited]
    return os.pathsep.join(dict.fromkeys(os.path.normpath(p) for p in entries))


def worker_env(pythonpath: str) -> dict[str, str]:
    """The environment a worker (or the zygote) starts with: ours, with ``pythonpath``."""
    env = dict(os.environ)
    env.pop(TOKEN_ENV, None)
    env.pop(TREE_ENV, None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    else:
        env.pop("PYTHONPATH", None)
    return env


def lower_priority(pid: int, nice: int) -> None:
    """WORKER-NICE: run worker ``pid`` at niceness ``nice``: its session's autogroup (the kernel weighs
    each session as one: a worker leads its own, so it would otherwise get as large a share of the
    CPUs as its supervisor) and each of its threads (new threads and processes inherit it). Best
    effort: a worker already gone, or a kernel without autogroups, is skipped."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, int(tid)) < nice:
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except OSError:
            pass


def pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def exited(fd: int) -> bool:
    """Whether the process behind pidfd ``fd`` has exited already (a poll that does not wait)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


async def wait_exit(pid: int, fd: int | None) -> None:
    """Return once ``pid`` has exited (it may still need reaping). LADDER-REAP: a process already gone
    costs no turn of the event loop (the descendants a killed worker SIGKILLed itself usually are)."""
    if fd is not None:
        if not exited(fd):
            await anyio.wait_readable(fd)
        return
    # No pidfd (old kernel): bounded back-off polling, the only fallback there is.
    delay = 0.001
    while alive(pid):
        await anyio.sleep(delay)
        delay = min(delay * 2, 0.05)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rfind(b")") + 2 : data.rfind(b")") + 3] != b"Z"
    except OSError:
        return False


def reap(pid: int) -> int | None:
    """Collect ``pid``'s exit status if it is our child and has exited; the exit code
    (negative: the signal), or None when it is not ours to reap or not dead yet."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if got == 0:
        return None
    return os.waitstatus_to_exitcode(status)


# TREE-FREEZE: the fallback kill of a tree (freeze, list, signal); TREE-CGROUP first where it can.
def signal_tree(pid: int, sig: int, *, known: set[int]) -> list[int]:
    """Freeze the worker's tree, signal every process in it and its process group, thaw it
    (unless the signal is SIGKILL; for any other signal the worker itself is never frozen, and
    is signalled before its descendants: LADDER-TERM-FIRST). Adds what it found to ``known``; returns the
    pids."""
    if pid <= 0:  # a worker whose pid is not known yet (zygote fork in flight): never signal 0 or -1
        return []
    cgroup = CGROUPS.get(pid)
    if cgroup is not None and sig == signal.SIGKILL:
        proctree.cgroup_kill(cgroup)  # atomic: nothing in the worker's cgroup forks past it
    if sig != signal.SIGKILL:
        # LADDER-TERM-FIRST: the worker itself is never stopped: its descendants are frozen and listed
        # first (stopped, none of them forks), then the worker is signalled - its handler, which
        # kills its whole tree itself (LADDER-NO-WAIT), starts at once instead of after a SIGSTOP and a
        # SIGCONT that wake and park every one of its threads - then they are. The listing is made
        # before the worker's handler kills them: a descendant it reaps away from the worker by
        # re-parenting is in ``known``, for the reaping (LADDER-STEPS) after the worker's exit.
        pids = [pid, *proctree.freeze_tree(pid, include_root=False)]
        known.update(pids)
        for target in (pid, -pid):  # the worker, then its process group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, sig)
        proctree.signal_all(pids[1:], sig)
        proctree.thaw(pids[1:])
        return pids
    pids = proctree.freeze_tree(pid)
    known.update(pids)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # the worker leads its own session and group
    proctree.signal_all(pids, sig)
    if sig != signal.SIGKILL:
        proctree.thaw(pids)
    return pids


# TREE-CGROUP: cgroup.kill, then reap by pidfd, then remove.
async def kill_cgroup(path: str) -> list[int]:
    """Kill everything in a dead worker's cgroup at once, wait for each process to exit (pidfds,
    no polling) and reap those that became our children; returns the pids seen."""
    seen: list[int] = []
    if not proctree.cgroup_populated(path):
        # LADDER-SETTLE: the usual case once a killed worker's handler has killed its own tree: one
        # read, not a kill, a listing and a read (nothing can join a cgroup with no live member).
        return seen
    for _ in range(8):
        proctree.cgroup_kill(path)
        pids = [p for p in proctree.cgroup_procs(path) if p not in seen]
        if not pids and not proctree.cgroup_populated(path):
            break
        seen.extend(pids)
        await kill_and_reap(pids)
    return seen


async def kill_and_reap(pids: Iterable[int]) -> None:
    """SIGKILL each pid (a descendant of a dead worker), wait for it to exit, reap it if it
    became our child. Pids already gone are skipped."""
    fds: list[tuple[int, int | None]] = []
    for pid in pids:
        fd = pidfd(pid)
        if fd is None and not alive(pid):
            reap(pid)
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:
            if fd is not None:
                os.close(fd)
            continue
        fds.append((pid, fd))
    for pid, fd in fds:
        try:
            with anyio.move_on_after(5):
                await wait_exit(pid, fd)
        finally:
            if fd is not None:
                os.close(fd)
        reap(pid)


def rss_of_tree(pid: int) -> int:
    """Resident memory of the worker and all its descendants, in bytes (summed RSS: shared
    pages count once per process that maps them)."""
    try:
        proc = psutil.Process(pid)
        total = proc.memory_info().rss
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total
    except (psutil.Error, OSError):  # OSError: no descriptor free to read /proc (WORKER-FD-RETRY)
        return 0


def tree_pids(pid: int) -> list[int]:
    """The worker and every process of its tree: its cgroup's members where it has one (nothing
    escapes it), else its descendants (it is their child subreaper)."""
    cgroup = CGROUPS.get(pid)
    if cgroup is not None:
        pids = proctree.cgroup_procs(cgroup)
        if pids:
            return pids
    return [pid, *proctree.descendants(pid)]


# MEM-PSS: memory is PSS.
def memory_of_tree(pid: int) -> int:
    """Proportional set size (PSS) of the worker's whole tree, in bytes: each shared page is
    split between the processes that map it, so 500 forked children of a 46 MiB worker count
    about 46 MiB, not 500 times that. What ``max_rss_mb`` is compared with."""
    try:
        return proctree.cgroup_pss_bytes(tree_pids(pid))
    except OSError:  # no descriptor free to read /proc (WORKER-FD-RETRY): unknown now, read again next time
        return 0
