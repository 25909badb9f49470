"""DAEMON-FD: the daemon's descriptors are shared out, so no flood of connections brings it down.

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
* when the process comes within a quarter of the reserve of its limit all the same, the endpoint
  stops listening for ``PAUSE_SECONDS`` (``ClientEndpoint.pause``): shutting connections down one by
  one is too slow against clients that reconnect at once, since libzmq accepts on its own thread.
  Unbinding drops the connections it accepted too (libzmq owns them under the listener): clients
  are disconnected, and ZeroMQ reconnects them once it listens again. A flood of clients costs
  everyone their connection now and then, never the daemon;
* ``HANDSHAKE_IVL`` closes a connection that has not completed its ZeroMQ (and CURVE) handshake
  within ``HANDSHAKE_SECONDS``: raw TCP connections that say nothing hold no share for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

import zmq

from .._fds import SHORTAGE, FdBudget, open_fds

log = logging.getLogger("turnpool.daemon")

HANDSHAKE_SECONDS = 10.0
# The client endpoint's listen backlog (libzmq's default is 100): what one burst can add at once.
LISTEN_BACKLOG = 16
# How long the endpoint stops listening once the clients' share is full.
PAUSE_SECONDS = 1.0


class ClientConnections:
    """Connections of the client endpoint, and the share they may hold (see the module docstring)."""

    def __init__(self, budget: FdBudget) -> None:
        self.budget = budget
        self.open: set[int] = set()
        self.refused = 0
        self.local: Any = None  # the address the endpoint is bound to (what each fd must show)
        # Stop and start listening (``ClientEndpoint.pause``/``resume``): at the share, and at half of it.
        self.pause: Any = None
        self.resume: Any = None
        self.pauses = 0
        self.shortage = 0  # accepts that failed with EMFILE/ENFILE (libzmq's tcp listener retries them)
        self._resume_at: asyncio.TimerHandle | None = None

    def bound(self, sock: Any) -> None:
        """The endpoint is bound: remember its address (connections to it show it as their own)."""
        with contextlib.suppress(Exception):
            endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            self.local = _address_of(endpoint)

    def accepted(self, fd: int) -> None:
        if len(self.open) < self.budget.share:
            self.open.add(fd)
            return
        if self._shut(fd):
            self.refused += 1
            if self.refused & (self.refused - 1) == 0:  # 1st, 2nd, 4th…: a flood floods no log
                log.warning(
                    "client connections past the %d allowed are closed (%d so far)",
                    self.budget.share,
                    self.refused,
                )
        # The emergency brake: libzmq accepts on its own thread, faster than connections are shut
        # here when clients reconnect at once; near the limit, stop listening for a moment.
        used = open_fds()
        brake = self.budget.limit - self.budget.reserve // 4
        if (used is None or used >= brake) and self.pause is not None and self._resume_at is None:
            self.pause()
            self.pauses += 1
            # Unbinding drops every connection the listener accepted (libzmq owns them under it),
            # without a disconnect event each: none is left to count.
            self.open.clear()
            self._resume_at = asyncio.get_running_loop().call_later(PAUSE_SECONDS, self._resume)

    def accept_failed(self, err: int) -> None:
        if err in SHORTAGE:
            self.shortage += 1

    def closed(self, fd: int) -> None:
        self.open.discard(fd)

    def _resume(self) -> None:
        self._resume_at = None
        if self.resume is not None:
            self.resume()

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
        _host, _, port = endpoint[len("tcp://") :].rpartition(":")
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
