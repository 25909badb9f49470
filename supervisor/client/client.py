"""``Client`` (async) and ``SyncClient`` (blocking): the serve daemon's API, with ``Supervisor``'s methods.

One DEALER per client; every request carries an id, so any number of calls (and event
streams) share the connection. Input is validated and encoded here, strictly, before anything
is sent (the same checks as ``Supervisor``); the daemon's errors come back as the same typed
exceptions.

A client call never hangs on a daemon that is not there: ``connect`` fails fast when the
``ipc://`` socket file is missing or the connection is refused, and otherwise after
``timeout`` seconds without a ``Welcome``; once connected, a lost connection (seen by a
ZeroMQ socket monitor, with heartbeats on the link) fails every pending call at once, and
short requests are bounded by ``request_timeout``. Waiting for a result or following events is
not bounded: a turn may run for as long as it likes.

``Client`` runs on anyio's asyncio backend (it uses ``zmq.asyncio``); ``SyncClient`` runs it on
its own asyncio loop in a portal thread, so it works from any synchronous code.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator
from typing import Any, cast

import anyio
import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

import wire
from wire import Cause, TurnResult, validate_cause

from .._engine import check_agent, check_optional_str, check_seconds
from .._errors import (
    SUBMIT_ERROR_CODES,
    AuthenticationFailed,
    DaemonUnavailable,
    FollowerDropped,
    ProtocolError,
    SupervisorClosed,
    TurnIdConflict,
    TurnpoolError,
    UnknownTurn,
    shown_id,
)
from .._events import EventsDropped
from .._handle import TurnHandle
from .._host import Background, require_asyncio
from .._paths import check_endpoint, default_endpoint
from .._sync import SyncFront
from ..daemon.endpoint import ipc_path, socket_options

log = logging.getLogger("turnpool.client")

# B6: plain ints: pyzmq's flags and options are enums, and each ``&`` on one builds an enum member.
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)

_MONITORED = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_MONITOR_STOPPED
)


class _Lost:
    """Put in place of a reply when the connection to the daemon is gone."""

    def __init__(self, why: str) -> None:
        self.why = why


class _Reply(asyncio.Future[Any]):
    """The one reply to a request (most requests): the future itself, so a request in flight keeps
    one object alive, not a holder, a future and a timer (with thousands in flight, every such
    object is walked by each garbage collection)."""

    __slots__ = ("req", "deadline")

    def __init__(self, loop: asyncio.AbstractEventLoop, req: int) -> None:
        super().__init__(loop=loop)
        self.req = req
        self.deadline = 0.0  # when a bounded wait expires (loop time); 0: unbounded or answered

    def put(self, msg: Any) -> None:
        self.deadline = 0.0
        if not self.done():
            self.set_result(msg)

    def expire(self) -> None:
        if not self.done():
            self.set_exception(TimeoutError())


class _Replies:
    """The replies to one request, in arrival order (one for most requests, two for ``run``, a
    stream for a follow). A bare asyncio future per wait, not an ``anyio.Event`` plus a
    ``fail_after`` scope, and no per-request timer (``Client._deadlines``): with thousands of
    requests in flight, every object a request keeps alive is walked by each garbage collection."""

    __slots__ = ("items", "fut", "deadline")

    def __init__(self) -> None:
        self.items: list[Any] | deque[Any] | None = None
        self.fut: asyncio.Future[None] | None = None
        self.deadline = 0.0  # when a bounded wait expires (loop time); 0: unbounded

    def put(self, msg: Any) -> None:
        items = self.items
        if items is None:
            self.items = [msg]
        elif isinstance(items, list) and len(items) < 8:
            items.append(msg)
        else:
            if isinstance(items, list):
                items = self.items = deque(items)
            items.append(msg)
        fut = self.fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    def expire(self) -> None:
        fut = self.fut
        if fut is not None and not fut.done():
            fut.set_exception(TimeoutError())

    async def get(self) -> Any:
        """The next reply (``TimeoutError`` once its deadline, if any, passed without one)."""
        if not self.items:
            fut = self.fut = asyncio.get_running_loop().create_future()
            try:
                await fut
            finally:
                self.fut = None
        items = self.items
        assert items
        return items.popleft() if isinstance(items, deque) else items.pop(0)


class Client:
    """A connection to a ``turnpool serve`` daemon, with the methods of ``Supervisor``::

        async with Client.connect("ipc:///run/user/1000/turnpool/supervisor.sock") as client:
            result = await client.run("examples.agents:echo", {"text": "hi"})

    ``endpoint`` defaults to ``TURNPOOL_ENDPOINT`` or the per-user default. ``timeout`` bounds
    the handshake, ``request_timeout`` each short request (submit, cancel, status …). For a
    CURVE daemon pass ``curve_server_key`` (the daemon's public key, or its certificate file) and
    ``curve_secret_key`` (this client's ``.key_secret`` certificate file). ``follow_window`` bounds
    how many events the daemon sends ahead of what ``events()`` has consumed (flow control).
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout: float = 5.0,
        request_timeout: float = 60.0,
        curve_server_key: str | bytes | None = None,
        curve_secret_key: str | os.PathLike[str] | None = None,
        follow_window: int = 1024,
    ) -> None:
        self.endpoint = check_endpoint(endpoint or default_endpoint())  # R-EP: fail fast, never hang
        self.timeout = check_seconds("timeout", timeout, allow_none=False, positive=True)
        self.request_timeout = check_seconds(
            "request_timeout", request_timeout, allow_none=False, positive=True
        )
        if isinstance(follow_window, bool) or not isinstance(follow_window, int) or follow_window < 2:
            raise ValueError(f"follow_window must be an int >= 2, got {follow_window!r}")
        self.follow_window = follow_window
        if (curve_server_key is None) != (curve_secret_key is None):
            raise ValueError("CURVE needs both curve_server_key and curve_secret_key")
        self.curve_server_key = curve_server_key
        self.curve_secret_key = curve_secret_key
        self.daemon_pid: int | None = None
        self.max_message_size = wire.MAX_MESSAGE_SIZE
        self.bad_frames = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._mon: zmq.asyncio.Socket | None = None
        self._tg: Background | None = None
        self._reqs = itertools.count(1)
        self._pending: dict[int, _Reply | _Replies] = {}
        self._sync: zmq.Socket[bytes] | None = None  # a blocking shadow of _sock, for NOBLOCK I/O
        self._loop: asyncio.AbstractEventLoop | None = None
        # B1: requests made in one pass of the event loop leave as one batch frame (protocol 3).
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._recheck_scheduled = False
        # Bounded waits in the order they began; every bound is request_timeout, so deadlines come
        # in order too: one timer for the oldest replaces a timer per request.
        self._deadlines: deque[_Reply | _Replies] = deque()
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._state = "new"  # new → open → closed
        self._lost: str | None = None
        self._auth_failed = False
        self.protocol = wire.CLIENT_PROTOCOL_VERSION  # what the daemon and this client both speak

    @classmethod
    # D7: never hang on a missing daemon (connect and request timeouts).
    def connect(
        cls,
        endpoint: str | None = None,
        *,
        timeout: float = 5.0,
        request_timeout: float = 60.0,
        curve_server_key: str | bytes | None = None,
        curve_secret_key: str | os.PathLike[str] | None = None,
        follow_window: int = 1024,
    ) -> Client:
        """A client for ``endpoint``: use ``async with Client.connect(ep) as client`` (or ``await`` it).

        The connection is made on entering; it raises ``DaemonUnavailable`` (naming the endpoint)
        within ``timeout`` when no daemon answers, ``ProtocolError`` on a version mismatch.
        """
        return cls(
            endpoint,
            timeout=timeout,
            request_timeout=request_timeout,
            curve_server_key=curve_server_key,
            curve_secret_key=curve_secret_key,
            follow_window=follow_window,
        )

    def __await__(self) -> Generator[Any, None, Client]:
        async def opened() -> Client:
            await self.open()
            return self

        return opened().__await__()

    async def __aenter__(self) -> Client:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    # ---- connection --------------------------------------------------------------------

    async def open(self) -> None:
        """Connect and shake hands. Raises ``DaemonUnavailable`` (endpoint named) or ``ProtocolError``."""
        if self._state != "new":
            raise RuntimeError("a Client connects once")
        loop = require_asyncio("Client", "SyncClient")  # H1: trio is refused here, at once
        self._state = "open"
        path = ipc_path(self.endpoint)
        if path is not None and not path.exists():
            self._state = "closed"
            raise DaemonUnavailable(
                f"no turnpool daemon is running at {self.endpoint} (no socket file {path})"
            )
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.DEALER)
        socket_options(sock)
        sock.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10000)
        try:
            if self.curve_secret_key is not None:
                self._setup_curve(sock)
            self._mon = sock.get_monitor_socket(_MONITORED)
            sock.connect(self.endpoint)
        except (zmq.ZMQError, ValueError, OSError) as exc:
            sock.close(linger=0)
            self._ctx.term()
            self._state = "closed"
            raise DaemonUnavailable(f"cannot connect to {self.endpoint}: {exc}") from exc
        self._sock = sock
        self._sync = zmq.Socket.shadow(sock.underlying)
        self._loop = loop
        # H1: the reader and the monitor live in a task of their own, so the client may be
        # closed from another task than the one that opened it (Jupyter cells, app lifespans).
        self._tg = Background(f"turnpool client {self.endpoint}")
        await self._tg.start(loop)
        self._tg.start_soon(self._reader)
        self._tg.start_soon(self._monitor)
        try:
            welcome = None
            with anyio.move_on_after(self.timeout):
                try:
                    # A refused connection (stale socket file, closed port) fails this at once:
                    # the monitor sees every reconnect attempt being refused.
                    welcome = await self._hello()
                except DaemonUnavailable:
                    pass
            if self._auth_failed and self.curve_secret_key is None:
                # R25: a refused key is an authentication error.
                raise AuthenticationFailed(
                    f"the turnpool daemon at {self.endpoint} refused this client: it requires CURVE "
                    "(pass curve_server_key and curve_secret_key)"
                )
            if self._auth_failed:
                raise AuthenticationFailed(
                    f"the turnpool daemon at {self.endpoint} refused this client: the CURVE handshake failed "
                    "(is this client's public key in the daemon's --curve-clients directory, and is "
                    "curve_server_key the daemon's public key?)"
                )
            if welcome is None:
                why = self._lost or f"no answer within {self.timeout}s"
                raise DaemonUnavailable(f"no turnpool daemon is running at {self.endpoint} ({why})")
        except BaseException:
            await self.aclose()
            raise
        assert isinstance(welcome, wire.Welcome)
        self.daemon_pid = welcome.pid
        self.max_message_size = welcome.max_message_size
        self.protocol = welcome.version

    async def _hello(self) -> Any:
        """Shake hands: this client speaks ``CLIENT_PROTOCOL_VERSION``; a daemon that does not
        (an older one) answers ``protocol`` and ``ProtocolError`` is raised. The daemon accepts
        older clients and says in ``Welcome`` which version it speaks to this one."""
        return await self._call(
            lambda req: wire.Hello(req, wire.CLIENT_PROTOCOL_VERSION), bounded=False, handshake=True
        )

    def _setup_curve(self, sock: zmq.asyncio.Socket) -> None:
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
        """Close the connection. Turns this client submitted go on running in the daemon."""
        if self._state == "closed":
            return
        self._state = "closed"
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

    async def _monitor(self) -> None:
        assert self._mon is not None
        while True:
            try:
                event = parse_monitor_message(await self._mon.recv_multipart())
            except (zmq.ZMQError, RuntimeError):
                return
            kind = event["event"]
            if kind == zmq.EVENT_CONNECTED:
                self._lost = None
            elif kind == zmq.EVENT_DISCONNECTED:
                self._lost = "the connection to the daemon was lost"
                self._fail_pending(self._lost)
            elif kind == zmq.EVENT_CONNECT_RETRIED:
                self._lost = "connection refused"
                self._fail_pending(self._lost)
            elif kind in (
                zmq.EVENT_HANDSHAKE_FAILED_AUTH,
                zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
            ):
                # The daemon is there but refused this client (or its key): an authentication
                # failure, not a missing daemon.
                self._auth_failed = True
                self._lost = "the security handshake failed (CURVE keys?)"
                self._fail_pending(self._lost)
            elif kind == zmq.EVENT_MONITOR_STOPPED:
                return

    def _fail_pending(self, why: str) -> None:
        lost = _Lost(why)
        for req, pending in list(self._pending.items()):
            if type(pending) is _Reply:
                del self._pending[req]
            pending.put(lost)

    async def _reader(self) -> None:
        """Replies are read in a reader callback on the socket's FD (as the engine reads its
        workers), not by a task awaiting zmq.asyncio's ``recv``: no future and no task switch per
        frame. This task only owns the registration."""
        assert self._sync is not None and self._loop is not None
        fd = cast(int, self._sync.getsockopt(zmq.FD))
        self._loop.add_reader(fd, self._on_readable)
        self._on_readable()  # frames that arrived before the reader was registered
        try:
            await anyio.sleep_forever()
        finally:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(fd)

    def _on_readable(self) -> None:
        # ZeroMQ's FD is edge-triggered: drain until EVENTS says nothing is left.
        self._recheck_scheduled = False
        sync = self._sync
        if sync is None or sync.closed:
            return
        getsockopt: Callable[[int], int] = sync.getsockopt  # type: ignore[assignment]
        while getsockopt(_EVENTS) & _POLLIN:
            try:
                parts = sync.recv_multipart(_NOBLOCK)
            except zmq.Again:
                break
            except zmq.ZMQError:
                return
            try:
                if len(parts) != 1:
                    raise msgspec.DecodeError(f"expected one frame, got {len(parts)}")
                messages = wire.decode_from_daemon_frame(parts[0])
            except msgspec.DecodeError as exc:
                self.bad_frames += 1
                log.warning("undecodable reply from the daemon at %s: %s", self.endpoint, exc)
                continue
            pending_get = self._pending.get
            for msg in messages:
                pending = pending_get(msg.req)
                if pending is not None:
                    if type(pending) is _Reply:
                        del self._pending[msg.req]
                    pending.put(msg)
                elif isinstance(msg, wire.Error):
                    log.warning("the daemon at %s reported: %s: %s", self.endpoint, msg.code, msg.message)

    async def _send(self, msg: Any) -> None:
        self._post(msg)

    def _post(self, msg: Any) -> None:
        """Send ``msg``: at once during the handshake (and to a daemon below protocol 3), else into
        the outgoing batch, flushed at the end of this pass of the event loop (B1). Raises
        ``ValueError`` for a request above the daemon's size limit, before anything is sent."""
        frame = wire.encode(msg)
        if len(frame) > self.max_message_size:
            raise ValueError(
                f"request of {len(frame)} bytes is above the daemon's limit of {self.max_message_size} bytes"
            )
        if self.protocol < 3 or self.daemon_pid is None:
            self._write(frame)
            return
        if self._out_bytes + len(frame) > min(wire.BATCH_BYTES, self.max_message_size - 16):
            self._flush()
        self._out.append(frame)
        self._out_bytes += len(frame)
        if not self._flush_scheduled and self._loop is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out:
            return
        out, self._out, self._out_bytes = self._out, [], 0
        self._write(wire.encode_batch(out))

    def _write(self, frame: bytes) -> None:
        sync = self._sync
        if sync is None or sync.closed:
            return
        try:
            # The DEALER has no send limit (SNDHWM 0) and queues while connecting: this never waits.
            sync.send(frame, _NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("send to the daemon at %s failed: %s", self.endpoint, exc)
            self._lost = self._lost or f"a send failed: {exc}"
            self._fail_pending(self._lost)
            return
        # A send can consume the edge of ZeroMQ's edge-triggered FD: read soon if something waits.
        if (
            cast(int, sync.getsockopt(_EVENTS)) & _POLLIN
            and not self._recheck_scheduled
            and self._loop is not None
        ):
            self._recheck_scheduled = True
            self._loop.call_soon(self._on_readable)

    def _check_open(self) -> None:
        if self._state != "open":
            raise SupervisorClosed(
                "the client is closed"
                if self._state == "closed"
                else "the client is not connected: use `async with Client.connect(...)`"
            )
        if self._lost is not None:
            raise DaemonUnavailable(f"the daemon at {self.endpoint} is not reachable: {self._lost}")

    async def _call(
        self,
        make: Callable[[int], Any],
        *,
        bounded: bool = True,
        turn_id: str | None = None,
        handshake: bool = False,
    ) -> Any:
        """Send one request and wait for its one reply (at most ``request_timeout`` when
        ``bounded``); raise the reply's error, typed. An unbounded wait that is cancelled (or
        fails) before its reply tells the daemon to drop the request (``Abandon``).
        (``submit`` and ``result`` inline this: one coroutine less per request in flight.)"""
        if not handshake:
            self._check_open()
        fut = self._request(make, bounded)
        try:
            reply = await fut
        except TimeoutError:
            raise self._no_answer() from None
        except BaseException:
            self._dropped(fut, abandon=not bounded and not handshake)
            raise
        return self._reply(reply, turn_id)

    def _request(self, make: Callable[[int], Any], bounded: bool) -> _Reply:
        """Post one request; its reply will be the result of the returned future."""
        assert self._loop is not None
        req = next(self._reqs)
        fut = _Reply(self._loop, req)
        self._post(make(req))
        self._pending[req] = fut
        if bounded:
            self._bound(fut, self.request_timeout)
        return fut

    def _dropped(self, fut: _Reply, *, abandon: bool) -> None:
        """The wait for ``fut`` ended without its reply (cancelled, or failed): forget the request,
        and with ``abandon`` tell the daemon to free it."""
        fut.deadline = 0.0
        if self._pending.get(fut.req) is fut:
            del self._pending[fut.req]
        if abandon and (fut.cancelled() or not fut.done()):
            self._abandon(fut.req)

    def _no_answer(self) -> DaemonUnavailable:
        return DaemonUnavailable(
            f"the daemon at {self.endpoint} did not answer within {self.request_timeout}s"
        )

    def _bound(self, pending: _Reply | _Replies, limit: float | None) -> None:
        """Fail ``pending``'s wait with ``TimeoutError`` if no reply came within ``limit`` seconds."""
        assert self._loop is not None and limit is not None
        deadlines = self._deadlines
        while deadlines and deadlines[0].deadline == 0.0:
            deadlines.popleft()  # answered: forget it (answers come mostly in order)
        pending.deadline = self._loop.time() + limit
        deadlines.append(pending)
        if self._deadline_timer is None:
            self._deadline_timer = self._loop.call_at(pending.deadline, self._expire)

    def _expire(self) -> None:
        """The oldest bounded waits whose deadline passed and that are still waiting fail."""
        self._deadline_timer = None
        assert self._loop is not None
        now = self._loop.time()
        deadlines = self._deadlines
        while deadlines:
            head = deadlines[0]
            if head.deadline == 0.0:
                deadlines.popleft()  # answered (or no longer bounded): nothing to expire
            elif head.deadline <= now:
                deadlines.popleft()
                head.expire()
                if isinstance(head, _Reply) and self._pending.get(head.req) is head:
                    del self._pending[head.req]
            else:
                self._deadline_timer = self._loop.call_at(head.deadline, self._expire)
                return

    def _abandon(self, req: int) -> None:
        """Tell the daemon we no longer wait for ``req`` (it frees the request; the turn goes on)."""
        if self.protocol < 2 or self._state != "open" or self._lost is not None:
            return
        with contextlib.suppress(Exception):
            self._post(wire.Abandon(req))

    def _reply(self, reply: Any, turn_id: str | None) -> Any:
        if isinstance(reply, _Lost):
            raise DaemonUnavailable(f"the daemon at {self.endpoint} is not reachable: {reply.why}")
        if isinstance(reply, wire.Error):
            raise _error(reply, turn_id, self.endpoint)
        return reply

    # ---- the Supervisor methods --------------------------------------------------------

    async def submit(
        self,
        agent: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 — the turn's timeout (Supervisor.submit's signature)
        grace: float | None = None,
        kill_after: float | None = None,
        turn_id: str | None = None,
        retry: bool = False,
    ) -> TurnHandle:
        """Submit a turn to the daemon; returns its handle at once.

        Raises at the call, before sending: ``InvalidAgent``, ``TypeError`` (input not encodable,
        bad types), ``ValueError`` (bad times, request above the size limit). From the daemon:
        ``QueueFull``, ``DaemonShuttingDown``. A known ``turn_id`` returns the existing turn.
        """
        make = _submit_request(
            agent,
            input,
            session=session,
            timeout=timeout,
            grace=grace,
            kill_after=kill_after,
            turn_id=turn_id,
            retry=retry,
        )
        self._check_open()
        fut = self._request(make, True)  # (``_call`` inlined: one coroutine less per submit in flight)
        try:
            reply = await fut
        except TimeoutError:
            raise self._no_answer() from None
        except BaseException:
            self._dropped(fut, abandon=False)
            raise
        return TurnHandle(self, self._reply(reply, None).turn_id)

    async def run(
        self,
        agent: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 — the turn's timeout (Supervisor.run's signature)
        grace: float | None = None,
        kill_after: float | None = None,
        turn_id: str | None = None,
        retry: bool = False,
    ) -> TurnResult:
        """``submit`` then ``result``, in one request: the daemon answers ``Accepted`` and later the
        ``Result`` under the same request id. Raises as ``submit`` does.

        The caller owns the turn (R-RUN-CANCEL): cancelling the task that awaits ``run`` cancels
        the turn (cause ``user``) and returns, raising the cancellation, once the daemon reports it
        ended. A wait on a handle's ``result()`` or ``events()`` only observes."""
        make = _submit_request(
            agent,
            input,
            session=session,
            timeout=timeout,
            grace=grace,
            kill_after=kill_after,
            turn_id=turn_id,
            retry=retry,
            wait=True,
        )
        self._check_open()
        req = next(self._reqs)
        pending = self._pending[req] = _Replies()
        answered = False
        accepted_id: str | None = None
        try:
            self._post(make(req))
            try:
                try:
                    self._bound(pending, self.request_timeout)
                    accepted = self._reply(await pending.get(), turn_id)
                    pending.deadline = 0.0
                except TimeoutError:
                    why = f"the daemon at {self.endpoint} did not answer within {self.request_timeout}s"
                    raise DaemonUnavailable(why) from None
                accepted_id = accepted.turn_id
                reply = self._reply(await pending.get(), accepted_id)
                answered = True
            except anyio.get_cancelled_exc_class():
                await self._stop_own_turn(pending, accepted_id, turn_id)
                raise
        finally:
            pending.deadline = 0.0
            self._pending.pop(req, None)
            if not answered:
                self._abandon(req)
        if not isinstance(reply, wire.Result):
            raise ProtocolError(f"unexpected reply to run: {type(reply).__name__}")
        return reply.result

    async def _stop_own_turn(self, pending: _Replies, accepted_id: str | None, asked_id: str | None) -> None:
        """R-RUN-CANCEL: the caller of ``run`` was cancelled: cancel its turn (cause ``user``) and
        wait for the turn's result, shielded from every cancellation (anyio's, and a native
        ``Task.cancel()``, such as ``asyncio.wait_for``'s). Bounded: a lost daemon ends the wait
        (its ``_Lost`` reply), and a daemon that never acknowledged the submit within
        ``request_timeout`` leaves nothing here to cancel."""

        pending.deadline = 0.0  # this wait is bounded below, not by the cancelled call's deadline

        async def stop() -> None:
            tid = accepted_id
            try:
                if tid is None:
                    with anyio.move_on_after(self.request_timeout):
                        first = await pending.get()
                        tid = first.turn_id if isinstance(first, wire.Accepted) else None
                if tid is None or self._lost is not None:
                    return
                turn = tid
                await self._call(lambda req: wire.Cancel(req, turn, wire.USER), turn_id=turn)
                await pending.get()  # the Result (or the loss of the daemon)
            except (TurnpoolError, TimeoutError):
                return  # the daemon is gone or refused: nothing more to wait for

        # A task of its own, which no cancel of the caller's task reaches; waited for until done.
        task = asyncio.get_running_loop().create_task(stop())
        with anyio.CancelScope(shield=True):
            while not task.done():
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    continue  # a native cancel of the caller: the turn is not quiescent yet
        task.result()

    def handle(self, turn_id: str) -> TurnHandle:
        """A handle on a turn the daemon knows (submitted by any client). An unknown id raises
        ``UnknownTurn`` at the handle's first use (``result``, ``events``, ``cancel``)."""
        _check_turn_id(turn_id)
        return TurnHandle(self, turn_id)

    async def exists(self, turn_id: str) -> bool:
        """Whether the daemon knows ``turn_id`` (queued, running, or ended and still kept)."""
        _check_turn_id(turn_id)
        try:
            await self._call(lambda req: wire.Lookup(req, turn_id), turn_id=turn_id)
        except UnknownTurn:
            return False
        return True

    async def cancel(self, turn_id: str, cause: Any = None) -> Cause | None:
        """Cancel a turn (default cause ``{"kind": "user"}``); returns the winning cause.

        The cause is validated here, strictly, before anything is sent (``TypeError``/``ValueError``).
        Raises ``UnknownTurn``.
        """
        accepted = validate_cause(cause)
        _check_turn_id(turn_id)
        reply = await self._call(lambda req: wire.Cancel(req, turn_id, accepted), turn_id=turn_id)
        return reply.cause

    async def cancel_session(self, session: str, cause: Any = None) -> list[str]:
        """Cancel the running turn of ``session`` and clear its turns queued now; returns their ids."""
        accepted = validate_cause(cause)
        if not isinstance(session, str) or not session:
            raise TypeError(f"session must be a non-empty string, got {shown_id(session)}")
        reply = await self._call(lambda req: wire.CancelSession(req, session, accepted))
        return list(reply.turn_ids)

    async def status(self) -> dict[str, Any]:
        """The daemon's status: workers (id, pid, state, turn_id, turns_run, rss_mb), queue, counters."""
        reply = await self._call(lambda req: wire.GetStatus(req))
        return dict(reply.status)

    async def reload(self) -> dict[str, int]:
        """Recycle the daemon's workers gracefully (``turnpool reload``): turns running now finish on
        their old workers, every turn that starts after this call runs on a fresh worker, which
        imports agent code anew. Returns ``{"workers": recycled, "busy": still finishing a turn}``.
        Raises ``ProtocolError`` when the daemon is too old to reload (client protocol < 3)."""
        if self.protocol < 3:
            raise ProtocolError(
                f"the daemon at {self.endpoint} speaks client protocol {self.protocol}: it cannot reload "
                "(restart it instead)"
            )
        reply = await self._call(lambda req: wire.Reload(req))
        return {"workers": reply.workers, "busy": reply.busy}

    async def when_idle(self) -> None:
        """Return once the daemon has no turn queued or running."""
        await self._call(lambda req: wire.WhenIdle(req), bounded=False)

    # ---- the rest of the Backend contract (what TurnHandle uses) ------------------------

    async def result(self, turn_id: str) -> TurnResult:
        """Wait for the turn's one outcome (``TurnHandle.result``); raises ``UnknownTurn``."""
        _check_turn_id(turn_id)
        self._check_open()
        fut = self._request(functools.partial(_get_result, turn_id), False)  # (``_call`` inlined)
        try:
            reply = await fut
        except BaseException:
            self._dropped(fut, abandon=True)
            raise
        return self._reply(reply, turn_id).result

    async def events(self, turn_id: str) -> AsyncIterator[Any]:
        """The turn's events as the daemon relays them (``TurnHandle.events``).

        Where events were dropped before this follower read them (it fell further behind than the
        daemon's ``max_events``, or started after the oldest were dropped) it yields one
        ``EventsDropped`` with their count, then goes on (protocol 3; an older daemon ends the
        stream with ``FollowerDropped`` instead)."""
        _check_turn_id(turn_id)
        self._check_open()
        req = next(self._reqs)
        pending = self._pending[req] = _Replies()
        ended = False
        window = self.follow_window
        consumed = 0
        expected = 0  # the sequence number of the next event, were none dropped
        decode = wire.decode_payload
        try:
            self._post(wire.Follow(req, turn_id, window))
            while True:
                item = await pending.get()
                if isinstance(item, wire.Events):
                    if item.seq > expected:
                        yield EventsDropped(item.seq - expected, expected)  # G1
                    expected = item.seq + len(item.data)
                    for raw in item.data:
                        yield decode(raw)
                    consumed += len(item.data)
                    if consumed >= window // 2:
                        # Flow control: the daemon sends at most `window` events ahead of us.
                        self._post(wire.Credit(req, consumed))
                        consumed = 0
                elif isinstance(item, wire.FollowEnd):
                    ended = True
                    return
                else:
                    ended = True
                    if isinstance(item, wire.Error) and item.code == "lagged":
                        raise FollowerDropped(f"{item.message} (daemon at {self.endpoint})")
                    self._reply(item, turn_id)
                    raise ProtocolError(f"unexpected reply to a follow: {type(item).__name__}")
        finally:
            self._pending.pop(req, None)
            if not ended and self._state == "open" and self._lost is None:
                with contextlib.suppress(Exception):
                    self._post(wire.Unfollow(req))


