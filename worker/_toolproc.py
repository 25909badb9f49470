"""One tool call's process: its start (a fork of the caller, or by the warm template), its watch and its
ladder (its limits and groups: ``_toolgroups``).

The call's process (forked by the caller, or made by its warm template: ``_tooltemplate``) joins the
call's own groups before it runs anything: a cgroup v2 directory under the caller's own
(containment: ``cgroup.kill`` reaches a double-forked daemon; CPU use of the whole tree in
``cpu.stat``), and, where the memory, pids and cpu controllers are reachable, a group with the limits
(v2 when the unified hierarchy delegates them, else the v1 hierarchies when mounted and writable).
Without any of them the limits fall back to rlimits (see ``docs/tools.md`` for what that misses).

The parent watches the child's pidfd, its output pipes, its result pipe and a cancel pipe in one
``poll``; limits that the kernel does not stop by itself (pids reached, CPU seconds) are read every
``WATCH_S`` (output as it comes; the event counters once more at the end). TOOL-LADDER: on timeout or
cancel the call gets SIGINT (cooperative), then SIGTERM, then SIGKILL of its whole tree; a hard limit
gets SIGKILL.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import _toolchild, _toolembryo, _toolspawner, _tooltemplate
from ._toolerrors import KillReason, ToolCrashed, for_frameworks
from ._toolgroups import Groups
from ._toollimits import Limits
from .proctree import _tree

WATCH_S = 0.02  # how often limits the kernel does not enforce by itself are read while a call runs
MIB = 1024 * 1024

# ---- the parent: start, watch, ladder -------------------------------------------------------


class Outcome:
    __slots__ = ("err", "killed", "last_signal", "out", "result", "seen", "status", "truncated")

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
                _toolchild.report_setup_error(res_w, exc)
        os._exit(70)
    for fd in (res_w, out_w, err_w, in_r):
        if fd is not None:
            os.close(fd)
    return Proc(pid, limits, groups, res_r, out_r, err_r, in_w, stdin or b"")


def start_in_template(
    template: _tooltemplate.Template, limits: Limits, req: dict[str, Any], *, stdin: bytes | None = None
) -> Proc:
    """TOOL-WARM: the call, forked by ``template`` (see ``_tooltemplate``) rather than by us. Raises
    ``_tooltemplate.Fallback`` (fork the caller instead), ``OSError`` (the template is gone) or
    ``ToolCrashed`` (a spawner killed while it started the command: it is not started again)."""
    groups = Groups.make(limits, template.kind)
    groups.template = template
    req["lim"] = [limits.memory_mb, limits.pids, limits.cpu_s, limits.network]
    req["env"] = groups.env = limits.environment()
    req["join"] = groups.paths()
    req["limited"] = list(groups.dirs)
    req["contain"] = groups.contain
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    # A spawned command has no result pipe: nothing of ours runs in it to write one (what cannot
    # start is told by the spawn itself). Its slot carries the output pipe once more.
    res_r: int | None = None
    res_w = out_w
    if not _toolspawner.spawnable(req):
        res_r, res_w = os.pipe2(os.O_CLOEXEC)
    ours = [fd for fd in (res_r, out_r, err_r) if fd is not None]
    theirs = [res_w, out_w, err_w]
    in_w = None
    if stdin is not None:
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        theirs.append(in_r)
        ours.append(in_w)
    status: Callable[[bool], int]
    try:
        direct = _by_embryo(template, groups, req, theirs) if template.kind == "fn" else None
        started = _by_spawner(template, groups, req, theirs) if template.kind == "cmd" else None
        if direct is not None:
            pid, pidfd, status = direct
        elif started is not None:
            pid, pidfd = started
            status = groups.spawner.status_of(pid, pidfd)
        else:
            pid, pidfd, channel = template.spawn(req, theirs)
            status = functools.partial(_tooltemplate.exit_status, channel)
    except BaseException:
        for fd in ours:
            os.close(fd)
        groups.remove()
        raise
    finally:
        for fd in set(theirs):
            os.close(fd)
    return Proc(
        pid,
        limits,
        groups,
        res_r,
        out_r,
        err_r,
        in_w,
        stdin or b"",
        pidfd=pidfd,
        status=status,
        outcome_says=req["kind"] == "fn",
    )


def _by_embryo(
    template: _tooltemplate.Template, groups: Groups, req: dict[str, Any], fds: list[int]
) -> tuple[int, int, Callable[[bool], int]] | None:
    """TOOL-EMBRYO-DIRECT: the call handed straight to the embryo waiting in its groups (or, for a call
    without groups, the template's loose one): (pid, pidfd, its status), or None where there is none
    ready for a function its template has found (the template makes the call; nothing of it ran)."""
    if groups.paths():
        embryo, groups.embryo = groups.embryo, None
    else:
        embryo = template.take_loose()
    if embryo is None:
        return None
    if embryo.template is not template or req["mod"] not in template.known:
        embryo.close()  # (made by a template let go, or a new module: the template imports it)
        return None
    req, extra = _tooltemplate.args_aside(req)
    try:
        pid, pidfd = embryo.start(req, [*fds, *extra])
    except _toolembryo.Gone:
        embryo.close()
        return None
    finally:
        for fd in extra:
            os.close(fd)
    return pid, pidfd, embryo.status


def _by_spawner(
    template: _tooltemplate.Template, groups: Groups, req: dict[str, Any], fds: list[int]
) -> tuple[int, int] | None:
    """TOOL-SPAWNER: the command started by the spawner standing in its groups: (pid, pidfd), or None
    where no spawner can be had (the template spawns it). Raises ``Fallback`` as ``Template.spawn``."""
    for _ in range(2):
        if groups.contain is None:
            return None
        if groups.spawner is None:
            # New groups, or their spawner went: one is made now and waited for (what a spawn by the
            # template would cost too: a move into them), and stays for the calls that keep them.
            groups.set_spawner(template.spawner(groups.paths()))
            groups.embryo_of = template
        spawner = groups.spawner
        if spawner is None:
            return None
        if spawner.pid is None:  # (the first call since it was asked for)
            if not spawner.ready():
                groups.drop_spawner()
                return None
            groups.spawner_counted()
        try:
            return spawner.start(req, fds)  # type: ignore[no-any-return]
        except _toolspawner.Died:
            started = groups.members()  # (less the spawner, which may be still exiting)
            groups.drop_spawner()
            if started:  # it had started the command, never to be started twice: it ends with its groups
                raise for_frameworks(ToolCrashed(signal=signal.SIGKILL)) from None
        except _toolspawner.Gone:
            groups.drop_spawner()  # (killed since its last call, or its template was replaced: once more)
    return None


_LIVE: set[Proc] = set()  # calls being watched in this process
_LIVE_LOCK = threading.Lock()
# Cancel pipes of calls that ended with nothing written to them, for the next calls (under _LIVE_LOCK):
# a pipe made and closed per call is three system calls. A forked child lets its copies go.
_CANCEL_PIPES: list[tuple[int, int]] = []


def _cancel_pipe() -> tuple[int, int]:
    with _LIVE_LOCK:
        if _CANCEL_PIPES:
            return _CANCEL_PIPES.pop()
    return os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)


def _forked() -> None:
    for pair in _CANCEL_PIPES:
        for fd in pair:
            with contextlib.suppress(OSError):
                os.close(fd)
    _CANCEL_PIPES.clear()


os.register_at_fork(after_in_child=_forked)


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
        res: int | None,
        out: int,
        err: int,
        stdin_fd: int | None,
        stdin: bytes,
        pidfd: int | None = None,
        status: Callable[[bool], int] | None = None,
        outcome_says: bool = False,
    ) -> None:
        self.pid = pid
        self.limits = limits
        self.groups = groups
        self.fds = {out: "out", err: "err"} if res is None else {res: "res", out: "out", err: "err"}
        self.stdin_fd = stdin_fd
        self.stdin = memoryview(stdin)
        # A call forked by a template is the template's child: its pidfd comes from there (taken
        # before the template could reap it), and so does its exit status (``status``).
        self.pidfd = os.pidfd_open(pid) if pidfd is None else pidfd
        self.status = status
        self.stashed: int | None = None  # the status, read before the groups were killed
        self.outcome_says = outcome_says  # a function's result says how it ended (not its exit status)
        self.cancel_r, self.cancel_w = _cancel_pipe()
        self.cancel_sent = False  # (a pipe written to is closed at the end, not used again)
        self.started = time.monotonic()
        self.outcome = Outcome()
        self.tree: set[int] = {pid}
        self.empty: bool | None = None  # once the call's process is gone: nothing of it left
        self.final = False  # its outcome came marked final: nothing of it runs again (it may be exiting)

    def cancel(self) -> None:
        """Start the call's ladder as for a cancel (from any thread; harmless once it ended: the
        pipe is let go under the same lock, so a number reused by another file is never written)."""
        with _LIVE_LOCK, contextlib.suppress(OSError):
            if self.cancel_w >= 0:
                self.cancel_sent = True
                os.write(self.cancel_w, b"x")

    # The ladder's steps ------------------------------------------------------------------------

    def _signal_tree(self, sig: int) -> None:
        self.outcome.last_signal = sig
        if sig == signal.SIGINT:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, sig)  # never another process with a reused pid
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
        next_check = self.started + WATCH_S
        watch_limits = (
            bool(self.groups.dirs)
            or lim.cpu_s is not None
            or (lim.pids is not None and self.groups.contain is not None)
        )
        try:
            while True:
                now = time.monotonic()
                if not ladder and o.killed is None and not self.final:
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
                    waits.append(next_check - now)
                wait_ms = None if not waits else max(0, int(min(waits) * 1000) + 1)
                if exited and not self.fds:
                    break
                if self.final:
                    wait_ms = 0  # what is in the pipes is all there will be: taken, not waited for
                elif exited:
                    if not leftovers_killed:
                        # The call's process is gone: what it left running goes now, so a pipe a
                        # background child holds cannot keep the call open.
                        leftovers_killed = True
                        self._end_leftovers()
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
                            if kind == "res" and o.result[:1] == _toolchild.FINAL:
                                o.result = o.result[_toolchild.FINAL_HEAD :]  # (cut short: not final)
                            continue
                        if kind == "res":
                            o.result += data
                            if cap is not None and len(o.result) > cap:
                                o.truncated = True
                                self._stop_now("output")
                            if o.result[:1] == _toolchild.FINAL and self._is_final():
                                exited = True
                                ladder = []
                            continue
                        self._take_output(kind, data, cap, relay)
                if exited and not events:
                    break  # the child is gone, its pipes quiet (a pipe a daemon kept is not ours to wait for)
                if not exited and watch_limits and time.monotonic() >= next_check:
                    # On a timer, not on each wake: a call that is killed wakes us by its exit, and
                    # its end reads the counters (``_reap``).
                    self._check_limits()
                    next_check = time.monotonic() + WATCH_S
        finally:
            for fd in list(self.fds):
                os.close(fd)
            self.fds.clear()
            if self.stdin_fd is not None:
                os.close(self.stdin_fd)
            with _LIVE_LOCK:
                _LIVE.discard(self)
                if self.cancel_sent or len(_CANCEL_PIPES) >= 8:
                    os.close(self.cancel_r)
                    os.close(self.cancel_w)
                else:
                    _CANCEL_PIPES.append((self.cancel_r, self.cancel_w))
                self.cancel_w = -1
            try:
                self._reap()
            finally:
                if self.pidfd >= 0:
                    os.close(self.pidfd)  # (after: a spawned command's status is read from it)
        return o

    def _is_final(self) -> bool:
        """TOOL-LADDER: whether the whole outcome is in, marked final (the call's process found itself
        alone, and can run nothing more; the mark and length are taken off once it is whole): then the
        call returns without waiting for the process's exit (nor for its pipes' end), its groups empty
        but for it."""
        o = self.outcome
        head = _toolchild.FINAL_HEAD
        if len(o.result) < head or len(o.result) - head != int.from_bytes(o.result[1:head], "little"):
            return False
        o.result = o.result[head:]
        self.final = o.killed is None and not o.truncated
        if self.final:
            # Not taken on trust (the function could have written a forged outcome on the inherited result
            # pipe and gone on): the process is killed, a no-op for one already in its exit, and whatever
            # else is in its groups sends the call down the sweep of what it left (``_end_leftovers``).
            g = self.groups
            alone = False
            if g.contain is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                alone = set(g.members()) <= {self.pid}
            if not alone:  # (no group to read, or more in it: its tree, frozen and listed, goes now)
                self._signal_tree(signal.SIGKILL)
            self.empty = True if alone else None
        return self.final

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

    def _end_leftovers(self) -> None:
        """The call's process is gone: kill what it left running (one read when nothing is left)."""
        g = self.groups
        if g.contain is not None and not g.populated():
            self.empty = True
            return
        left = g.members()
        if left:
            self.tree.update(left)
            if g.spawner is not None and self.status is not None and self.stashed is None:
                self.stashed = self.status(True)  # (the spawner reported it, or goes with the kill)
            g.kill()
        self.empty = g.contain is not None and not left and not g.populated()

    def _reap(self) -> None:
        if self.stashed is not None:
            status = self.stashed
        elif self.status is not None:
            # A function that wrote its whole outcome ended by itself: its exit status (the template
            # reports it once reaped) adds nothing, and the process is gone (a zombie until then).
            o = self.outcome
            status = self.status(
                not (self.outcome_says and o.result and not o.truncated and o.killed is None)
            )
        else:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:  # reaped by someone else (a worker's end-of-turn sweep): it was killed
                status = signal.SIGKILL
        self.outcome.status = status
        g = self.groups
        if self.final and g.paths():
            # Still exiting, perhaps: the groups wait for it before their next use (TOOL-REUSE-GROUPS).
            g.exiting, self.pidfd = self.pidfd, -1
        counts = g.counters()
        if self.outcome.killed is None and "memory" in g.dirs and counts["oom"] > g.base.get("oom", 0):
            self.outcome.killed = "memory"
        g.base = counts  # the next call's starting point if the groups are kept
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU and self.outcome.killed is None:
            self.outcome.killed = "cpu"
        # What the call left (a daemon that escaped its own cleanup): killed with its groups.
        if self.empty is None:
            self._end_leftovers()
        g.remove(empty=bool(self.empty))
        if g.kind == "fn" and g.template is not None and not g.paths():
            g.template.refill_loose(g.env)  # TOOL-EMBRYO-DIRECT: the next call without groups' process
        self.tree.discard(self.pid)
        me = os.getpid() if self.tree else 0
        for pid in self.tree:  # orphans re-parented to us (we are a subreaper): reap them, by pid
            fields = _tree.stat_fields(pid)
            if fields is not None and int(fields[1]) == me:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, 0)
