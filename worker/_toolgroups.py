"""Where an isolated call's limits live: what enforces the call's ``Limits`` (``_toollimits``) here
(``backend``), and its cgroups (``Groups``: made by the caller, joined by the call's process before it runs
anything, kept for reuse or removed after it, TOOL-REUSE-GROUPS); the groups a killed caller left are swept
by the next."""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ._toollimits import Limits
from .proctree import _cgroup

MIB = 1024 * 1024
EXIT_S = 2.0  # the longest a set of groups waits for the exit of their last call's process (TOOL-LADDER)

# ---- where the limits live ------------------------------------------------------------------


def _v1_mounts() -> dict[str, str]:
    """controller -> mount point of each cgroup v1 hierarchy."""
    found: dict[str, str] = {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                pre, _, post = line.partition(" - ")
                parts = post.split()
                if len(parts) >= 3 and parts[0] == "cgroup":
                    for opt in parts[2].split(","):
                        if opt in ("memory", "pids", "cpu"):
                            found[opt] = pre.split(" ")[4]
    except OSError:
        pass
    return found


def _v1_own(controller: str) -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, names, path = line.rstrip("\n").split(":", 2)
                if controller in names.split(","):
                    return path
    except (OSError, ValueError):
        pass
    return None


_backend: dict[str, Any] | None = None


def backend() -> dict[str, Any]:
    """What enforces each limit here: ``{"containment": "cgroup2" | "tree", "memory": ..., ...}``."""
    global _backend
    if _backend is None:
        own = _cgroup.cgroup_of()
        contain = "cgroup2" if own is not None and os.access(own, os.W_OK) else "tree"
        controllers: set[str] = set()
        if own is not None:
            with contextlib.suppress(OSError), open(os.path.join(own, "cgroup.subtree_control")) as f:
                controllers = set(f.read().split())
        v1 = _v1_mounts()
        out: dict[str, Any] = {"containment": contain}
        for name in ("memory", "pids", "cpu"):
            if name in controllers:
                out[name] = "cgroup2"
            elif name in v1 and os.access(
                os.path.join(v1[name], (_v1_own(name) or "/").lstrip("/")), os.W_OK
            ):
                out[name] = "cgroup1"
            else:
                out[name] = "rlimit"
        _backend = out
    return _backend


_swept = False


def sweep_stale_groups() -> list[str]:
    """Remove call groups left in the v1 hierarchies by a caller killed with SIGKILL (its v2 group
    went with the worker's cgroup, or is swept as a pool is). Named like pools: owner pid and start."""
    global _swept
    _swept = True
    gone: list[str] = []
    v1 = _v1_mounts()
    own = _cgroup.cgroup_of()
    for name in ("memory", "pids", "v2"):
        if name == "v2":
            if own is None:
                continue
            parent = own  # the kept groups of a caller killed with SIGKILL (TOOL-REUSE-GROUPS)
        elif name not in v1:
            continue
        else:
            parent = os.path.join(v1[name], (_v1_own(name) or "/").lstrip("/"))
        try:
            entries = os.listdir(parent)
        except OSError:
            continue
        for entry in entries:
            if not (entry.startswith(_cgroup.POOL_PREFIX) and "-call" in entry):
                continue
            pid_s, start = entry[len(_cgroup.POOL_PREFIX) :].split("-")[:2]
            if not pid_s.isdigit() or _cgroup._start_time(int(pid_s)) == start:
                continue  # its owner lives
            path = os.path.join(parent, entry)
            for pid in _cgroup.procs(path):  # v1 has no cgroup.kill
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if _cgroup.remove(path):
                gone.append(path)
    return gone


_pid = os.getpid()  # this process's pid (a system call each time asked of the kernel; kept here)


def _me() -> int:
    return _pid


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)

_placed: tuple[int, tuple[str, str | None, dict[str, str]]] | None = None


def _place() -> tuple[str, str | None, dict[str, str]]:
    """(the name prefix of this process's call groups, its own v2 cgroup, the v1 parent of each
    controller), read once per process (a forked child reads its own)."""
    global _placed
    me = _me()
    if _placed is None or _placed[0] != me:
        # Named like a pool (owner pid and start time): one left by a caller killed with SIGKILL is swept.
        prefix = f"{_cgroup.POOL_PREFIX}{me}-{_cgroup._start_time(me)}-call"
        v1 = _v1_mounts()
        parents = {name: os.path.join(v1[name], (_v1_own(name) or "/").lstrip("/")) for name in v1}
        _placed = (me, (prefix, _cgroup.cgroup_of(), parents))
    return _placed[1]


