"""The daemon's side of the client link: claim the endpoint, bind the ROUTER, release it.

* ``ipc://``: the directory is made 0700; an exclusive ``flock`` on ``<socket>.lock`` (holding
  the pid) is held for the daemon's life, so a second daemon is refused with a clear message and
  a socket file nobody holds the lock for is stale and replaced. The socket file is born 0600
  (umask during bind) and removed at exit, and so is the lock file (DAEMON-LOCK): it is unlinked while
  still locked, and a claim counts only once the path still names the inode it locked (else it
  opens the path again), so a daemon that locked an unlinked file never believes it holds the
  endpoint. A lock file left by a daemon killed with SIGKILL is taken over by the next daemon on
  that endpoint, and removed when that one stops.
* ``tcp://``: the bind itself refuses a second daemon (``EADDRINUSE``); ``:0`` picks a free port.
  With a CURVE secret key and a directory of allowed client certificates, only those clients
  get in (``zmq.auth``'s asyncio authenticator).
* Who can reach it (SEC-SHARED): an ``ipc://`` path is private (the socket 0600 in a 0700
  directory, so only this uid connects). ``tcp://`` and abstract ``ipc://@name`` are reachable by
  every local user: they need CURVE (or ``--insecure-tcp``) **and** an agent allowlist
  (``--allow-agent``); without them the daemon refuses to start.
* Every client-link socket, both sides: ``LINGER`` 0, ``MAXMSGSIZE``; the ROUTER also
  ``ROUTER_MANDATORY`` (a reply to a client that is gone fails instead of vanishing) and a send
  high-water mark of ``CLIENT_SNDHWM`` messages per client, so a client that stops reading makes
  the daemon's send fail (``EAGAIN``) instead of growing the daemon's memory (CLIENT-ISOLATED), and a
  handshake deadline (``HANDSHAKE_IVL``, DAEMON-FD).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from worker.zmqlink import open_socket

from .._errors import DaemonAlreadyRunning
from .._paths import check_endpoint, client_link_options, ipc_path
from .conn_guard import HANDSHAKE_SECONDS, LISTEN_BACKLOG

log = logging.getLogger("turnpool.daemon")


# Replies queued for one client before a send to it fails with EAGAIN (the daemon then drops that
# client's pending requests and tells it once it reads again). Event batches are at most
# ``EVENTS_BATCH_BYTES`` (or one event), so a client that never reads holds at most about
# CLIENT_SNDHWM * 64 KiB of small events in the daemon.
CLIENT_SNDHWM = 256


def reachable_by_others(endpoint: str) -> bool:
    """Whether another uid can connect to ``endpoint``: ``tcp://`` (any local user, and other hosts
    unless bound to loopback) and abstract ``ipc://@name`` sockets (no file mode: any user in the
    network namespace). An ``ipc://`` path is the daemon's own: its socket file is 0600."""
    return endpoint.startswith(("tcp://", "ipc://@"))


