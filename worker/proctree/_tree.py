"""Process-tree facts shared by the worker and the supervisor: prctl, freeze, list, signal.

Linux only where it says so; elsewhere the prctl calls are no-ops and the tree is the
process group plus what psutil can see.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc = None


def _prctl(option: int, arg: int) -> bool:
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    if _libc is None:
        # "libc.so.6" first: ctypes.util.find_library runs ldconfig (a subprocess, ~1-10 ms), which
        # a worker would otherwise pay at start.
        try:
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:
            from ctypes.util import find_library  # (here: it imports shutil, subprocess and tempfile)

            _libc = ctypes.CDLL(find_library("c") or "libc.so.6", use_errno=True)
    return bool(_libc.prctl(option, arg, 0, 0, 0) == 0)  # ctypes' result is untyped


def set_child_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it instead of to init."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def set_parent_death_signal(sig: int) -> bool:
    """Deliver ``sig`` to this process when the thread that started it exits."""
    return _prctl(PR_SET_PDEATHSIG, int(sig))


def set_autogroup_nice(pid: int | str, nice: int) -> int:
    """Set the autogroup (session) niceness of ``pid`` (0 to 19 needs no privilege; below 0,
    CAP_SYS_NICE: WORKER-SUPERVISOR-WEIGHT). 0 on success, else the errno: ``EAGAIN`` is the kernel's rate
    limit (a process without CAP_SYS_ADMIN may change an autogroup's niceness once per 100 ms, machine-wide);
    anything else (no autogroups here, the process gone, no privilege) is final."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
        return 0
    except OSError as exc:
        return exc.errno or errno.EIO


_HAVE_PROC_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def children(pid: int) -> list[int]:
    """Direct children of ``pid``.

    Reads ``/proc/PID/task/*/children`` (Linux >= 3.5): a few small reads, where psutil scans
    every process on the machine (3-7 ms here, paid several times on each kill)."""
    if not _HAVE_PROC_CHILDREN:
        import psutil  # (here: only a kernel without that file needs it)

        try:
            return [p.pid for p in psutil.Process(pid).children()]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return []
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                data = f.read()
        except OSError:
            continue
        found.extend(int(x) for x in data.split())
    return found


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` that /proc shows (children of children, recursively)."""
    if not _HAVE_PROC_CHILDREN:
        import psutil

        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return []
    out: list[int] = []
    seen = {pid}
    stack = [pid]
    while stack:
        for child in children(stack.pop()):
            if child not in seen:
                seen.add(child)
                out.append(child)
                stack.append(child)
    return out


def _kill(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


# TREE-FREEZE: freeze, then list, then signal.
def freeze_tree(root: int, *, include_root: bool = True, exclude: frozenset[int] = frozenset()) -> list[int]:
    """SIGSTOP ``root`` and every descendant, listing again until nothing new appears.

    A stopped process cannot fork, so the returned list is the whole tree at that moment
    (the root first). Processes listed in ``exclude`` are neither stopped nor returned.
    """
    stopped: list[int] = []
    seen: set[int] = set(exclude)
    if include_root and root not in seen:
        if _kill(root, signal.SIGSTOP):
            stopped.append(root)
        seen.add(root)
    for _ in range(64):  # bounded: each round only adds processes that were forked meanwhile
        new = [pid for pid in descendants(root) if pid not in seen]
        if not new:
            break
        for pid in new:
            seen.add(pid)
            if _kill(pid, signal.SIGSTOP):
                stopped.append(pid)
    return stopped


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        _kill(pid, sig)


def thaw(pids: list[int]) -> None:
    signal_all(pids, signal.SIGCONT)


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` from field 3 (state) on, or None if there is no such
    process (a zombie still has them). The command name (field 2) is in parentheses and may hold
    spaces or ")": the fields start after the last ")"."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()


def _stat_int(pid: int, index: int) -> int | None:
    fields = stat_fields(pid)
    try:
        return None if fields is None else int(fields[index])
    except (IndexError, ValueError):
        return None


def session_of(pid: int) -> int | None:
    """The session id of ``pid`` from /proc (works on zombies too), or None."""
    return _stat_int(pid, 3)  # field 6


def start_time(pid: int) -> int | None:
    """``pid``'s start time in clock ticks since boot (tells a pid from its reuse), or None. With
    the pid, it names one process: a pid reused by a later process comes with a later start time.
    A zombie (exited, not reaped) still has it."""
    return _stat_int(pid, 19)  # field 22


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def boot_ticks() -> int:
    """Now, in ``start_time``'s unit: clock ticks since boot (a process started later shows at least this)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICKS)


# ---- tree markers ---------------------------------------------------------------------
#
# Two markers tell a worker's descendants that left its session (setsid) from everything else:
# the environment variable TURNPOOL_TREE, which exec'd children see (the worker's os.environ is
# what exec passes on), and a memfd named after the marker, which forked children inherit with
# the worker's file descriptors. A child forked without exec keeps the environment block of the
# process image as it was first exec'd: in a zygote-forked worker that is the zygote's, without
# the marker, so the environment alone cannot find it.

TREE_ENV = "TURNPOOL_TREE"
_MARKER_FD = -1
_MARKER_MAP: object = None  # the memfd's mapping, kept for the life of the process (TREE-MARKERS)


def memfd_name(marker: str) -> str:
    return f"turnpool-tree:{marker}"


# TREE-MARKERS: a marker that forks inherit (memfd) besides the environment one.
def mark_tree(marker: str) -> None:
    """Set both markers in this process (a worker, before it forks anything)."""
    global _MARKER_FD, _MARKER_MAP
    os.environ[TREE_ENV] = marker
    if _MARKER_FD < 0 and hasattr(os, "memfd_create"):
        try:
            # Close-on-exec (exec'd children carry the environment marker instead); a fork keeps it.
            _MARKER_FD = os.memfd_create(memfd_name(marker), os.MFD_CLOEXEC)
            # Mapped too: a fork inherits the mapping, which closing every descriptor does not
            # remove (a setsid escapee that also left the worker's cgroup still shows it in
            # /proc/PID/maps). One page of the page cache, never touched.
            os.ftruncate(_MARKER_FD, mmap.PAGESIZE)
            _MARKER_MAP = mmap.mmap(_MARKER_FD, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        except OSError:
            pass


def has_marker(pid: int, marker: str) -> bool:
    """Whether ``pid`` carries ``marker`` in its environment, holds the marker memfd, or has it
    mapped (a fork-only descendant that closed its descriptors)."""
    needle = f"{TREE_ENV}={marker}".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if needle in f.read().split(b"\0"):
                return True
    except OSError:
        pass
    link = f"/memfd:{memfd_name(marker)} (deleted)"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == link:
                return True
        except OSError:
            continue
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return f" {link}\n".encode() in f.read()
    except OSError:
        return False


def markers_of(pid: int) -> frozenset[str]:
    """Every tree marker ``pid`` carries (what ``has_marker`` tests for one marker): the
    environment's, a held marker memfd's, a mapped one's. Read once, it answers for every worker
    (LADDER-ORPHANS: the supervisor classifies each adopted child once, not once per worker exit)."""
    found: set[str] = set()
    prefix = f"{TREE_ENV}=".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(prefix):
                    found.add(entry[len(prefix) :].decode(errors="replace"))
    except OSError:
        pass
    head, tail = f"/memfd:{memfd_name('')}", " (deleted)"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith(head) and link.endswith(tail):
            found.add(link[len(head) : -len(tail)])
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            maps = f.read()
    except OSError:
        maps = b""
    needle = f" {head}".encode()
    at = maps.find(needle)
    while at >= 0:
        end = maps.find(b"\n", at)
        line = maps[at + len(needle) : end if end >= 0 else len(maps)].decode(errors="replace")
        if line.endswith(tail):
            found.add(line[: -len(tail)])
        at = maps.find(needle, at + 1)
    return frozenset(found)


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def kill_descendants(root: int, exclude: frozenset[int] = frozenset(), timeout: float = 3.0) -> list[int]:
    """Freeze, SIGKILL and reap every descendant of ``root`` (this process, a child subreaper)
    but ``exclude``. Waits on pidfds for the exits (a killed grandchild is re-parented to us
    once its parent is gone), then reaps each by pid: never ``waitpid(-1)``. Returns the pids."""
    import select

    pids = freeze_tree(root, include_root=False, exclude=exclude)
    fds = []
    for pid in pids:
        with contextlib.suppress(OSError, AttributeError):
            fds.append(os.pidfd_open(pid))
    signal_all(pids, signal.SIGKILL)
    try:
        poller = select.poll()
        waiting = set(fds)
        for fd in fds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break  # a process stuck in uninterruptible sleep: not ours to wait forever for
            for fd, _ in poller.poll(left * 1000):
                waiting.discard(fd)
                poller.unregister(fd)
    finally:
        for fd in fds:
            os.close(fd)
    for pid in [*pids, *children(root)]:
        if pid in exclude:
            continue
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    return pids