def _read(path: str) -> bytes:
    """A cgroup file's text ("" if it cannot be read): plain system calls, which cost a tenth of a
    buffered ``open`` on some v1 files (``memory.oom_control``: ~0.35 ms that way, ~15 us this way)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return b""
    finally:
        os.close(fd)


@dataclass
class Groups:
    """The call's cgroups (made by the parent before the fork, removed after the call)."""

    limits: Limits
    contain: str | None = None  # v2 directory: every process of the call, whatever it does
    dirs: dict[str, str] = field(default_factory=dict)  # controller -> directory with the limit
    base: dict[str, int] = field(default_factory=dict)
    v2: dict[str, bool] = field(default_factory=dict)
    owner: int = field(default_factory=_me)
    kind: str | None = None  # the template kind whose calls use them (None: forked by the caller)
    template: Any = None  # that template: asked for an embryo in them once they are kept (TOOL-EMBRYO)
    embryo_of: Any = None  # the template that has an embryo waiting in them (kept groups)
    env: dict[str, str] | None = None  # the environment of their last call (their embryo's)
    spawner: Any = None  # TOOL-SPAWNER: the process standing in them that starts their commands
    embryo: Any = None  # TOOL-EMBRYO-DIRECT: the next function call's process, waiting in them
    killed: bool = False  # killed since their spawner stood in them (it went with the kill)
    opened: dict[str, int] = field(default_factory=dict)  # their files read after each call, kept open
    # TOOL-LADDER: a pidfd of their last call's process, which wrote its outcome marked final (alone in
    # them, running nothing more) and may be exiting still: waited for before they are used again.
    exiting: int | None = None

    @classmethod
    def make(cls, limits: Limits, kind: str | None = None) -> Groups:
        if limits.cgroups is False:
            return cls(limits, kind=kind)
        be = backend()
        if not _swept:
            sweep_stale_groups()
        kept = _take_kept(limits, kind)
        if kept is not None:
            return kept
        return cls._new(limits, kind, be)

    @classmethod
    def _new(cls, limits: Limits, kind: str | None, be: dict[str, Any]) -> Groups:
        g = cls(limits, kind=kind)
        prefix, own, parents = _place()
        tag = prefix + os.urandom(4).hex()
        if be["containment"] == "cgroup2" and own is not None:
            path = os.path.join(own, tag)
            with contextlib.suppress(OSError):
                os.mkdir(path)
                g.contain = path
        for name in ("memory", "pids", "cpu"):
            want = {"memory": limits.memory_mb, "pids": limits.pids, "cpu": None}[name]
            if want is None or be[name] == "rlimit":
                continue
            if be[name] == "cgroup2":
                if g.contain is None:
                    continue
                path = g.contain  # the controller is delegated to our children: the call's own group
            else:
                path = os.path.join(parents[name], tag)
            try:
                os.makedirs(path, exist_ok=True)
                if name == "memory":
                    limit = str(int(float(want) * MIB))
                    _cgroup._write(
                        os.path.join(
                            path, "memory.max" if be[name] == "cgroup2" else "memory.limit_in_bytes"
                        ),
                        limit,
                    )
                    # Swap is no way around the limit: none (v2), or memory + swap at the same bound (v1).
                    swap = (
                        ("memory.swap.max", "0")
                        if be[name] == "cgroup2"
                        else ("memory.memsw.limit_in_bytes", limit)
                    )
                    with contextlib.suppress(OSError):
                        _cgroup._write(os.path.join(path, swap[0]), swap[1])
                else:
                    _cgroup._write(os.path.join(path, "pids.max"), str(int(want)))
            except OSError:
                if path != g.contain:
                    with contextlib.suppress(OSError):
                        os.rmdir(path)
                continue
            g.dirs[name] = path
            g.v2[name] = be[name] == "cgroup2"
        g.base = {"oom": 0, "pids": 0}  # (a new group's counters)
        return g

    def paths(self) -> list[str]:
        return list(dict.fromkeys(p for p in [self.contain, *self.dirs.values()] if p is not None))

    def join(self) -> None:
        """In the child: move into every group (before anything of the call runs)."""
        for path in self.paths():
            if path is not None:
                _cgroup._write(os.path.join(path, "cgroup.procs"), "0")

    def _counter(self, name: str, file: str, key: bytes) -> int:
        path = self.dirs.get(name)
        if path is None:
            return 0
        with contextlib.suppress(ValueError, IndexError):
            for line in self._file(os.path.join(path, file)).splitlines():
                if line.startswith(key + b" "):
                    return int(line.split()[1])
        return 0

    def oom_kills(self) -> int:
        file = "memory.events" if self.v2.get("memory") else "memory.oom_control"
        return self._counter("memory", file, b"oom_kill")

    def pids_hits(self) -> int:
        return self._counter("pids", "pids.events", b"max")

    def cpu_seconds(self) -> float | None:
        if self.contain is None:
            return None
        try:
            with open(os.path.join(self.contain, "cpu.stat"), "rb") as f:
                for line in f:
                    if line.startswith(b"usage_usec "):
                        return int(line.split()[1]) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def members(self) -> list[int]:
        """The call's processes (the groups' spawner is not the call's)."""
        if self.contain is None:
            return []
        found = [int(x) for x in self._file(os.path.join(self.contain, "cgroup.procs")).split()]
        if self.spawner is not None and self.spawner.pid in found:
            found.remove(self.spawner.pid)
        return found

    def _file(self, path: str) -> bytes:
        """A file of theirs, read afresh: opened once, then one ``pread`` at offset 0 per read (a
        cgroup file's content is made anew at each read from 0), so the reads at each call's end cost
        one system call each, not four."""
        fd = self.opened.get(path)
        if fd is None:
            try:
                fd = self.opened[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return b""
        try:
            data = os.pread(fd, 65536, 0)
        except OSError:
            return b""
        return data if len(data) < 65536 else _read(path)

    def close_files(self) -> None:
        opened, self.opened = self.opened, {}
        for fd in opened.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    def populated(self) -> bool:
        """Whether anything of the call lives in them (one read)."""
        if self.contain is None:
            return False
        if self.spawner is None:
            return b"populated 1" in self._file(os.path.join(self.contain, "cgroup.events"))
        return bool(self.members())

    def kill(self) -> None:
        for path in self.paths():
            _cgroup.kill(path)  # v1: no cgroup.kill; signals what is listed
        self.killed = True  # (their spawner with them: let go once the call's status is read)

    def set_spawner(self, spawner: Any) -> None:
        """TOOL-SPAWNER: ``spawner`` stands in them from now on: their pids limit counts it on top
        of the call's own."""
        if self.spawner is not None:
            self.spawner.close()
        self.spawner, self.killed = spawner, False
        if spawner is not None and "pids" in self.dirs and self.limits.pids is not None:
            with contextlib.suppress(OSError):
                _cgroup._write(os.path.join(self.dirs["pids"], "pids.max"), str(self.limits.pids + 1))

    def spawner_counted(self) -> None:
        """TOOL-SPAWNER: once their spawner stands in them, its memory is added to their memory limit:
        what it wrote after its move is charged to them (~0.3-0.5 MiB), and is not the call's."""
        want = self.limits.memory_mb
        if "memory" not in self.dirs or want is None:
            return
        held = self._counter("memory", "memory.stat", b"anon" if self.v2.get("memory", False) else b"rss")
        self._memory_limit(int(float(want) * MIB) + held)

    def _memory_limit(self, nbytes: int) -> None:
        path = self.dirs["memory"]
        if self.v2.get("memory", False):
            with contextlib.suppress(OSError):
                _cgroup._write(os.path.join(path, "memory.max"), str(nbytes))
            return
        # v1: memory + swap is never below memory (written before and after: up or down, one holds).
        for name in ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
            with contextlib.suppress(OSError):
                _cgroup._write(os.path.join(path, name), str(nbytes))

    def drop_spawner(self) -> None:
        """Their spawner is gone (or let go): the next keep asks for another."""
        spawner, self.spawner, self.killed = self.spawner, None, False
        if spawner is None:
            return
        spawner.close()
        self.embryo_of = None
        if "pids" in self.dirs and self.limits.pids is not None:
            with contextlib.suppress(OSError):
                _cgroup._write(os.path.join(self.dirs["pids"], "pids.max"), str(self.limits.pids))
        if "memory" in self.dirs and self.limits.memory_mb is not None and spawner.pid is not None:
            self._memory_limit(int(float(self.limits.memory_mb) * MIB))

    def settle(self, bound: float = EXIT_S) -> bool:
        """Wait (at most ``bound``) for the exit of the process their last call left exiting (it
        wrote its final outcome: nothing of it runs); whether it is gone."""
        fd, self.exiting = self.exiting, None
        if fd is None:
            return True
        try:
            poller = select.poll()  # (not ``select``: a pidfd may be numbered past FD_SETSIZE)
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(int(bound * 1000)))
        except OSError:
            return False
        finally:
            os.close(fd)

    def set_embryo(self, embryo: Any) -> None:
        """TOOL-EMBRYO-DIRECT: ``embryo`` waits in them from now on (the one before is let go)."""
        old, self.embryo = self.embryo, embryo
        if old is not None:
            old.close()

    def counters(self) -> dict[str, int]:
        """The event counters the limits are checked against: read after each call, they are the
        next call's starting point when the groups are kept (nothing runs in them in between)."""
        return {"oom": self.oom_kills(), "pids": self.pids_hits()}

    def remove(self, empty: bool = False) -> None:
        """Remove the groups, or keep them for the next call when ``empty`` (the caller saw the v2
        group unpopulated once the call's process had gone: nothing of the call is left in them)."""
        if self.spawner is not None and (self.killed or not self.spawner.alive or not empty):
            self.drop_spawner()  # (it went with a kill, or died: the next keep asks for another)
        if self.contain is not None and empty and _keep(self):
            return
        self.settle()  # (a process still exiting in them: removed once gone, else killed below)
        self.set_embryo(None)
        if self.spawner is not None:
            self.spawner.close()  # (it exits: killed below if it has not yet)
            self.spawner = None
        self.close_files()
        for path in self.paths():
            try:
                os.rmdir(path)  # the usual case: empty, no group below it (one syscall, no listing)
                continue
            except FileNotFoundError:
                continue
            except OSError:
                pass
            if _cgroup.procs(path):
                _cgroup.kill(path)
                _cgroup.wait_empty(path, 2.0)
            for _ in range(50):
                if _cgroup.remove(path):
                    break
                time.sleep(0.002)  # v1 memory groups go offline a moment after their last exit


