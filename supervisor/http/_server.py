"""The HTTP front end's server: uvicorn on the daemon's own event loop, inside its task group.

``attach_http(daemon, "HOST:PORT", token_file=…)`` validates everything before the daemon starts
(address, loopback or token, token file) and registers ``HttpFrontEnd.run`` as one of the
daemon's ``front_ends``. The daemon starts it once clients can connect and cancels it after its
supervisor has closed, so results and ``end`` events of disposed turns still reach HTTP clients.

* uvicorn runs with its signal handlers off: the daemon alone owns SIGTERM/SIGINT (first signal
  drains, second skips the drain) and HTTP follows it (submits get 503 while draining).
* The listening socket is bound here, before the ready line is printed, so a port in use fails
  the start with a one-line message (exit 1) instead of a half-started daemon.
* Slow readers are dropped: when a connection's write buffer stays above the high-water mark
  (the client stopped reading) for ``stall`` seconds, its transport is aborted. What one
  connection can hold is bounded: the kernel send buffer (capped at ``SNDBUF``), the transport's
  64 KiB high-water mark, and for an event stream ``sse_buffer`` encoded events (``_sse``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from wire import TurnResult

from ._api import build_app
from ._bounds import AcceptGate, BoundsMixin, CappedSocket, HttpLimits
from ._listen import check_access, is_loopback, parse_listen, read_token
from ._peer import SameUserOnly

if TYPE_CHECKING:
    from .._engine import TurnRecord
    from ..daemon.server import Daemon

log = logging.getLogger("turnpool.http")

DEFAULT_STALL = 30.0
SNDBUF = 256 * 1024  # bytes the kernel may hold for one HTTP connection (it reports twice this)
HISTORY_SECONDS = 600
OUTCOMES = ("completed", "failed", "aborted", "killed", "crashed")


class OutcomeHistory:
    """Turns ended per wall-clock second, by outcome, for the last ``size`` seconds (a ring)."""

    def __init__(self, size: int = HISTORY_SECONDS) -> None:
        self.size = size
        self.counts = {name: [0] * size for name in OUTCOMES}
        self.last = int(time.time())

    def _advance(self, sec: int) -> None:
        if sec <= self.last:
            return
        steps = min(sec - self.last, self.size)
        for ring in self.counts.values():
            for s in range(sec - steps + 1, sec + 1):
                ring[s % self.size] = 0
        self.last = sec

    def add(self, outcome: str, at: float) -> None:
        sec = int(at)
        self._advance(sec)
        ring = self.counts.get(outcome)
        if ring is not None and sec > self.last - self.size:
            ring[sec % self.size] += 1

    def series(self, seconds: int, now: float) -> dict[str, list[int]]:
        sec = int(now)
        self._advance(sec)
        seconds = max(1, min(seconds, self.size))
        first = sec - seconds + 1
        return {
            name: [ring[s % self.size] for s in range(first, sec + 1)] for name, ring in self.counts.items()
        }


class InputCache:
    """Inputs of turns submitted over HTTP, for the dashboard's turn page after the daemon has
    freed them (a turn's input is dropped when it ends). Bounded in count and per entry."""

    def __init__(self, count: int = 1000, each: int = 16 * 1024) -> None:
        self.count = count
        self.each = each
        self.data: collections.OrderedDict[str, Any] = collections.OrderedDict()

    def put(self, turn_id: str, value: Any, size: int) -> None:
        self.data[turn_id] = value if size <= self.each else {"not_kept": f"input of {size} bytes"}
        self.data.move_to_end(turn_id)
        while len(self.data) > self.count:
            self.data.popitem(last=False)

    def get(self, turn_id: str) -> tuple[bool, Any]:
        if turn_id in self.data:
            return True, self.data[turn_id]
        return False, None


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers (the daemon owns SIGTERM/SIGINT), telling us when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = anyio.Event()

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()

    def install_signal_handlers(self) -> None:  # older uvicorn releases
        return None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.up.set()


class _StallMixin:
    """Aborts a connection whose writes have been paused (buffer above high water) for ``stall`` s."""

    stall: float = DEFAULT_STALL
    front: HttpFrontEnd
    transport: asyncio.Transport
    _stall_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The kernel's share of the per-connection bound: without a cap, send buffers autotune up to
        # megabytes, and a client that stops reading would hold that much before writes pause.
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
        super().connection_made(transport)  # type: ignore[misc]

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._stall_timer is None:
            self._stall_timer = asyncio.get_running_loop().call_later(self.stall, self._drop)

    def resume_writing(self) -> None:
        self._unstall()
        super().resume_writing()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._unstall()
        super().connection_lost(exc)  # type: ignore[misc]

    def _unstall(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _drop(self) -> None:
        self._stall_timer = None
        self.front.stats["dropped_slow"] += 1
        peer = self.transport.get_extra_info("peername")
        log.warning("dropping HTTP client %s: it left a response unread for %ss", peer, self.stall)
        self.transport.abort()


class HttpFrontEnd:
    """The HTTP/SSE API and dashboard of one daemon (see the module docstring)."""

    def __init__(
        self,
        daemon: Daemon,
        host: str,
        port: int,
        *,
        token: str | None = None,
        stall: float = DEFAULT_STALL,
        sse_buffer: int = 256,
        limits: HttpLimits | None = None,
    ) -> None:
        if stall <= 0 or stall != stall:
            raise ValueError(f"--http-stall must be > 0 seconds, got {stall}")
        self.daemon = daemon
        self.host = host
        self.port = port
        self.token = token
        self.loopback = is_loopback(host)
        if not self.loopback and token is None:
            raise ValueError(
                f"--http {host}:{port} is not a loopback address: it needs --http-token FILE "
                "(every request then carries Authorization: Bearer <token>)"
            )
        check_access(host, port, self.loopback, daemon.sup_kwargs.get("allow_agents"))
        self.same_user_only = self.loopback  # SEC-PEER: loopback serves the daemon's uid only (_peer)
        self.stall = stall
        self.sse_buffer = sse_buffer
        self.limits = limits or HttpLimits()  # HTTP-BOUND: what a connection may cost before auth
        self.bounded: collections.Counter[str] = collections.Counter()  # refusals by why
        self.gate = AcceptGate(self.limits.connections, self.bounded)  # open connections vs the cap
        self.stats: collections.Counter[str] = collections.Counter()
        self.history = OutcomeHistory()
        self.inputs = InputCache()
        self.url = ""
        self.bound_port: int | None = None
        self.server: _Server | None = None
        self.app, self.guard = build_app(self)
        daemon.end_hooks.append(self._on_end)
        daemon.front_ends.append(self.run)

    @property
    def sup(self) -> Any:
        assert self.daemon.sup is not None
        return self.daemon.sup

    def _on_end(self, turn: TurnRecord, result: TurnResult) -> None:
        self.history.add(result.outcome, result.ended_at or time.time())

    def status(self) -> dict[str, Any]:
        server = self.server
        return {
            "url": self.url,
            "auth": self.token is not None,
            "connections": len(server.server_state.connections) if server is not None else 0,
            "requests": server.server_state.total_requests if server is not None else 0,
            "sse_streams": self.stats["sse_streams"],
            "sse_total": self.stats["sse_total"],
            "dropped_slow": self.stats["dropped_slow"],
            "refused": self.guard.refused,
            "limits": dataclasses.asdict(self.limits),
            "bounded": dict(self.bounded),  # HTTP-BOUND: connections refused or closed, by why
        }

    def _bind(self) -> socket.socket:
        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, kind, proto, _, addr = infos[0]
            sock = CappedSocket(family, kind, proto)  # HTTP-BOUND: no connection accepted past the cap
            sock.gate = self.gate
        except OSError as exc:
            raise OSError(
                f"cannot listen for HTTP on {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(1024)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise OSError(
                f"cannot listen for HTTP on {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        return sock

    async def run(self, *, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started`` gets the ready line's addition."""
        # DAEMON-FD: at most the HTTP share of the daemon's descriptors (``supervisor/_fds.py``).
        share = self.daemon.fd_budget.share
        if share < self.limits.connections:
            self.limits = dataclasses.replace(self.limits, connections=share)
        self.daemon.fd_refused["http"] = lambda: self.bounded["connections"]
        self.daemon.fd_shortages["accept_http"] = lambda: self.bounded["accept_shortage"]
        self.gate.cap = self.limits.connections
        sock = self._bind()
        self.bound_port = sock.getsockname()[1]
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{shown}:{self.bound_port}/"
        protocol = type(
            "TurnpoolHTTPProtocol",
            (BoundsMixin, SameUserOnly, _StallMixin, AutoHTTPProtocol),  # HTTP-BOUND first: every byte
            {
                "stall": self.stall,
                "front": self,
                "limits": self.limits,
                "counts": self.bounded,
                "gate": self.gate,
            },
        )
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_config=None,
            access_log=False,
            http=protocol,
            ws="none",
            proxy_headers=False,
            server_header=False,
            timeout_keep_alive=self.limits.keep_alive,  # type: ignore[arg-type]  # call_later takes a float
            timeout_graceful_shutdown=2,
            h11_max_incomplete_event_size=64 * 1024,
            limit_concurrency=self.limits.connections + 1,  # HTTP-BOUND: the cap is BoundsMixin's
        )
        server = _Server(config)
        self.server = server
        done = anyio.Event()
        serving = anyio.CancelScope(shield=True)

        async def serve() -> None:
            with serving:
                try:
                    await server.serve(sockets=[sock])
                finally:
                    done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            with anyio.fail_after(10):
                await server.up.wait()
            log.info("HTTP API and dashboard on %s (pid %d)", self.url, os.getpid())
            task_status.started(f"http {self.url}")
            try:
                await anyio.sleep_forever()
            finally:
                server.should_exit = True
                with anyio.move_on_after((server.config.timeout_graceful_shutdown or 0) + 1, shield=True):
                    await done.wait()
                if not done.is_set():
                    for conn in list(server.server_state.connections):
                        transport = getattr(conn, "transport", None)
                        if transport is not None:
                            transport.abort()
                    serving.cancel()


def attach_http(
    daemon: Daemon,
    listen: str,
    *,
    token_file: str | os.PathLike[str] | None = None,
    stall: float | None = None,
    limits: HttpLimits | None = None,
) -> HttpFrontEnd:
    """Serve the HTTP API and dashboard of ``daemon`` on ``listen`` (``PORT`` or ``HOST:PORT``).

    Raises ``ValueError`` (bad address, non-loopback without a token, bad token file) and
    ``OSError`` (token file unreadable) before anything is bound."""
    host, port = parse_listen(listen)
    token = read_token(token_file) if token_file is not None else None
    return HttpFrontEnd(
        daemon,
        host,
        port,
        token=token,
        stall=DEFAULT_STALL if stall is None else float(stall),
        limits=limits,
    )
