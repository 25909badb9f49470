"""A command's spawner: a process standing in a set of kept command groups, which starts each command
run there, so that the command is born in its groups (TOOL-SPAWNER).

Moving a process into a cgroup waits for an RCU grace period when no move happened just before (~10 ms
here), and a fork of the commands template copies its page tables and tears them down after the exec. A
command born in its groups pays neither: once a set of groups is kept (TOOL-REUSE-GROUPS), the commands
template forks one *spawner* into it (its move made off the call's path, as an embryo's), and the caller
sends each command of that set to it directly, on the spawner's own socket. The spawner
``posix_spawn``s the command (a vfork: nothing of it is copied) or, for a command that needs what a spawn
cannot set (an rlimit, a network namespace), forks a child that sets it and execs. It answers
``["pid", pid]`` with a pidfd of the command and waits for the next: the command's end reaps it at
once (SIGCHLD ignored once its pidfd is open), and the kernel keeps its status for its pidfd, where the
caller reads it (``reaped_status``), so a call's end wakes only the caller. (Before Linux 6.15, which
keeps no such record, the spawner waits, reaps it and answers ``["exit", status]``.) It is not the
call: the caller's ladder and limit checks leave it out, and the pids limit of its groups counts it on
top of the call's own (``pids.max`` is the call's ``pids`` + 1).

A spawner dies with its groups' kill (a call killed: the next set keeps a new one), with its template
(parent-death signal), and when its caller's end of the socket closes (the caller is gone: it kills what
it runs first).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import socket
import struct
import time
from collections.abc import Callable
from typing import Any, NoReturn

import msgspec

from . import _toolchild
from .proctree import _tree

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()

MAX_REQUEST = 70_000
MAX_FDS = 8
READY_S = 5.0  # the longest a call waits for its groups' spawner to stand in them (then: without it)
REPLY_S = 60.0
PR_SET_CHILD_SUBREAPER = 36


def spawnable(req: dict[str, Any]) -> bool:
    """Whether a command can be spawned rather than forked: a v2 group contains it (its tree is found
    without it being a subreaper), cgroups hold its memory and pids limits, and it keeps the network."""
    memory_mb, pids, cpu_s, network = req["lim"]
    limited = req["limited"]
    return (
        req["kind"] == "cmd"
        and bool(req.get("contain"))
        and network
        and cpu_s is None
        and (memory_mb is None or "memory" in limited)
        and (pids is None or "pids" in limited)
    )


def posix_spawn(req: dict[str, Any], fds: list[int], null: int, ignored: tuple[int, ...]) -> int:
    """Spawn the command of ``req`` from here (the caller stands in its groups and its directory):
    its process group, signals and descriptors set by the spawn."""
    _res_w, out_w, err_w = fds[:3]
    stdin = fds[3] if len(fds) > 3 else null
    argv = req["argv"]
    return os.posix_spawnp(
        argv[0],
        argv,
        req["env"],
        file_actions=[
            (os.POSIX_SPAWN_DUP2, stdin, 0),
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2),
        ],
        setpgroup=0,
        setsigmask=(),
        # What we ignore stays ignored across an exec (what we handle is reset by it).
        setsigdef=ignored,
    )


# ---- the spawner process (a fork of the commands template) -------------------------------------


def serve(sock: socket.socket, join: list[str], parent: int, child: Any) -> NoReturn:
    """The spawner's main, in a fork of the commands template (``parent``): into the groups ``join``,
    then one command per request until its caller closes the socket. ``child(req, fds)`` is a forked
    command's process (``_tooltemplate._child``)."""
    try:
        _toolchild.own_process(join, scrub=False, keep=sock.fileno())
        # Not a subreaper: what a command leaves goes to the template, which reaps it at once (a zombie
        # would hold a pid of the call's limit).
        _tree._prctl(PR_SET_CHILD_SUBREAPER, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # (the ladder's SIGINT is the command's alone)
        ignored = _toolchild.ignored_signals()
        if os.getppid() != parent:
            os._exit(0)  # the template died during the fork: no parent-death signal will come
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        sock.send(_enc.encode(["ready", os.getpid()]))
    except BaseException:  # noqa: BLE001 - never ready: the caller makes its calls without it
        os._exit(70)
    last = 0  # the last command started (its groups are killed if the caller goes while it runs)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST + 4096, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            data, fds = b"", []
        if not data:
            _let_go(join, last)  # the caller let the groups go, or is gone
        pid = 0
        try:
            req = _dec.decode(data)
            os.chdir(req["cwd"])
            # Until its pidfd is open, the command's end leaves a zombie: its pid is not reused.
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            if spawnable(req):
                pid = posix_spawn(req, fds, null, ignored)
            else:
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the command's process
                    with contextlib.suppress(BaseException):
                        _toolchild.own_process([], scrub=False)  # (its groups: ours, from birth)
                        child(req, fds)
                    os._exit(70)
            pidfd = os.pidfd_open(pid)
        except BaseException as exc:  # noqa: BLE001 - told to the caller, which forks the call itself
            if pid > 0:  # started, but not to be watched (no pidfd): stopped, so it never runs twice
                for kill in (os.killpg, os.kill):  # (its group, if it made it yet; it, in any case)
                    with contextlib.suppress(OSError):
                        kill(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.waitpid(pid, 0)
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                sock.send(_enc.encode(["fail", f"{type(exc).__name__}: {exc}"]))
            continue
        last = pid
        if EXIT_INFO:
            # From now on its end reaps it at once, and the kernel keeps its status for its pidfd,
            # where the caller reads it: nothing of a call's end passes through here.
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # (it ended already: a zombie, reaped now)
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            socket.send_fds(sock, [_enc.encode(["pid", pid])], [pidfd])
        if not EXIT_INFO:
            _wait(sock, pid, pidfd, join)
        else:
            os.close(pidfd)


def _kill_groups(join: list[str], pid: int) -> NoReturn:
    """The caller is gone while a command runs: nobody watches it any more. Everything in the groups
    is killed (this spawner with it)."""
    for path in join:
        with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    os._exit(0)


def _let_go(join: list[str], last: int) -> NoReturn:
    """The caller closed the socket: exit, killing the groups first if the last command still runs
    (a caller that lets kept groups go closes it between calls: then nothing runs)."""
    try:
        running = last > 0 and os.waitpid(-1, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        running = False  # (every command ended, and was reaped)
    if running:
        _kill_groups(join, last)
    os._exit(0)


def _wait(sock: socket.socket, pid: int, pidfd: int, join: list[str]) -> None:
    """Without the kernel's exit record (before Linux 6.15): until the command ends (then its status
    to the caller), or the caller goes (then the groups' processes are killed, the spawner with them)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(sock, select.POLLIN)
    while True:
        fds = [fd for fd, _ in poller.poll()]
        if pidfd in fds:
            break
        if fds:  # the caller's end closed mid-call
            _kill_groups(join, pid)
    os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    with contextlib.suppress(OSError):
        sock.send(_enc.encode(["exit", status]))


def _exit_info_supported() -> bool:
    """Whether a pidfd tells the exit status of a reaped process that was not our child
    (``PIDFD_GET_INFO`` with ``PIDFD_INFO_EXIT``: Linux 6.15)."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (6, 15)


EXIT_INFO = _exit_info_supported()
PIDFD_GET_INFO = 0xC040FF0B  # _IOWR(0xFF, 11, struct pidfd_info), its first 64 bytes
PIDFD_INFO_EXIT = 8
_INFO = struct.Struct("=Q52xi")  # mask, ..., exit_code (a wait status)


def reaped_status(pidfd: int, pid: int, timeout: float) -> int | None:
    """The wait status of the process of ``pidfd`` once it is reaped, by whoever reaps it (its
    status is kept for its pidfd); None where it was not within ``timeout``. An exited process not
    reaped yet is waited for (its pidfd hangs up when it is), or reaped here if it is our child."""
    buf = bytearray(_INFO.size)
    deadline: float | None = None
    while True:
        _INFO.pack_into(buf, 0, PIDFD_INFO_EXIT, 0)
        try:
            fcntl.ioctl(pidfd, PIDFD_GET_INFO, buf)
        except OSError:
            return None
        mask, code = _INFO.unpack(buf)
        if mask & PIDFD_INFO_EXIT:
            return int(code)
        if deadline is None:
            deadline = time.monotonic() + timeout
            with contextlib.suppress(ChildProcessError, OSError):
                got, status = os.waitpid(pid, os.WNOHANG)  # (ours, re-parented to us: a subreaper)
                if got == pid:
                    return status
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        poller = select.poll()
        poller.register(pidfd, select.POLLHUP)
        poller.poll(int(left * 1000) + 1)


# ---- the caller's side ----------------------------------------------------------------------------


class Gone(Exception):
    """The spawner is gone (or never stood in its groups): the call is made without it."""


class Died(Gone):
    """The spawner died between the request and its answer (the command may have started)."""


class Spawner:
    """A spawner, as its caller (the process whose kept groups it stands in) sees it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pid: int | None = None  # known once it stands in its groups

    def ready(self, timeout: float = READY_S) -> bool:
        """Whether it stands in its groups (waits for it at most ``timeout``)."""
        if self.pid is None:
            msg, _ = _toolchild.receive(self.sock, timeout)
            with contextlib.suppress(TypeError, ValueError, IndexError):
                if msg[0] == "ready":
                    self.pid = int(msg[1])
        return self.pid is not None

    def start(self, req: dict[str, Any], fds: list[int]) -> tuple[int, int]:
        """The command of ``req`` started by the spawner: (its pid, a pidfd of it). Raises ``Gone``
        when the request could not reach the spawner (nothing started), ``Died`` when it died before
        answering, ``Fallback`` when it could not start the command (the caller forks it: the error is
        told from there)."""
        from ._tooltemplate import Fallback

        try:
            socket.send_fds(self.sock, [_enc.encode(req)], fds)
        except OSError:
            raise Gone("the spawner is gone") from None
        data: bytes = b""
        got: list[int] = []
        if self._answers(REPLY_S):
            with contextlib.suppress(OSError):
                data, got, _, _ = socket.recv_fds(self.sock, 4096, 1)
        msg: list[Any] = _dec.decode(data) if data else ["gone"]
        if msg[0] == "pid" and got:
            return int(msg[1]), got[0]
        for fd in got:
            os.close(fd)
        if msg[0] == "fail":
            raise Fallback(str(msg[1]))
        self.close()
        raise Died("the command's spawner died")

    def status_of(self, pid: int, pidfd: int) -> Callable[[bool], int]:
        """How the caller learns the wait status of the command ``pid`` it watches through ``pidfd``
        (SIGKILL where it cannot: the spawner died before it could tell)."""
        if not EXIT_INFO:
            return self.status

        def status(wanted: bool = True) -> int:
            got = reaped_status(pidfd, pid, REPLY_S)
            return int(signal.SIGKILL) if got is None else got

        return status

    def status(self, wanted: bool = True) -> int:
        """Before Linux 6.15: the command's wait status, once the spawner reaped it and sent it
        (SIGKILL if the spawner died)."""
        data = b""
        if self._answers(REPLY_S):
            with contextlib.suppress(OSError):
                data = self.sock.recv(256)
        if data:
            msg = _dec.decode(data)
            if msg[0] == "exit":
                return int(msg[1])
        self.close()
        return int(signal.SIGKILL)

    def _answers(self, timeout: float) -> bool:
        """Whether its answer (or its end) came within ``timeout``: the socket stays blocking (a
        timeout on it would cost two system calls a message to set and unset)."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return bool(poller.poll(int(timeout * 1000)))

    def close(self) -> None:
        """Let it go: it exits once its socket closes."""
        with contextlib.suppress(OSError):
            self.sock.close()

    @property
    def alive(self) -> bool:
        return self.sock.fileno() >= 0