# TOOL-REUSE-GROUPS: the groups of a call that ended empty are kept (a few per process) for the next call with
# the same limits: making and removing three groups was a good part of a short call's cost. Emptiness
# is the v2 group's (every process of the call was in it); the counters read at the call's end are the
# next call's starting point. Calls of a template keep SPARE_GROUPS sets, used in turn (oldest first),
# so that each has its embryo made while another set's call runs (TOOL-EMBRYO).
KEEP_GROUPS = 4
SPARE_GROUPS = 2
_KEPT: dict[tuple[float | None, int | None, str | None], list[Groups]] = {}
_KEPT_LOCK = threading.Lock()


def _key(limits: Limits, kind: str | None) -> tuple[float | None, int | None, str | None]:
    return (limits.memory_mb, limits.pids, kind)


def _take_kept(limits: Limits, kind: str | None) -> Groups | None:
    with _KEPT_LOCK:
        free = _KEPT.get(_key(limits, kind))
        g = free.pop(0) if free else None
    if g is None or g.owner != _me():
        return None
    if not g.settle():  # their last call's process exits still (stopped?): not reused
        g.remove()
        return None
    g.limits = limits
    return g


def _keep(g: Groups) -> bool:
    if g.owner != _me():
        return False
    template = g.template
    with _KEPT_LOCK:
        free = _KEPT.setdefault(_key(g.limits, g.kind), [])
        if len(free) >= KEEP_GROUPS:
            return False
        if g.spawner is None:
            g.embryo_of = None  # (its embryo, if any, was this call's process)
        free.append(g)
        if template is not None and len(free) < SPARE_GROUPS:
            spare = Groups._new(g.limits, g.kind, backend())  # (once: the sets are used in turn)
            free.append(spare)
        # TOOL-EMBRYO: the next call's process waits in them already (asked again of a new template).
        unready = [k for k in free if template is not None and k.embryo_of is not template]
        for k in unready:
            k.template = k.embryo_of = template
    env = g.env if g.env is not None else g.limits.environment()
    for k in unready:
        if k.kind == "cmd" and k.contain is not None:
            k.set_spawner(template.spawner(k.paths()))  # TOOL-SPAWNER: stays for every call in them
        elif k.kind == "fn":
            k.set_embryo(template.embryo(k.paths(), env))  # TOOL-EMBRYO-DIRECT: the caller hands it the call
        else:
            template.prepare(k.paths(), env)
    return True