def _submit_request(
    agent: str,
    input: Any,
    *,
    session: Any,
    timeout: Any,
    grace: Any,
    kill_after: Any,
    turn_id: Any,
    wait: bool = False,
    retry: Any = False,
) -> Callable[[int], wire.Submit]:
    """Validate and encode a submit here, strictly, before anything is sent (as ``Supervisor`` does)."""
    check_agent(agent)
    raw = wire.encode_payload(input, what="turn input", exact=True)  # W-IN
    session = check_optional_str("session", session)
    turn_id = check_optional_str("turn_id", turn_id)
    timeout = check_seconds("timeout", timeout, positive=True)
    grace = check_seconds("grace", grace)
    kill_after = check_seconds("kill_after", kill_after)
    if not isinstance(retry, bool):
        raise TypeError(f"retry must be True or False, got {retry!r}")
    # A partial over one tuple, not a closure: a closure keeps a cell per argument alive for as long
    # as the request is in flight, and thousands in flight are walked by every garbage collection.
    return functools.partial(
        _submit_message, (agent, raw, session, timeout, grace, kill_after, turn_id, wait, retry)
    )


def _submit_message(args: tuple[Any, ...], req: int) -> wire.Submit:
    return wire.Submit(req, *args)


def _get_result(turn_id: str, req: int) -> wire.GetResult:
    return wire.GetResult(req, turn_id)


