"""Only the daemon's own user gets in through a loopback HTTP listener (SEC-PEER).

A loopback TCP port is reachable by every local user, unlike the daemon's ``ipc://`` socket (0600 in
a 0700 directory). So each connection to a loopback listener is checked once, when it is accepted:
the kernel's table of TCP sockets (``/proc/net/tcp``, ``/proc/net/tcp6``) names the uid that owns the
*client's* socket (the row whose local address is the peer's address and whose remote address is
ours). A connection whose client socket is owned by another uid, or that cannot be found (it went,
or ``/proc`` is not there), gets ``403`` and a JSON error for every request it sends: nothing it
asks reaches the API or the token check. Listeners off loopback are reached from other hosts,
where no uid can be known: they need a token and an agent allowlist instead (``_listen``).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from .. import _peers
from ._guard import Scope, reply_error


def _refusal(uid: int | None) -> Any:
    who = "its owner could not be found" if uid is None else f"this connection belongs to uid {uid}"
    message = f"this HTTP listener serves only the daemon's user (uid {os.geteuid()}); {who}"

    async def refuse(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await reply_error(send, 403, "forbidden", message, [(b"connection", b"close")])

    return refuse


class SameUserOnly:
    """Mixin for a uvicorn HTTP protocol class (before it in the bases): when the front end is on
    loopback (``front.same_user_only``), a connection whose client socket another uid owns gets an
    app that answers every request ``403``. Counted in the front end's ``refused``."""

    front: Any
    app: Any

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if not getattr(self.front, "same_user_only", False):
            return
        sock = transport.get_extra_info("socket")
        uid = _peers.socket_peer_uid(sock) if sock is not None else None
        if uid != os.geteuid():  # SEC-PEER
            self.app = _refusal(uid)
            self.front.guard.refused += 1


def check_peer_lookup(listen: str) -> None:
    """SEC-PEER at start: a loopback listener is served only if this system says who owns a loopback
    connection (``sock_diag`` or ``/proc/net/tcp``): else every request, the daemon user's too,
    would get 403. Probed on a throwaway loopback connection; ``ValueError`` saying so."""
    try:
        server = socket.create_server(("127.0.0.1", 0))
    except OSError:
        return  # no IPv4 loopback to probe on: each connection is still checked (and refused if unknown)
    try:
        client = socket.create_connection(server.getsockname(), timeout=5)
        accepted, _ = server.accept()
        try:
            uid = _peers.socket_peer_uid(accepted)
        finally:
            accepted.close()
            client.close()
    finally:
        server.close()
    if uid != os.geteuid():
        raise ValueError(
            f"--http {listen}: this system does not say which user owns a loopback connection (neither "
            "netlink sock_diag nor /proc/net/tcp answers), so a loopback listener would refuse everyone; "
            "serve HTTP off loopback with --http-token and --allow-agent instead"
        )