def remove_kept() -> None:
    """Remove the groups kept for reuse (at exit; a killed process's are swept by the next)."""
    with _KEPT_LOCK:
        kept = [g for free in _KEPT.values() for g in free if g.owner == _me()]
        _KEPT.clear()
    for g in kept:
        g.settle()
        g.set_embryo(None)
        g.close_files()
        if g.spawner is not None:
            g.spawner.close()
        if g.contain is not None and _cgroup.populated(g.contain):
            _cgroup.kill(g.contain)  # an embryo waiting there
            _cgroup.wait_empty(g.contain, 1.0)
        for path in g.paths():
            _cgroup.remove(path)


def next_kept(limits: Limits, kind: str | None) -> str | None:
    """The v2 directory of the kept groups the next call with ``limits`` (made by a ``kind`` template)
    takes, if any: its embryo waits there (for tests and probes)."""
    with _KEPT_LOCK:
        free = _KEPT.get(_key(limits, kind))
        return free[0].contain if free else None


def let_embryos_go(template: Any) -> None:
    """``template`` is let go: the embryos it made that wait in kept groups go too (each exits once
    its socket closes; the groups ask the next template for another)."""
    with _KEPT_LOCK:
        for free in _KEPT.values():
            for g in free:
                if g.embryo is not None and g.embryo.template is template:
                    g.embryo_of = None
                    g.set_embryo(None)


atexit.register(remove_kept)
