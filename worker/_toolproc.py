"""One tool call's process: its limits, its start (a fork of the caller), its watch and its ladder.

The caller forks (no new interpreter: the call starts from the caller's warm memory) and the child
joins the call's own groups before it runs anything: a cgroup v2 directory under the caller's own
(containment: ``cgroup.kill`` reaches a double-forked daemon; CPU use of the whole tree in
``cpu.stat``), and, where the memory, pids and cpu controllers are reachable, a group with the limits
(v2 when the unified hierarchy delegates them, else the v1 hierarchies when mounted and writable).
Without any of them the limits fall back to rlimits (see ``docs/tools.md`` for what that misses).

The parent watches the child's pidfd, its output pipes, its result pipe and a cancel pipe in one
``poll``; limits that the kernel does not stop by itself (pids reached, CPU seconds, output) are
checked on each wake and at least every ``WATCH_S``. TOOL-LADDER: on timeout or cancel the call gets
SIGINT (cooperative), then SIGTERM, then SIGKILL of its whole tree; a hard limit gets SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _cgroup, _toolchild, _tree
from ._toolerrors import KillReason

WATCH_S = 0.02  # how often limits the kernel does not enforce by itself are read while a call runs
MIB = 1024 * 1024

# TOOL-ENV: what a scrubbed environment keeps (env=None), and prefixes kept whole.
ENV_ALLOW = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "USER", "LOGNAME", "SHELL", "PWD")
ENV_ALLOW_PREFIXES = ("LC_",)


@dataclass(frozen=True)
class Limits:
    memory_mb: float | None = 256
    timeout: float | None = 30.0
    cpu_s: float | None = None
    pids: int | None = 64
    output_mb: float | None = 8
    env: dict[str, str] | None = None
    network: bool = True
    grace: float = 1.0
    kill_after: float = 1.0
    cgroups: bool | None = None  # None: use them where they work; False: rlimits only

    def check(self) -> None:
        for name in ("memory_mb", "timeout", "cpu_s", "output_mb"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
            ):
                raise ValueError(f"{name} must be a positive number or None, not {value!r}")
        for name in ("grace", "kill_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, not {value!r}")
        if self.pids is not None and (
            isinstance(self.pids, bool) or not isinstance(self.pids, int) or self.pids < 1
        ):
            raise ValueError(f"pids must be a positive int or None, not {self.pids!r}")
        if self.env is not None and not (
            isinstance(self.env, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items())
        ):
            raise TypeError("env must be a dict of str to str or None")

    def environment(self) -> dict[str, str]:
        keep = {
            k: v
            for k, v in os.environ.items()
            if k in ENV_ALLOW or any(k.startswith(p) for p in ENV_ALLOW_PREFIXES)
        }
        keep.update(self.env or {})
        return keep


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
    for name in ("memory", "pids"):
        if name not in v1:
            continue
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


_placed: tuple[int, tuple[str, str | None, dict[str, str]]] | None = None


def _place() -> tuple[str, str | None, dict[str, str]]:
    """(the name prefix of this process's call groups, its own v2 cgroup, the v1 parent of each
    controller), read once per process (a forked child reads its own)."""
    global _placed
    me = os.getpid()
    if _placed is None or _placed[0] != me:
        # Named like a pool (owner pid and start time): one left by a caller killed with SIGKILL is swept.
        prefix = f"{_cgroup.POOL_PREFIX}{me}-{_cgroup._start_time(me)}-call"
        v1 = _v1_mounts()
        parents = {name: os.path.join(v1[name], (_v1_own(name) or "/").lstrip("/")) for name in v1}
        _placed = (me, (prefix, _cgroup.cgroup_of(), parents))
    return _placed[1]


@dataclass
class Groups:
    """The call's cgroups (made by the parent before the fork, removed after the call)."""

    limits: Limits
    contain: str | None = None  # v2 directory: every process of the call, whatever it does
    dirs: dict[str, str] = field(default_factory=dict)  # controller -> directory with the limit
    base: dict[str, int] = field(default_factory=dict)
    v2: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def make(cls, limits: Limits) -> Groups:
        g = cls(limits)
        if limits.cgroups is False:
            return g
        be = backend()
        if not _swept:
            sweep_stale_groups()
        prefix, own, parents = _place()
        tag = prefix + secrets.token_hex(4)
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
        g.base = {"oom": g.oom_kills(), "pids": g.pids_hits()}
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
        try:
            with open(os.path.join(path, file), "rb") as f:
                for line in f:
                    if line.startswith(key + b" "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            pass
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
        if self.contain is None:
            return []
        return _cgroup.procs(self.contain)

    def kill(self) -> None:
        for path in self.paths():
            _cgroup.kill(path)  # v1: no cgroup.kill; signals what is listed

    def remove(self) -> None:
        for path in self.paths():
            if _cgroup.procs(path):
                _cgroup.kill(path)
                _cgroup.wait_empty(path, 2.0)
            for _ in range(50):
                if _cgroup.remove(path):
                    break
                time.sleep(0.002)  # v1 memory groups go offline a moment after their last exit


# ---- the parent: start, watch, ladder -------------------------------------------------------


class Outcome:
    __slots__ = ("status", "result", "out", "err", "seen", "truncated", "killed", "last_signal")

    def __init__(self) -> None:
        self.status = 0
        self.result = b""
        self.out = bytearray()
        self.err = bytearray()
        self.seen = 0  # bytes of output taken (kept or relayed)
        self.truncated = False
        self.killed: KillReason | None = None
        self.last_signal: int | None = None


def start(limits: Limits, body: Callable[[int], None], *, stdin: bytes | None = None) -> Proc:
    """Fork the call. ``body(result_fd)`` runs in the child after ``setup_child``, and must not
    return (it ends with ``os._exit``)."""
    groups = Groups.make(limits)
    res_r, res_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    in_r = in_w = None
    if stdin is not None:
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if _tree._libc is None:
        _tree._prctl(3, 0)  # PR_GET_DUMPABLE: loads libc here once, not in every child (~0.4 ms each)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(res_r)
            os.close(out_r)
            os.close(err_r)
            if in_w is not None:
                os.close(in_w)
            _toolchild.setup_child(limits, groups, (res_w,), out_w, err_w, in_r)
            body(res_w)
        except BaseException as exc:  # noqa: BLE001 - told to the parent, then gone
            with contextlib.suppress(BaseException):
                from ._isolated import report_setup_error

                report_setup_error(res_w, exc)
        os._exit(70)
    for fd in (res_w, out_w, err_w, in_r):
        if fd is not None:
            os.close(fd)
    return Proc(pid, limits, groups, res_r, out_r, err_r, in_w, stdin or b"")


_LIVE: set[Proc] = set()  # calls being watched in this process
_LIVE_LOCK = threading.Lock()


def cancel_all() -> int:
    """TOOL-TOLD: the turn's abort reaches every isolated call of this process first; how many."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        proc.cancel()
    return len(live)


class Proc:
    def __init__(
        self,
        pid: int,
        limits: Limits,
        groups: Groups,
        res: int,
        out: int,
        err: int,
        stdin_fd: int | None,
        stdin: bytes,
    ) -> None:
        self.pid = pid
        self.limits = limits
        self.groups = groups
        self.fds = {res: "res", out: "out", err: "err"}
        self.stdin_fd = stdin_fd
        self.stdin = memoryview(stdin)
        self.pidfd = os.pidfd_open(pid)
        self.cancel_r, self.cancel_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.started = time.monotonic()
        self.outcome = Outcome()
        self.tree: set[int] = {pid}

    def cancel(self) -> None:
        """Start the call's ladder as for a cancel (from any thread; harmless once it ended: the
        pipe is closed under the same lock, so a number reused by another file is never written)."""
        with _LIVE_LOCK, contextlib.suppress(OSError):
            if self.cancel_w >= 0:
                os.write(self.cancel_w, b"x")

    # The ladder's steps ------------------------------------------------------------------------

    def _signal_tree(self, sig: int) -> None:
        self.outcome.last_signal = sig
        if sig == signal.SIGINT:
            _tree._kill(self.pid, sig)
            return
        if sig == signal.SIGKILL and self.groups.contain is not None:
            self.tree.update(self.groups.members())
            self.groups.kill()
            return
        pids = _tree.freeze_tree(self.pid)
        pids.extend(p for p in self.groups.members() if p not in pids)
        self.tree.update(pids)
        _tree.signal_all(pids, sig)
        _tree.thaw(pids)

    def _stop_now(self, reason: KillReason) -> None:
        if self.outcome.killed is None:
            self.outcome.killed = reason
        self._signal_tree(signal.SIGKILL)

    def watch(self, relay: bool = True) -> Outcome:
        """Run the call to its end (returned, died or killed) and reap it; never raises for the call."""
        lim, o = self.limits, self.outcome
        cancel_fd = self.cancel_r
        with _LIVE_LOCK:
            _LIVE.add(self)
        poller = select.poll()
        for fd in self.fds:
            poller.register(fd, select.POLLIN)
        poller.register(self.pidfd, select.POLLIN)
        if cancel_fd is not None:
            poller.register(cancel_fd, select.POLLIN)
        if self.stdin_fd is not None:
            if len(self.stdin):
                os.set_blocking(self.stdin_fd, False)
                poller.register(self.stdin_fd, select.POLLOUT)
            else:
                os.close(self.stdin_fd)
                self.stdin_fd = None
        cap = int(lim.output_mb * MIB) if lim.output_mb is not None else None
        ladder: list[tuple[float, int]] = []  # (when, signal) still to send
        exited = False
        leftovers_killed = False
        watch_limits = (
            bool(self.groups.dirs)
            or lim.cpu_s is not None
            or (lim.pids is not None and self.groups.contain is not None)
        )
        try:
            while True:
                now = time.monotonic()
                if not ladder and o.killed is None:
                    reason: KillReason | None = None
                    if lim.timeout is not None and now - self.started >= lim.timeout:
                        reason = "timeout"
                    if reason is not None:
                        o.killed = reason
                        ladder = [
                            (now, signal.SIGINT),
                            (now + lim.grace, signal.SIGTERM),
                            (now + lim.grace + lim.kill_after, signal.SIGKILL),
                        ]
                while ladder and ladder[0][0] <= now:
                    self._signal_tree(ladder.pop(0)[1])
                waits = []
                if ladder:
                    waits.append(ladder[0][0] - now)
                elif lim.timeout is not None and o.killed is None:
                    waits.append(self.started + lim.timeout - now)
                if watch_limits:
                    waits.append(WATCH_S)
                wait_ms = None if not waits else max(0, int(min(waits) * 1000) + 1)
                if exited and not self.fds:
                    break
                if exited:
                    if not leftovers_killed:
                        # The call's process is gone: what it left running goes now, so a pipe a
                        # background child holds cannot keep the call open.
                        leftovers_killed = True
                        left = self.groups.members()
                        if left:
                            self.tree.update(left)
                            self.groups.kill()
                    wait_ms = 50  # drain what is in the pipes; a pipe held past that is not waited for
                events = poller.poll(wait_ms)
                for fd, ev in events:
                    if fd == self.pidfd:
                        exited = True
                        ladder = []  # the rest of the ladder is for a process that is gone
                        poller.unregister(fd)
                    elif fd == cancel_fd:
                        poller.unregister(fd)
                        if o.killed is None:
                            o.killed = "cancelled"
                            t = time.monotonic()
                            ladder = [
                                (t, signal.SIGINT),
                                (t + lim.grace, signal.SIGTERM),
                                (t + lim.grace + lim.kill_after, signal.SIGKILL),
                            ]
                        elif ladder:
                            pass  # a cancel during a timeout's ladder changes nothing
                    elif fd == self.stdin_fd:
                        try:
                            n = os.write(fd, self.stdin[:65536])
                            self.stdin = self.stdin[n:]
                        except (BlockingIOError, InterruptedError):
                            continue
                        except OSError:
                            self.stdin = self.stdin[:0]
                        if not len(self.stdin) or ev & (select.POLLERR | select.POLLHUP):
                            poller.unregister(fd)
                            os.close(fd)
                            self.stdin_fd = None
                    else:
                        kind = self.fds[fd]
                        try:
                            data = os.read(fd, 262144)
                        except OSError:
                            data = b""
                        if not data:
                            poller.unregister(fd)
                            os.close(fd)
                            del self.fds[fd]
                            continue
                        if kind == "res":
                            o.result += data
                            if cap is not None and len(o.result) > cap:
                                o.truncated = True
                                self._stop_now("output")
                            continue
                        self._take_output(kind, data, cap, relay)
                if exited and not events:
                    break  # the child is gone, its pipes quiet (a pipe a daemon kept is not ours to wait for)
                if not exited:
                    self._check_limits()
        finally:
            for fd in list(self.fds):
                os.close(fd)
            self.fds.clear()
            if self.stdin_fd is not None:
                os.close(self.stdin_fd)
            os.close(self.pidfd)
            with _LIVE_LOCK:
                _LIVE.discard(self)
                os.close(self.cancel_r)
                os.close(self.cancel_w)
                self.cancel_w = -1
            self._reap()
        return o

    def _take_output(self, kind: str, data: bytes, cap: int | None, relay: bool) -> None:
        o = self.outcome
        buf = o.out if kind == "out" else o.err
        room = None if cap is None else cap - o.seen
        if room is not None and len(data) > room:
            data = data[: max(room, 0)]
            o.truncated = True
            self._stop_now("output")
        o.seen += len(data)
        if relay:
            with contextlib.suppress(OSError):
                os.write(1 if kind == "out" else 2, data)
        else:
            buf += data

    def _check_limits(self) -> None:
        lim, g = self.limits, self.groups
        if self.outcome.killed is not None and self.outcome.killed not in ("timeout", "cancelled"):
            return
        if "memory" in g.dirs and g.oom_kills() > g.base.get("oom", 0):
            self._stop_now("memory")
        elif "pids" in g.dirs and g.pids_hits() > g.base.get("pids", 0):
            self._stop_now("pids")
        elif (
            lim.pids is not None
            and "pids" not in g.dirs
            and g.contain is not None
            and len(g.members()) > lim.pids
        ):
            self._stop_now("pids")  # fallback: counted, not prevented
        elif lim.cpu_s is not None:
            used = g.cpu_seconds()
            if used is not None and used > lim.cpu_s:
                self._stop_now("cpu")

    def _reap(self) -> None:
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:  # reaped by someone else (a worker's end-of-turn sweep): it was killed
            status = signal.SIGKILL
        self.outcome.status = status
        g = self.groups
        if self.outcome.killed is None and "memory" in g.dirs and g.oom_kills() > g.base.get("oom", 0):
            self.outcome.killed = "memory"
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU and self.outcome.killed is None:
            self.outcome.killed = "cpu"
        # What the call left (a daemon that escaped its own cleanup): killed with its groups.
        left = g.members()
        if left:
            self.tree.update(left)
            g.kill()
        g.remove()
        self.tree.discard(self.pid)
        me = os.getpid()
        for pid in self.tree:  # orphans re-parented to us (we are a subreaper): reap them, by pid
            fields = _tree.stat_fields(pid)
            if fields is not None and int(fields[1]) == me:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, 0)
