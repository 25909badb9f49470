"""D-FD: the daemon's descriptors are shared out, so no flood of connections brings it down.

libzmq accepts every connection to the client endpoint by itself, however many come, and aborts
the process (SIGABRT) when an ``accept`` on an ``ipc://`` listener — the client endpoint's or the
worker link's — finds no descriptor. So the daemon never lets connections take them all:

* at start the soft ``RLIMIT_NOFILE`` is raised to the hard limit (``supervisor/_fds.py``);
* ``FdBudget`` keeps a reserve for the engine and gives each front end (ZeroMQ clients, HTTP) a
  share; the HTTP front end caps its open connections at its share (``http/_bounds.py``);
* ``ClientConnections`` counts the client endpoint's connections from the ROUTER's monitor
  (``EVENT_ACCEPTED`` / ``EVENT_DISCONNECTED``, each with the connection's descriptor) and shuts
  down (``shutdown(2)``, no new descriptor needed) each one accepted past the share: libzmq sees it
  closed and frees it; a ZeroMQ client that was refused reconnects by itself later;
* ``HANDSHAKE_IVL`` closes a connection that has not completed its ZeroMQ (and CURVE) handshake
  within ``HANDSHAKE_SECONDS``: raw TCP connections that say nothing hold no share for long.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any

import zmq

from .._fds import FdBudget

log = logging.getLogger("turnpool.daemon")

HANDSHAKE_SECONDS = 10.0


class ClientConnections:
    """Connections of the client endpoint, and the share they may hold (see the module docstring)."""

    def __init__(self, budget: FdBudget) -> None:
        self.budget = budget
        self.open: set[int] = set()
        self.refused = 0
        self.local: Any = None  # the address the endpoint is bound to (what each fd must show)

    def bound(self, sock: Any) -> None:
        """The endpoint is bound: remember its address (connections to it show it as their own)."""
        with contextlib.suppress(Exception):
            endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            self.local = _address_of(endpoint)

    def accepted(self, fd: int) -> None:
        if len(self.open) >= self.budget.share:
            if self._shut(fd):
                self.refused += 1
                if self.refused & (self.refused - 1) == 0:  # 1st, 2nd, 4th…: a flood floods no log
                    log.warning(
                        "client connections past the %d allowed are closed (%d so far)",
                        self.budget.share,
                        self.refused,
                    )
                return
        self.open.add(fd)

    def closed(self, fd: int) -> None:
        self.open.discard(fd)

    def _shut(self, fd: int) -> bool:
        """Shut the connection on ``fd`` down (libzmq closes it), if ``fd`` still is a connection to
        our endpoint (it may have been closed and reused meanwhile: then it is left alone)."""
        try:
            sock = socket.socket(fileno=fd)  # wraps the descriptor: takes no new one
        except OSError:
            return False
        try:
            if self.local is not None and _same(sock.getsockname(), self.local):
                sock.shutdown(socket.SHUT_RDWR)
                return True
            return False
        except OSError:
            return False
        finally:
            sock.detach()  # libzmq owns the descriptor: never close it here


def _address_of(endpoint: str) -> Any:
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://") :].rpartition(":")
        return ("tcp", int(port))
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        return ("ipc", "\0" + path[1:] if path.startswith("@") else path)
    return None


def _same(name: Any, local: Any) -> bool:
    kind, where = local
    if kind == "tcp":
        return isinstance(name, tuple) and len(name) >= 2 and name[1] == where
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return bool(name == where)