class ClientEndpoint:
    """One daemon's hold on its client endpoint: ``claim()``, ``bind()``; ``close()``, ``release()``."""

    def __init__(
        self,
        address: str,
        *,
        curve_secret_key: str | os.PathLike[str] | None = None,
        curve_clients: str | os.PathLike[str] | None = None,
        insecure_tcp: bool = False,
        agents_restricted: bool = False,
    ) -> None:
        check_endpoint(address, bind=True)  # CLI-ENDPOINT
        if curve_secret_key is not None and curve_clients is None:
            raise ValueError("CURVE needs the directory of allowed client certificates (--curve-clients)")
        if reachable_by_others(address) and curve_secret_key is None and not insecure_tcp:
            raise ValueError(
                f"refusing to serve {address} without CURVE: anyone who can reach it could run code as "
                "this user. Give --curve-secret-key FILE and --curve-clients DIR (see zmq.auth), use an "
                "ipc:// path, or pass --insecure-tcp on a trusted network"
            )
        # SEC-SHARED: an endpoint other users can reach names only allowed agents.
        if reachable_by_others(address) and not agents_restricted:
            raise ValueError(
                f"refusing to serve {address} without an agent allowlist: other users (and, over tcp, "
                "other hosts) can reach it. Give --allow-agent PATTERN (e.g. 'myapp.agents:*'), or use "
                "a private ipc:// path"
            )
        self.address = address
        self.curve_secret_key = curve_secret_key
        self.curve_clients = curve_clients
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._auth: Any = None
        self._lock_fd = -1
        self._owns_socket_file = False
        self.paused = False  # DAEMON-FD: unbound while the clients hold their whole share of descriptors

    # DAEMON-PRIVATE: one daemon per endpoint (flock on <socket>.lock), private by default.
    def claim(self) -> None:
        """Take the endpoint's lock (``ipc://``); raises ``DaemonAlreadyRunning`` if a live daemon has it."""
        path = ipc_path(self.address)
        if path is None or self._lock_fd >= 0:
            return
        # The default endpoint's directory was made (0700, checked ours) by default_endpoint().
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if len(str(path).encode()) > 107:
            raise ValueError(f"ipc path is longer than the 107 bytes a unix socket allows: {path}")
        lock = Path(f"{path}.lock")
        while True:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise DaemonAlreadyRunning(
                    f"a turnpool daemon (pid {other}) is already serving {self.address}; "
                    "stop it first or choose another --endpoint"
                ) from None
            try:
                same = os.stat(lock).st_ino == os.fstat(fd).st_ino  # DAEMON-LOCK: not unlinked meanwhile
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # a stopping daemon removed the file we locked: lock the path's new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        if path.exists() or path.is_symlink():
            log.info("replacing the stale socket file %s left by a daemon that is gone", path)
            path.unlink()

    def bind(self) -> zmq.asyncio.Socket:
        """Bind the ROUTER (with CURVE when configured) and return it."""
        self._ctx = zmq.asyncio.Context()
        sock = open_socket(self._ctx, zmq.ROUTER)  # WORKER-SHORT-SLICE
        client_link_options(sock)
        sock.setsockopt(zmq.SNDHWM, CLIENT_SNDHWM)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # DAEMON-FD: a connection that has not finished its handshake (CURVE's included) in time is closed.
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_SECONDS * 1000))
        sock.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)  # fewer accepted in one burst before a pause
        if self.curve_secret_key is not None:
            self._setup_curve(sock)
        elif self.address.startswith("tcp://"):
            log.warning(
                "serving %s over tcp without CURVE: anyone who can reach the port can submit turns",
                self.address,
            )
        path = ipc_path(self.address)
        old = os.umask(0o177)  # the socket file is born 0600
        try:
            sock.bind(self.address)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            if exc.errno == errno.EADDRINUSE:
                raise DaemonAlreadyRunning(f"{self.address} is already in use (another daemon?)") from None
            raise
        finally:
            os.umask(old)
        if path is not None:
            self._owns_socket_file = True
            os.chmod(path, 0o600)
        if self.address.startswith("tcp://") and self.address.endswith(":0"):
            self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._sock = sock
        return sock

    # DAEMON-FD: libzmq accepts every connection it is offered and aborts when an ipc accept finds no
    # descriptor: while the clients hold their share, the endpoint stops listening.
    def pause(self) -> None:
        """Stop listening (connected clients stay; new ones are refused and ZeroMQ retries)."""
        if self._sock is None or self.paused:
            return
        try:
            self._sock.unbind(self.address)
        except zmq.ZMQError as exc:
            log.warning("could not stop listening on %s: %s", self.address, exc)
            return
        self.paused = True
        log.warning("client connections reached their share of file descriptors: not listening for now")

    def resume(self) -> None:
        """Listen again after ``pause`` (the socket file is made again, 0600)."""
        if self._sock is None or not self.paused:
            return
        old = os.umask(0o177)
        try:
            self._sock.bind(self.address)
        except zmq.ZMQError as exc:
            log.error("could not listen again on %s: %s", self.address, exc)
            return
        finally:
            os.umask(old)
        self.paused = False
        path = ipc_path(self.address)
        if path is not None:
            os.chmod(path, 0o600)
        log.info("listening again on %s", self.address)

    def _setup_curve(self, sock: zmq.asyncio.Socket) -> None:
        import zmq.auth
        from zmq.auth.asyncio import AsyncioAuthenticator

        public, secret = zmq.auth.load_certificate(os.fspath(self.curve_secret_key))  # type: ignore[arg-type]
        if not secret:
            raise ValueError(f"{self.curve_secret_key} holds no secret key (use the .key_secret file)")
        clients = os.fspath(self.curve_clients)  # type: ignore[arg-type]
        if not os.path.isdir(clients):
            raise ValueError(f"--curve-clients {clients} is not a directory of client certificates")
        self._auth = AsyncioAuthenticator(self._ctx)
        self._auth.start()
        self._auth.configure_curve(domain="*", location=clients)
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True

    def close(self) -> None:
        """Close the socket and its context (and the authenticator)."""
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def release(self) -> None:
        """Remove the socket file we bound and release the lock."""
        path = ipc_path(self.address)
        if path is not None and self._owns_socket_file:
            with contextlib.suppress(OSError):
                path.unlink()
        if self._lock_fd >= 0:
            if path is not None:
                with contextlib.suppress(OSError):
                    Path(f"{path}.lock").unlink()  # DAEMON-LOCK: unlinked while still locked
            os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)
            self._lock_fd = -1
