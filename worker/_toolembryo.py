"""A function call's embryo that its caller talks to directly (TOOL-EMBRYO-DIRECT).

A function's template forks an *embryo* into a set of kept groups when its caller asks for one (at the
end of the call that kept them: no call of theirs runs then), on a socket pair of the caller's: the
embryo stands in its groups, set up as far as no call is needed, runs the call's own path once on a
dummy (``rehearse``: the copy-on-write faults of that path are taken while it waits, not during the
call), sends ``["ready", pid]`` with a pidfd of itself, and waits. The caller hands it the call on that
socket: its request and descriptors, with no answer awaited (the pidfd and the result pipe say the
rest). The template holds the embryo's end of the socket too, and, having reaped it, sends its exit
status there: the caller reads it only when the call's outcome does not say how it ended.

An embryo whose caller closes its end before a call came exits (nothing of a call ran); one whose
template dies is killed by its parent-death signal.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import msgspec

from . import _toolchild

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()

MAX_REQUEST = 70_000
MAX_FDS = 8
READY_S = 0.05  # the longest a call waits for its embryo to be ready (then: the template forks it)
REPLY_S = 60.0
SETTLE_ROUNDS = 10  # rehearsals in the template before its first fork


def _noop() -> None:
    """The function a rehearsal calls (never the user's)."""
    return None


def rehearse(find: Callable[[dict[str, Any]], Any], child: Callable[..., None], scratch: int) -> None:
    """The call's path, on a dummy: a request shaped like a real one crosses a socket with its
    descriptors, is decoded and found, the call set up (``_toolchild.setup`` without touching
    descriptors), the no-op run and its outcome encoded and written to ``scratch`` (a pipe nobody
    reads from, or /dev/null). Nothing leaves the process; its state is as before, but its pages
    (interpreter, type caches, allocator) are its own, and the code specialised."""
    req = {
        "kind": "fn",
        "mod": __name__,
        "qual": "_noop",
        "async": False,
        "args": _enc.encode([[], {}]),
        "path": list(sys.path),
        "cwd": None,
        "lim": [None, None, None, True],
        "env": dict(os.environ),
        "join": [],
        "limited": [],
        "contain": None,
    }
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        socket.send_fds(a, [_enc.encode(req)], [scratch, scratch, scratch])
        data, fds, _, _ = socket.recv_fds(b, MAX_REQUEST + 4096, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
    finally:
        a.close()
        b.close()
    try:
        got = _dec.decode(data)
        child(got, find(got), fds, prepared=True, rehearsal=True)
    finally:
        for fd in fds:
            os.close(fd)


def settle(
    find: Callable[[dict[str, Any]], Any], child: Callable[..., None], rounds: int = SETTLE_ROUNDS
) -> None:
    """In the template, before its first fork: the call's path rehearsed ``rounds`` times, so that
    its code is specialised once there (as the zygote does for workers, WORKER-SETTLE), not in each
    embryo."""
    scratch = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        for _ in range(rounds):
            rehearse(find, child, scratch)
    except Exception as exc:  # noqa: BLE001 - only a saving
        print(f"turnpool tool template: rehearsing a call failed: {exc!r}", file=sys.stderr)
    finally:
        os.close(scratch)


def serve(
    sock: socket.socket,
    join: list[str],
    env: dict[str, str] | None,
    parent: int,
    scrub: bool,
    find: Callable[[dict[str, Any]], Any],
    child: Callable[..., None],
) -> NoReturn:
    """The embryo's main, in a fork of the functions template (``parent``): into the groups ``join``,
    rehearsed, ready, then the one call its caller sends (``child(req, fn, fds, prepared=True)``,
    ``_tooltemplate._child``)."""
    try:
        _toolchild.own_process(join, scrub=scrub, keep=sock.fileno())
        if env is not None:
            _toolchild.set_environment(env)
        if os.getppid() != parent:
            os._exit(0)  # the template died during the fork: no parent-death signal will come
        scratch = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        with contextlib.suppress(Exception):
            rehearse(find, child, scratch)
        os.close(scratch)
        pidfd = os.pidfd_open(os.getpid())
        socket.send_fds(sock, [_enc.encode(["ready", os.getpid()])], [pidfd])
        os.close(pidfd)
        data, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST + 4096, MAX_FDS)
    except BaseException:  # noqa: BLE001 - never ready (or stopped before its call): nothing ran
        os._exit(70)
    sock.close()  # (the template's copy carries our exit status)
    if not data or len(fds) < 3:
        os._exit(0)  # the caller let it go
    try:
        req = _dec.decode(data)
        _toolchild.take_args(req, fds)
        fn = find(req)
    except BaseException as exc:  # noqa: BLE001 - told to the caller
        with contextlib.suppress(BaseException):
            if type(exc).__name__ == "Fallback":  # not found here: the caller makes the call itself
                _toolchild.write_all(fds[0], _enc.encode(["fallback", str(exc)]))
            else:
                _toolchild.report_setup_error(fds[0], exc)
        os._exit(70)
    child(req, fn, fds, prepared=True)
    os._exit(70)  # (``child`` does not return)


# ---- the caller's side --------------------------------------------------------------------------


class Gone(Exception):
    """The embryo is gone, or not ready: the call is made without it (nothing of it ran)."""


class Embryo:
    """An embryo, as its caller sees it (made by ``template``)."""

    def __init__(self, sock: socket.socket, template: Any) -> None:
        self.sock = sock
        self.template = template
        self.pid: int | None = None
        self.pidfd: int | None = None

    def ready(self, timeout: float = READY_S) -> bool:
        """Whether it waits for its call (waits for it at most ``timeout``)."""
        if self.pid is None:
            msg, fds = _toolchild.receive(self.sock, timeout, 1)
            with contextlib.suppress(TypeError, ValueError, IndexError):
                if msg[0] == "ready" and fds:
                    self.pid, self.pidfd = int(msg[1]), fds.pop()
            for fd in fds:
                os.close(fd)
        return self.pid is not None

    def start(self, req: dict[str, Any], fds: list[int]) -> tuple[int, int]:
        """Hand it the call: (its pid, a pidfd of it, now the caller's). Raises ``Gone`` when it is
        not ready or has died (the request was not sent: nothing of the call ran)."""
        if not self.ready() or self.pidfd is None or self.pid is None:
            raise Gone("the embryo is not ready")
        if select.select([self.pidfd], [], [], 0)[0]:
            raise Gone("the embryo is gone")  # (killed while it waited: its template died?)
        proc = getattr(self.template, "proc", None)
        if proc is not None and proc.poll() is not None:
            # Its template has died: its parent-death signal is on its way to the embryo (sent
            # before the template's exit is seen), so the call would die with it, never run.
            raise Gone("the embryo's template is gone")
        try:
            socket.send_fds(self.sock, [_enc.encode(req)], fds)
        except OSError:
            raise Gone("the embryo is gone") from None
        pidfd, self.pidfd = self.pidfd, None
        return self.pid, pidfd

    def status(self, wanted: bool = True) -> int:
        """The call's wait status, from its template once reaped (SIGKILL if the template is gone);
        0 without waiting when not ``wanted``. Lets the embryo go."""
        if not wanted:
            self.close()
            return 0
        self.sock.settimeout(REPLY_S)
        try:
            data = self.sock.recv(256)
        except OSError:
            data = b""
        self.close()
        with contextlib.suppress(msgspec.DecodeError, IndexError, ValueError):
            msg = _dec.decode(data) if data else None
            if msg is not None and msg[0] == "exit":
                return int(msg[1])
        return int(signal.SIGKILL)

    def close(self) -> None:
        """Let it go: a waiting embryo exits once its socket closes."""
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None
        with contextlib.suppress(OSError):
            self.sock.close()
