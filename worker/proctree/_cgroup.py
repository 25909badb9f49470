"""cgroup v2 facts shared by the worker and the supervisor: find the unified hierarchy, make a
pool cgroup per supervisor and one child per worker, join, kill, wait until empty, remove.

Why: a process tree can be escaped (``setsid``, double fork, a marker that a fork-only child
never sees); a cgroup cannot. Every process a worker forks is born in the worker's cgroup and
stays there, so ``cgroup.kill`` stops the whole tree atomically, as systemd's
``KillMode=control-group`` does. Used only where the unified hierarchy is mounted, the kernel
has ``cgroup.kill`` (Linux >= 5.14) and the supervisor's own cgroup is writable; otherwise the
caller keeps the subreaper + freeze-and-signal + tree-marker path (see ``_tree``).

Layout: ``<supervisor's own v2 cgroup>/turnpool-<pid>-<start time>-<random>/<worker id>``. The pool name
carries its owner's pid and start time, so a pool left by a supervisor killed with SIGKILL is
recognised (owner gone) and swept at the next start. No controller is enabled in the pool:
the cgroups only group processes, so "no internal processes" never applies.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import time

POOL_PREFIX = "turnpool-"

_mount: str | bool | None = False  # False: not looked up yet


def unified_mount() -> str | None:
    """Where the cgroup v2 hierarchy is mounted (from /proc/self/mountinfo, fstype cgroup2)."""
    global _mount
    if _mount is False:
        _mount = None
        try:
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    pre, _, post = line.partition(" - ")
                    if post.split(" ", 1)[0] == "cgroup2":
                        _mount = pre.split(" ")[4]
                        break
        except OSError:
            pass
    return _mount  # type: ignore[return-value]


# TREE-CGROUP; TREE-ZOMBIES: removed=True still names a removed cgroup's zombies.
def cgroup_of(pid: int | str = "self", *, removed: bool = False) -> str | None:
    """The filesystem path of ``pid``'s cgroup v2 (zombies included), or None.

    A zombie keeps the cgroup it died in even after that cgroup is removed; the kernel then
    lists it with a " (deleted)" suffix. ``removed=True`` still returns that path, which is how
    the supervisor recognises, by its worker's cgroup, a zombie whose cgroup the guardian
    already emptied and removed (a path is never reused while its pool lives: the pool name
    has a random tail and worker ids are never reused)."""
    mount = unified_mount()
    if mount is None:
        return None
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    rel = line[3:].strip()
                    if rel.endswith(" (deleted)"):
                        if not removed:
                            return None
                        rel = rel[: -len(" (deleted)")]
                    return os.path.normpath(mount + rel)
    except OSError:
        pass
    return None


def usable() -> bool:
    """Whether a pool could be made here: a v2 hierarchy, our own cgroup writable (root, or a
    delegated subtree) and a kernel with ``cgroup.kill`` (the root cgroup has none: a pool made
    under it is checked by ``Pool.create``)."""
    own = cgroup_of()
    if own is None or not os.access(own, os.W_OK):
        return False
    return os.path.exists(os.path.join(own, "cgroup.kill")) or own == os.path.normpath(str(unified_mount()))


def _write(path: str, data: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def join(path: str) -> bool:
    """Move the calling process into ``path``; False if that is not allowed."""
    try:
        _write(os.path.join(path, "cgroup.procs"), "0")
        return True
    except OSError:
        return False


def procs(path: str) -> list[int]:
    """Live processes in ``path`` (not its children cgroups; zombies are not listed)."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "rb") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def populated(path: str) -> bool:
    """Whether any live process is in ``path`` or below it."""
    try:
        with open(os.path.join(path, "cgroup.events"), "rb") as f:
            return b"populated 1" in f.read()
    except OSError:
        return False


def kill(path: str) -> bool:
    """SIGKILL every process in ``path`` and below, atomically (forks in flight included)."""
    try:
        _write(os.path.join(path, "cgroup.kill"), "1")
        return True
    except FileNotFoundError:
        return False
    except OSError:
        # Very old kernels have no cgroup.kill: signal what is listed, deepest first.
        for sub, _dirs, _files in os.walk(path, topdown=False):
            for pid in procs(sub):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        return True


def wait_empty(path: str, timeout: float) -> bool:
    """Block until nothing lives in ``path`` (``populated 0``), at most ``timeout`` seconds.
    ``cgroup.events`` signals each change with POLLPRI, so this is event-driven, not polled."""
    deadline = time.monotonic() + timeout
    try:
        fd = os.open(os.path.join(path, "cgroup.events"), os.O_RDONLY)
    except OSError:
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI | select.POLLERR)
        while True:
            if b"populated 0" in os.pread(fd, 4096, 0):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(min(left, 1.0) * 1000)  # 1 s cap: a missed notification costs a re-read, no more
    except OSError:
        return True
    finally:
        os.close(fd)


def remove(path: str) -> bool:
    """rmdir ``path`` and any cgroups below it (deepest first). False if one is still populated."""
    ok = True
    for sub, _dirs, _files in os.walk(path, topdown=False):
        try:
            os.rmdir(sub)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                ok = False
    return ok


def kill_and_remove(path: str, timeout: float = 5.0) -> bool:
    """Kill everything in ``path``, wait until it is empty, remove it."""
    if not os.path.isdir(path):
        return True
    kill(path)
    wait_empty(path, timeout)
    return remove(path)


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()[19].decode()


class Pool:
    """The supervisor's pool cgroup: one child cgroup per worker."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def create(cls) -> Pool | None:
        """Sweep stale pools of dead supervisors, then make ours; None where cgroups cannot be used."""
        if not usable():
            return None
        own = cgroup_of()
        assert own is not None
        sweep_stale(own)
        me = os.getpid()
        # A random tail: several supervisors may live in one process, each with its own pool.
        path = os.path.join(own, f"{POOL_PREFIX}{me}-{_start_time(me)}-{os.urandom(4).hex()}")
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        except OSError:
            return None
        if not os.path.exists(os.path.join(path, "cgroup.kill")):
            remove(path)
            return None
        return cls(path)

    def worker_dir(self, worker_id: str) -> str | None:
        path = os.path.join(self.path, worker_id)
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        except OSError:
            return None
        return path

    def close(self, timeout: float = 5.0) -> bool:
        return kill_and_remove(self.path, timeout)


def sweep_stale(own: str) -> list[str]:
    """Kill and remove pool cgroups (under our own cgroup) whose owner is gone: a supervisor
    killed with SIGKILL leaves its pool behind. The owner is matched by pid and start time."""
    swept: list[str] = []
    try:
        entries = os.listdir(own)
    except OSError:
        return swept
    for name in entries:
        if not name.startswith(POOL_PREFIX):
            continue
        pid_s, _, rest = name[len(POOL_PREFIX) :].partition("-")
        start = rest.partition("-")[0]
        try:
            pid = int(pid_s)
        except ValueError:
            continue
        if _start_time(pid) == start:
            continue  # its supervisor is alive (this process's other supervisors included)
        path = os.path.join(own, name)
        if kill_and_remove(path):
            swept.append(path)
    return swept


def pss_bytes(pids: list[int]) -> int:
    """Proportional set size summed over ``pids``: shared pages are split between the processes
    that map them, so N forked children of one worker count about one worker, not N."""
    total = 0
    for pid in pids:
        total += _pss(pid)
    return total


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            data = f.read()
    except OSError:
        return _rss(pid)
    start = data.find(b"\nPss:")
    if start < 0:
        return _rss(pid)
    return int(data[start + 5 : data.index(b"kB", start)]) * 1024


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0
