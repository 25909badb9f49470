"""Which local uid is on the other end of a TCP connection (A-PEER).

Read from the kernel's table of TCP sockets (``/proc/net/tcp``, ``/proc/net/tcp6``): the row whose
local address is the peer's address and whose remote address is ours is the *client's* socket, and
its ``uid`` column is the uid that owns it. Only live rows count; anything not found is ``None``,
so a caller that needs a uid fails closed. Used by the HTTP front end (``http/_peer.py``).
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from typing import Any

# Socket states of a live client end (include/net/tcp_states.h): ESTABLISHED, FIN_WAIT1, FIN_WAIT2,
# CLOSE_WAIT. A TIME_WAIT row (6) is owned by nobody (uid 0, inode 0) and never matches.
_LIVE = {"01", "04", "05", "08"}


def _hex_address(host: str, port: int) -> str:
    """``host:port`` as ``/proc/net/tcp{,6}`` writes it: each 32-bit word of the address printed as
    the host-order integer the kernel holds, then the port, all in upper-case hex."""
    packed = ipaddress.ip_address(host).packed
    words = (int.from_bytes(packed[i : i + 4], sys.byteorder) for i in range(0, len(packed), 4))
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def connection_uid(peer: tuple[Any, ...], local: tuple[Any, ...], *, root: str = "/proc/net") -> int | None:
    """The uid owning the client socket of the TCP connection ``peer`` → ``local`` on this
    machine (both ``(host, port, ...)`` as ``getpeername``/``getsockname`` give them), or ``None``
    when no live row says so."""
    try:
        version = ipaddress.ip_address(peer[0]).version
        want_local = _hex_address(peer[0], int(peer[1]))
        want_remote = _hex_address(local[0], int(local[1]))
    except (ValueError, TypeError, IndexError):
        return None
    path = f"{root}/tcp6" if version == 6 else f"{root}/tcp"
    try:
        with open(path, encoding="ascii", errors="replace") as table:
            next(table, None)  # the header
            for line in table:
                fields = line.split()
                if len(fields) < 10 or fields[1] != want_local or fields[2] != want_remote:
                    continue
                if fields[3] in _LIVE and fields[9] != "0":
                    return int(fields[7])
    except (OSError, ValueError):
        return None
    return None


def socket_peer_uid(sock: socket.socket) -> int | None:
    """``connection_uid`` of an accepted TCP socket (``None`` for anything else)."""
    try:
        return connection_uid(sock.getpeername(), sock.getsockname())
    except (OSError, TypeError):
        return None
