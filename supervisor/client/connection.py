"""A ``Client``'s connection to the daemon (``Connection``): the DEALER and its socket monitor, CURVE
keys, the handshake (``Hello``/``Welcome``), what a refused or lost connection means, and closing it.

``Client`` holds one ``Connection`` and calls ``open``/``aclose``. Like the daemon's parts, it is given
what it reads and writes — the endpoint and keys, and callbacks into the client (start its reader on the
shadow socket, shake hands, fail every pending call) — never the client. It owns the socket, the context,
the monitor, the background tasks and the state the client's request path reads (``state``, ``lost``).
A client call never hangs on a daemon that is not there (CLIENT-NO-HANG): a missing ``ipc://`` socket
file or a refused connection fails at once, a silent one after ``timeout``, a refused key as an
authentication error.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from wire import client_link
from worker.zmqlink import open_socket

from .._errors import AuthenticationFailed, DaemonUnavailable
from .._host import Background, require_asyncio
from .._paths import client_link_options, ipc_path

MONITORED = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_MONITOR_STOPPED
)


class Connection:
    """One client's link to the daemon: ``open`` connects, starts the reader (``linked`` gets the
    blocking shadow socket and the loop, ``reader`` is then run) and shakes hands (``hello``);
    ``fail_pending`` fails every pending call of the client when the link is lost or closed."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float | None,
        curve_server_key: str | bytes | None,
        curve_secret_key: str | os.PathLike[str] | None,
        linked: Callable[[zmq.Socket[bytes], asyncio.AbstractEventLoop], None],
        reader: Callable[[], Coroutine[Any, Any, None]],
        hello: Callable[[], Awaitable[Any]],
        fail_pending: Callable[[str], None],
    ) -> None:
        self.endpoint, self.timeout = endpoint, timeout
        self.curve_server_key, self.curve_secret_key = curve_server_key, curve_secret_key
        self._linked, self._reader, self._hello, self._fail_pending = linked, reader, hello, fail_pending
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._mon: zmq.asyncio.Socket | None = None
        self._tg: Background | None = None
        self.state = "new"  # new → open → closed
        self.lost: str | None = None
        self.auth_failed = False

    async def open(self) -> client_link.Welcome:
        """``Client.open``: connect and shake hands; the daemon's ``Welcome``. Raises
        ``DaemonUnavailable`` (endpoint named), ``AuthenticationFailed`` or ``ProtocolError``; nothing
        is left open when it raises."""
        if self.state != "new":
            raise RuntimeError("a Client connects once")
        loop = require_asyncio("Client", "SyncClient")  # API-ASYNCIO: trio is refused here, at once
        self.state = "open"
        path = ipc_path(self.endpoint)
        if path is not None and not path.exists():
            self.state = "closed"
            why = f"no socket file {path}"
            raise DaemonUnavailable(f"no turnpool daemon is running at {self.endpoint} ({why})")
        self._ctx = zmq.asyncio.Context()
        sock = open_socket(self._ctx, zmq.DEALER)  # WORKER-SHORT-SLICE
        client_link_options(sock)
        sock.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10000)
        try:
            if self.curve_secret_key is not None:
                self.setup_curve(sock)
            self._mon = sock.get_monitor_socket(MONITORED)
            sock.connect(self.endpoint)
        except (zmq.ZMQError, ValueError, OSError) as exc:
            sock.close(linger=0)
            self._ctx.term()
            self.state = "closed"
            raise DaemonUnavailable(f"cannot connect to {self.endpoint}: {exc}") from exc
        self._sock = sock
        self._linked(zmq.Socket.shadow(sock.underlying), loop)
        # API-ASYNCIO: the reader and the monitor live in a task of their own, so the client may be
        # closed from another task than the one that opened it (Jupyter cells, app lifespans).
        self._tg = Background(f"turnpool client {self.endpoint}")
        await self._tg.start(loop)
        self._tg.start_soon(self._reader)
        self._tg.start_soon(self.watch_monitor)
        try:
            welcome = None
            with anyio.move_on_after(self.timeout):
                with contextlib.suppress(DaemonUnavailable):
                    # A refused connection (stale socket file, closed port) fails this at once:
                    # the monitor sees every reconnect attempt being refused.
                    welcome = await self._hello()
            if self.auth_failed and self.curve_secret_key is None:
                # CLIENT-AUTH: a refused key is an authentication error.
                raise AuthenticationFailed(
                    f"the turnpool daemon at {self.endpoint} refused this client: it requires CURVE "
                    "(pass curve_server_key and curve_secret_key)"
                )
            if self.auth_failed:
                raise AuthenticationFailed(
                    f"the turnpool daemon at {self.endpoint} refused this client: the CURVE handshake failed "
                    "(is this client's public key in the daemon's --curve-clients directory, and is "
                    "curve_server_key the daemon's public key? A daemon at its connection limit also closes "
                    "new connections during the handshake: then try again)"
                )
            if welcome is None:
                why = self.lost or f"no answer within {self.timeout}s"
                raise DaemonUnavailable(f"no turnpool daemon is running at {self.endpoint} ({why})")
        except BaseException:
            await self.aclose()
            raise
        assert isinstance(welcome, client_link.Welcome)
        return welcome

    def setup_curve(self, sock: zmq.asyncio.Socket) -> None:
        """CURVE on ``sock``: the daemon's public key (given, or read from its certificate file) and
        this client's key pair (its ``.key_secret`` file); a file without a secret key is refused."""
        import zmq.auth

        server = self.curve_server_key
        if isinstance(server, str) and os.path.exists(server):
            server, _ = zmq.auth.load_certificate(server)
        elif isinstance(server, str):
            server = server.encode()
        public, secret = zmq.auth.load_certificate(os.fspath(self.curve_secret_key))  # type: ignore[arg-type]
        if not secret:
            raise ValueError(f"{self.curve_secret_key} holds no secret key (use the .key_secret file)")
        sock.curve_serverkey = server
        sock.curve_publickey = public
        sock.curve_secretkey = secret

    async def aclose(self) -> None:
        """``Client.aclose``: fail every pending call, then close the tasks, sockets and context. Turns
        this client submitted go on running in the daemon."""
        if self.state == "closed":
            return
        self.state = "closed"
        self._fail_pending("the client was closed")
        if self._tg is not None:
            with contextlib.suppress(Exception):
                await self._tg.aclose()
            self._tg = None
        if self._sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disable_monitor()
            self._sock.close(linger=0)
            self._sock = None
        if self._mon is not None:
            self._mon.close(linger=0)
            self._mon = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def watch_monitor(self) -> None:
        """Follow the socket monitor: a lost or refused connection fails every pending call at once (a
        call never waits on a daemon that is gone); a failed security handshake is remembered, so that
        ``open`` reports it as ``AuthenticationFailed``, not as a missing daemon."""
        assert self._mon is not None
        while True:
            try:
                event = parse_monitor_message(await self._mon.recv_multipart())
            except (zmq.ZMQError, RuntimeError):
                return
            kind = event["event"]
            if kind == zmq.EVENT_CONNECTED:
                self.lost = None
            elif kind == zmq.EVENT_DISCONNECTED:
                self.lost = "the connection to the daemon was lost"
                self._fail_pending(self.lost)
            elif kind == zmq.EVENT_CONNECT_RETRIED:
                self.lost = "connection refused"
                self._fail_pending(self.lost)
            elif kind in (
                zmq.EVENT_HANDSHAKE_FAILED_AUTH,
                zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
            ):
                # The daemon is there but refused this client (or its key): an authentication
                # failure, not a missing daemon.
                self.auth_failed = True
                self.lost = "the security handshake failed (CURVE keys?)"
                self._fail_pending(self.lost)
            elif kind == zmq.EVENT_MONITOR_STOPPED:
                return
