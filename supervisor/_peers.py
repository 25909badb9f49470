"""Which local uid is on the other end of a TCP connection (SEC-PEER).

The kernel knows the uid that owns every socket. For an accepted connection ``peer`` → ``local``,
the *client's* socket is the one whose local address is ``peer`` and whose remote address is
``local``; its owner is the uid asked for. Two ways to ask, the first one preferred:

* ``sock_diag`` (netlink, ``NETLINK_SOCK_DIAG``, an exact lookup by the four addresses): one round
  trip, ≈ 20 µs whatever the number of sockets on the machine.
* ``/proc/net/tcp{,6}``: the whole table, read and scanned; several ms with a few thousand sockets
  (measured here: 2.7-3.6 ms with the sockets other processes held, 10-17 ms with 3,000 more),
  so it is only the fallback where netlink is not allowed (some sandboxes).

Only live rows count (a ``TIME_WAIT`` row belongs to nobody: uid 0, inode 0); anything not found
is ``None``, so a caller that needs a uid fails closed. Used by the HTTP front end
(``http/_peer.py``).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import sys
from typing import Any

# Socket states of a live client end (include/net/tcp_states.h): ESTABLISHED, FIN_WAIT1, FIN_WAIT2,
# CLOSE_WAIT. A TIME_WAIT row (6) is owned by nobody (uid 0, inode 0) and never matches.
_LIVE_STATES = (1, 4, 5, 8)
_LIVE = {f"{state:02X}" for state in _LIVE_STATES}

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NO_COOKIE = 0xFFFFFFFF
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_REQUEST = struct.Struct("=BBBxI")  # inet_diag_req_v2: family, protocol, ext, states
_SOCKID = struct.Struct("!HH16s16s")  # sport, dport (network order), src, dst
_TAIL = struct.Struct("=III")  # if, cookie[2]
_REPLY = struct.Struct("=BBBB")  # inet_diag_msg: family, state, timer, retrans, then the sockid
_UID_AT = _HEADER.size + _REPLY.size + _SOCKID.size + _TAIL.size + 12  # after expires, rqueue, wqueue


def _hex_address(host: str, port: int) -> str:
    """``host:port`` as ``/proc/net/tcp{,6}`` writes it: each 32-bit word of the address printed as
    the host-order integer the kernel holds, then the port, all in upper-case hex."""
    packed = ipaddress.ip_address(host).packed
    words = (int.from_bytes(packed[i : i + 4], sys.byteorder) for i in range(0, len(packed), 4))
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def diag_uid(peer: tuple[Any, ...], local: tuple[Any, ...]) -> int | None:
    """``connection_uid`` through ``sock_diag``; raises ``OSError`` when netlink cannot be used."""
    src, dst = ipaddress.ip_address(peer[0]), ipaddress.ip_address(local[0])
    family = socket.AF_INET6 if src.version == 6 else socket.AF_INET
    states = sum(1 << state for state in _LIVE_STATES)
    body = (
        _REQUEST.pack(family, socket.IPPROTO_TCP, 0, states)
        + _SOCKID.pack(int(peer[1]), int(local[1]), src.packed.ljust(16, b"\0"), dst.packed.ljust(16, b"\0"))
        + _TAIL.pack(0, _NO_COOKIE, _NO_COOKIE)
    )
    message = _HEADER.pack(_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + body
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.sendto(message, (0, 0))
        reply = nl.recv(8192)
    if len(reply) < _HEADER.size:
        return None
    _, kind, _, _, _ = _HEADER.unpack_from(reply)
    if kind == _NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", reply, _HEADER.size)
        if code in (-errno.ENOENT, 0):
            return None  # no such socket: gone, or never there
        raise OSError(-code, "sock_diag refused the lookup")
    if kind != _SOCK_DIAG_BY_FAMILY or len(reply) < _UID_AT + 8:
        return None
    _, state, _, _ = _REPLY.unpack_from(reply, _HEADER.size)
    uid, inode = struct.unpack_from("=II", reply, _UID_AT)
    return uid if state in _LIVE_STATES and inode != 0 else None


def proc_uid(peer: tuple[Any, ...], local: tuple[Any, ...], *, root: str = "/proc/net") -> int | None:
    """``connection_uid`` through ``/proc/net/tcp{,6}`` (``root``: another directory, for tests)."""
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


def connection_uid(peer: tuple[Any, ...], local: tuple[Any, ...]) -> int | None:
    """The uid owning the client socket of the TCP connection ``peer`` → ``local`` on this
    machine (both ``(host, port, ...)`` as ``getpeername``/``getsockname`` give them), or ``None``
    when no live socket says so: ``sock_diag`` first, ``/proc/net/tcp{,6}`` where netlink fails."""
    try:
        return diag_uid(peer, local)
    except (ValueError, TypeError, IndexError):
        return None
    except OSError:
        return proc_uid(peer, local)


def socket_peer_uid(sock: Any) -> int | None:
    """``connection_uid`` of an accepted TCP socket (``None`` for anything else)."""
    try:
        return connection_uid(sock.getpeername(), sock.getsockname())
    except (OSError, TypeError):
        return None
