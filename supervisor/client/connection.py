"""Opening and closing a ``Client``'s connection to the daemon: the DEALER and its socket monitor,
CURVE keys, the handshake (``Hello``/``Welcome``), and what a refused or lost connection means.

``Client.open`` and ``Client.aclose`` call these; they read and set the client's connection state
(its socket, context, tasks and ``_lost``), which the client's request path then uses. A client call
never hangs on a daemon that is not there (CLIENT-NO-HANG): a missing ``ipc://`` socket file or a refused
connection fails at once, a silent one after ``timeout``, a refused key as an authentication error.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

import anyio
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from wire import client_link

from .._errors import AuthenticationFailed, DaemonUnavailable
from .._host import Background, require_asyncio
from .._paths import client_link_options, ipc_path

if TYPE_CHECKING:
    from .client import Client

MONITORED = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_MONITOR_STOPPED
)


async def open_connection(client: Client) -> None:
    """``Client.open``: connect and shake hands. Raises ``DaemonUnavailable`` (endpoint named),
    ``AuthenticationFailed`` or ``ProtocolError``; nothing is left open when it raises."""
    if client._state != "new":
        raise RuntimeError("a Client connects once")
    loop = require_asyncio("Client", "SyncClient")  # API-ASYNCIO: trio is refused here, at once
    client._state = "open"
    path = ipc_path(client.endpoint)
    if path is not None and not path.exists():
        client._state = "closed"
        raise DaemonUnavailable(f"no turnpool daemon is running at {client.endpoint} (no socket file {path})")
    client._ctx = zmq.asyncio.Context()
    sock = client._ctx.socket(zmq.DEALER)
    client_link_options(sock)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 2000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10000)
    try:
        if client.curve_secret_key is not None:
            setup_curve(client, sock)
        client._mon = sock.get_monitor_socket(MONITORED)
        sock.connect(client.endpoint)
    except (zmq.ZMQError, ValueError, OSError) as exc:
        sock.close(linger=0)
        client._ctx.term()
        client._state = "closed"
        raise DaemonUnavailable(f"cannot connect to {client.endpoint}: {exc}") from exc
    client._sock = sock
    client._sync = zmq.Socket.shadow(sock.underlying)
    client._loop = client._pass.loop = loop
    # API-ASYNCIO: the reader and the monitor live in a task of their own, so the client may be
    # closed from another task than the one that opened it (Jupyter cells, app lifespans).
    client._tg = Background(f"turnpool client {client.endpoint}")
    await client._tg.start(loop)
    client._tg.start_soon(client._reader)
    client._tg.start_soon(watch_monitor, client)
    try:
        welcome = None
        with anyio.move_on_after(client.timeout):
            with contextlib.suppress(DaemonUnavailable):
                # A refused connection (stale socket file, closed port) fails this at once:
                # the monitor sees every reconnect attempt being refused.
                welcome = await hello(client)
        if client._auth_failed and client.curve_secret_key is None:
            # CLIENT-AUTH: a refused key is an authentication error.
            raise AuthenticationFailed(
                f"the turnpool daemon at {client.endpoint} refused this client: it requires CURVE "
                "(pass curve_server_key and curve_secret_key)"
            )
        if client._auth_failed:
            raise AuthenticationFailed(
                f"the turnpool daemon at {client.endpoint} refused this client: the CURVE handshake failed "
                "(is this client's public key in the daemon's --curve-clients directory, and is "
                "curve_server_key the daemon's public key? A daemon at its connection limit also closes "
                "new connections during the handshake: then try again)"
            )
        if welcome is None:
            why = client._lost or f"no answer within {client.timeout}s"
            raise DaemonUnavailable(f"no turnpool daemon is running at {client.endpoint} ({why})")
    except BaseException:
        await client.aclose()
        raise
    assert isinstance(welcome, client_link.Welcome)
    client.daemon_pid = welcome.pid
    client.max_message_size = welcome.max_message_size
    client.protocol = welcome.version


async def hello(client: Client) -> Any:
    """Shake hands: this client speaks ``CLIENT_PROTOCOL_VERSION``; a daemon that does not
    (an older one) answers ``protocol`` and ``ProtocolError`` is raised. The daemon accepts
    older clients and says in ``Welcome`` which version it speaks to this one."""
    return await client._call(
        lambda req: client_link.Hello(req, client_link.CLIENT_PROTOCOL_VERSION),
        bounded=False,
        handshake=True,
    )


def setup_curve(client: Client, sock: zmq.asyncio.Socket) -> None:
    """CURVE on ``sock``: the daemon's public key (given, or read from its certificate file) and
    this client's key pair (its ``.key_secret`` file); a file without a secret key is refused."""
    import zmq.auth

    server = client.curve_server_key
    if isinstance(server, str) and os.path.exists(server):
        server, _ = zmq.auth.load_certificate(server)
    elif isinstance(server, str):
        server = server.encode()
    public, secret = zmq.auth.load_certificate(os.fspath(client.curve_secret_key))  # type: ignore[arg-type]
    if not secret:
        raise ValueError(f"{client.curve_secret_key} holds no secret key (use the .key_secret file)")
    sock.curve_serverkey = server
    sock.curve_publickey = public
    sock.curve_secretkey = secret


async def close_connection(client: Client) -> None:
    """``Client.aclose``: fail every pending call, then close the tasks, sockets and context. Turns
    this client submitted go on running in the daemon."""
    if client._state == "closed":
        return
    client._state = "closed"
    client._fail_pending("the client was closed")
    if client._tg is not None:
        with contextlib.suppress(Exception):
            await client._tg.aclose()
        client._tg = None
    if client._sock is not None:
        with contextlib.suppress(zmq.ZMQError):
            client._sock.disable_monitor()
        client._sock.close(linger=0)
        client._sock = None
    if client._mon is not None:
        client._mon.close(linger=0)
        client._mon = None
    if client._ctx is not None:
        client._ctx.term()
        client._ctx = None


async def watch_monitor(client: Client) -> None:
    """Follow the socket monitor: a lost or refused connection fails every pending call at once (a
    call never waits on a daemon that is gone); a failed security handshake is remembered, so that
    ``open_connection`` reports it as ``AuthenticationFailed``, not as a missing daemon."""
    assert client._mon is not None
    while True:
        try:
            event = parse_monitor_message(await client._mon.recv_multipart())
        except (zmq.ZMQError, RuntimeError):
            return
        kind = event["event"]
        if kind == zmq.EVENT_CONNECTED:
            client._lost = None
        elif kind == zmq.EVENT_DISCONNECTED:
            client._lost = "the connection to the daemon was lost"
            client._fail_pending(client._lost)
        elif kind == zmq.EVENT_CONNECT_RETRIED:
            client._lost = "connection refused"
            client._fail_pending(client._lost)
        elif kind in (
            zmq.EVENT_HANDSHAKE_FAILED_AUTH,
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
            zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
        ):
            # The daemon is there but refused this client (or its key): an authentication
            # failure, not a missing daemon.
            client._auth_failed = True
            client._lost = "the security handshake failed (CURVE keys?)"
            client._fail_pending(client._lost)
        elif kind == zmq.EVENT_MONITOR_STOPPED:
            return