def _check_turn_id(turn_id: Any) -> None:
    if not isinstance(turn_id, str) or not turn_id:
        raise TypeError(f"turn_id must be a non-empty string, got {shown_id(turn_id)}")


def _error(err: wire.Error, turn_id: str | None, endpoint: str) -> Exception:
    """The typed exception for a daemon's ``Error`` reply."""
    code, message = err.code, err.message
    if code == "unknown_turn" and turn_id is not None:
        return UnknownTurn(turn_id)
    if code == "unknown_turn":
        return TurnpoolError(message)
    if code == "turn_id_conflict":  # R-ID: the fields that differ are read back from the message
        return TurnIdConflict.from_message(turn_id or "", message)
    for kind, known in SUBMIT_ERROR_CODES:  # the daemon's own table, read the other way
        if known == code:
            return kind(message)
    if code in ("protocol", "malformed"):
        return ProtocolError(f"{message} (daemon at {endpoint})")
    if code == "lagged":
        return FollowerDropped(f"{message} (daemon at {endpoint})")
    if code in ("dropped", "too_large"):
        return TurnpoolError(f"{message} (daemon at {endpoint})")
    return TurnpoolError(f"the daemon at {endpoint} failed: {message}")


class SyncClient(SyncFront):
    """``Client`` with blocking methods::

        with SyncClient.connect(ep) as client:
            print(client.run("examples.agents:echo", {"text": "hi"}).output)

    or without ``with``: the first call connects, ``close()`` disconnects (one never closed is
    closed at interpreter exit and never keeps it alive).
    """

    def __init__(self, endpoint: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        Client(endpoint, **kwargs)  # validate the arguments now, at the call
        self._endpoint = endpoint
        self._kwargs = kwargs

    @classmethod
    def connect(cls, endpoint: str | None = None, **kwargs: Any) -> SyncClient:
        """A blocking client for ``endpoint`` (``with SyncClient.connect(ep) as client``, or
        without ``with``: it connects on first use)."""
        return cls(endpoint, **kwargs)

    def _make(self) -> Any:
        return Client.connect(self._endpoint, **self._kwargs)

    def __enter__(self) -> SyncClient:
        self._open()
        return self

    def exists(self, turn_id: str) -> bool:
        return self._call("exists", turn_id)

    def reload(self) -> dict[str, int]:
        """``Client.reload``, blocking: recycle the daemon's workers so new turns import agent code anew."""
        result: dict[str, int] = self._call("reload")
        return result
