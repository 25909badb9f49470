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

``Client`` runs on anyio's asyncio backend (it uses ``zmq.asyncio``); ``SyncClient`` (``sync.py``)
runs it on its own asyncio loop in a portal thread. The connection (its socket, the handshake, CURVE,
the socket monitor, opening and closing) is a ``connection.Connection`` the client holds; where
replies wait, how a submit is encoded and how a daemon's errors are typed, in ``replies.py``.
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
from typing import Any

import anyio
import msgspec
import zmq
import zmq.asyncio

import wire
from wire import Cause, TurnResult, client_link, validate_cause
from worker.zmqlink import EVENTS as _EVENTS
from worker.zmqlink import NOBLOCK as _NOBLOCK
from worker.zmqlink import POLLIN as _POLLIN
from worker.zmqlink import LoopFlush, ReadableEdge

from .._checks import check_known_id, check_seconds
from .._errors import (
    DaemonUnavailable,
    FollowerDropped,
    ProtocolError,
    SupervisorClosed,
    TurnpoolError,
    UnknownTurn,
    shown_id,
)
from .._events import EventsDropped
from .._handle import TurnHandle
from .._paths import check_endpoint, default_endpoint
from .._stream import OwnedStreams
from .connection import Connection
from .many import PipelinedMany
from .replies import _check_turn_id, _error, _get_result, _Lost, _Many, _Replies, _Reply, _submit_request

log = logging.getLogger("turnpool.client")


class Client(PipelinedMany, OwnedStreams):
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
        self.endpoint = check_endpoint(endpoint or default_endpoint())  # CLI-ENDPOINT: fail fast, never hang
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
        self._reqs = itertools.count(1)
        self._pending: dict[int, _Reply | _Replies | _Many] = {}
        self._sync: zmq.Socket[bytes] | None = None  # a blocking shadow of _sock, for NOBLOCK I/O
        self._loop: asyncio.AbstractEventLoop | None = None
        # CLIENT-BATCHES: requests made in one pass of the event loop leave as one batch frame (protocol 3).
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._pass = LoopFlush(self._flush)  # CLIENT-BATCHES: its loop is set at connect
        self._edge: ReadableEdge | None = None  # LINK-EDGE: the socket's reader, while connected
        # Bounded waits in the order they began; every bound is request_timeout, so deadlines come
        # in order too: one timer for the oldest replaces a timer per request.
        self._deadlines: deque[_Reply | _Replies | _Many] = deque()
        self._deadline_timer: asyncio.TimerHandle | None = None
        # the link to the daemon: its socket, monitor, tasks, state (new → open → closed), why it was lost
        self._conn = Connection(
            self.endpoint, timeout=self.timeout, curve_server_key=curve_server_key,
            curve_secret_key=curve_secret_key, linked=self._linked, reader=self._reader, hello=self._hello,
            fail_pending=self._fail_pending,
        )  # fmt: skip
        self.protocol = client_link.CLIENT_PROTOCOL_VERSION  # what the daemon and this client both speak

    @classmethod
    # CLIENT-NO-HANG: never hang on a missing daemon (connect and request timeouts).
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
        welcome = await self._conn.open()
        self.daemon_pid = welcome.pid
        self.max_message_size = welcome.max_message_size
        self.protocol = welcome.version

    async def aclose(self) -> None:
        """Close the connection. Turns this client submitted go on running in the daemon."""
        await self._conn.aclose()

    def _linked(self, sync: zmq.Socket[bytes], loop: asyncio.AbstractEventLoop) -> None:
        """The connection is made: ``sync`` (a blocking shadow of its socket, for NOBLOCK I/O) on ``loop``."""
        self._sync = sync
        self._loop = self._pass.loop = loop

    async def _hello(self) -> Any:
        """Shake hands: this client speaks ``CLIENT_PROTOCOL_VERSION``; a daemon that does not
        (an older one) answers ``protocol`` and ``ProtocolError`` is raised. The daemon accepts
        older clients and says in ``Welcome`` which version it speaks to this one."""
        return await self._call(
            lambda req: client_link.Hello(req, client_link.CLIENT_PROTOCOL_VERSION),
            bounded=False,
            handshake=True,
        )

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
        self._edge = ReadableEdge(self._sync, self._on_readable)
        await self._edge.watch()  # LINK-EDGE

    def _on_readable(self) -> None:
        # ZeroMQ's FD is edge-triggered: drain until EVENTS says nothing is left (LINK-EDGE).
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
                messages = client_link.decode_from_daemon_frame(parts[0])
            except msgspec.DecodeError as exc:
                self.bad_frames += 1
                log.warning("undecodable reply from the daemon at %s: %s", self.endpoint, exc)
                continue
            pending_get = self._pending.get
            for msg in messages:
                pending = pending_get(msg.req)
                if pending is not None:
                    if type(pending) is not _Replies:  # one reply per request: it is answered
                        del self._pending[msg.req]
                    pending.put(msg)
                elif isinstance(msg, client_link.Error):
                    log.warning("the daemon at %s reported: %s: %s", self.endpoint, msg.code, msg.message)

    async def _send(self, msg: Any) -> None:
        self._post(msg)

    def _post(self, msg: Any) -> None:
        """Send ``msg``: at once during the handshake (and to a daemon below protocol 3), else into
        the outgoing batch, flushed at the end of this pass of the event loop (CLIENT-BATCHES). Raises
        ``ValueError`` for a request above the daemon's size limit, before anything is sent."""
        self._post_frame(self._encode(msg))

    def _encode(self, msg: Any) -> bytes:
        """``msg`` encoded; ``ValueError`` if it is above the daemon's size limit."""
        frame = wire.encode(msg)
        if len(frame) > self.max_message_size:
            raise ValueError(
                f"request of {len(frame)} bytes is above the daemon's limit of {self.max_message_size} bytes"
            )
        return frame

    def _post_frame(self, frame: bytes) -> None:
        if self.daemon_pid is None:  # the handshake: Hello goes alone
            self._write(frame)
            return
        if self._out_bytes + len(frame) > min(client_link.BATCH_BYTES, self.max_message_size - 16):
            self._flush()
        self._out.append(frame)
        self._out_bytes += len(frame)
        self._pass.soon()

    def _flush(self) -> None:
        if not self._out:
            return
        out, self._out, self._out_bytes = self._out, [], 0
        self._write(client_link.encode_batch(out))

    def _write(self, frame: bytes) -> None:
        sync = self._sync
        if sync is None or sync.closed:
            return
        try:
            # The DEALER has no send limit (SNDHWM 0) and queues while connecting: this never waits.
            sync.send(frame, _NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("send to the daemon at %s failed: %s", self.endpoint, exc)
            conn = self._conn
            conn.lost = conn.lost or f"a send failed: {exc}"
            self._fail_pending(conn.lost)
            return
        if self._edge is not None:
            self._edge.after_send()  # LINK-EDGE: a send can consume the readable edge

    def _check_open(self) -> None:
        if self._conn.state != "open":
            raise SupervisorClosed(
                "the client is closed"
                if self._conn.state == "closed"
                else "the client is not connected: use `async with Client.connect(...)`"
            )
        if self._conn.lost is not None:
            raise DaemonUnavailable(f"the daemon at {self.endpoint} is not reachable: {self._conn.lost}")

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

    def _bound(self, pending: _Reply | _Replies | _Many, limit: float | None) -> None:
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
        if self._conn.state != "open" or self._conn.lost is not None:
            return
        with contextlib.suppress(Exception):
            self._post(client_link.Abandon(req))

    def _reply(self, reply: Any, turn_id: str | None) -> Any:
        if isinstance(reply, _Lost):
            raise DaemonUnavailable(f"the daemon at {self.endpoint} is not reachable: {reply.why}")
        if isinstance(reply, client_link.Error):
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

        The caller owns the turn (API-RUN-OWNS): cancelling the task that awaits ``run`` cancels
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
        if not isinstance(reply, client_link.Result):
            raise ProtocolError(f"unexpected reply to run: {type(reply).__name__}")
        return reply.result

    async def _stop_own_turn(self, pending: _Replies, accepted_id: str | None, asked_id: str | None) -> None:
        """API-RUN-OWNS: the caller of ``run`` was cancelled: cancel its turn (cause ``user``) and
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
                        tid = first.turn_id if isinstance(first, client_link.Accepted) else None
                if tid is None or self._conn.lost is not None:
                    return
                turn = tid
                await self._call(lambda req: client_link.Cancel(req, turn, wire.USER), turn_id=turn)
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
            await self._call(lambda req: client_link.Lookup(req, turn_id), turn_id=turn_id)
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
        reply = await self._call(lambda req: client_link.Cancel(req, turn_id, accepted), turn_id=turn_id)
        assert isinstance(reply, client_link.Cancelled)
        return reply.cause

    async def cancel_session(self, session: str, cause: Any = None) -> list[str]:
        """Cancel the running turn of ``session`` and clear its turns queued now; returns their ids."""
        accepted = validate_cause(cause)
        if not isinstance(session, str) or not session:
            raise TypeError(f"session must be a non-empty string, got {shown_id(session)}")
        check_known_id("session", session)  # LINK-TURN-ID: one that cannot be sent is bad input
        reply = await self._call(lambda req: client_link.CancelSession(req, session, accepted))
        return list(reply.turn_ids)

    async def status(self) -> dict[str, Any]:
        """The daemon's status: workers (id, pid, state, turn_id, turns_run, rss_mb), queue, counters."""
        reply = await self._call(lambda req: client_link.GetStatus(req))
        return dict(reply.status)

    async def reload(self) -> dict[str, int]:
        """Recycle the daemon's workers gracefully (``turnpool reload``): turns running now finish on
        their old workers, every turn that starts after this call runs on a fresh worker, which
        imports agent code anew. Returns ``{"workers": recycled, "busy": still finishing a turn}``."""
        reply = await self._call(lambda req: client_link.Reload(req))
        return {"workers": reply.workers, "busy": reply.busy}

    async def when_idle(self) -> None:
        """Return once the daemon has no turn queued or running."""
        await self._call(lambda req: client_link.WhenIdle(req), bounded=False)

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
        answer = self._reply(reply, turn_id)
        assert isinstance(answer, client_link.Result)
        return answer.result

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
            self._post(client_link.Follow(req, turn_id, window))
            while True:
                item = await pending.get()
                if isinstance(item, client_link.Events):
                    if item.seq > expected:
                        yield EventsDropped(item.seq - expected, expected)  # EVENTS-GAP-WHERE
                    expected = item.seq + len(item.data)
                    for raw in item.data:
                        yield decode(raw)
                    consumed += len(item.data)
                    if consumed >= window // 2:
                        # Flow control: the daemon sends at most `window` events ahead of us.
                        self._post(client_link.Credit(req, consumed))
                        consumed = 0
                elif isinstance(item, client_link.FollowEnd):
                    ended = True
                    return
                else:
                    ended = True
                    if isinstance(item, client_link.Error) and item.code == "lagged":
                        raise FollowerDropped(f"{item.message} (daemon at {self.endpoint})")
                    self._reply(item, turn_id)
                    raise ProtocolError(f"unexpected reply to a follow: {type(item).__name__}")
        finally:
            self._pending.pop(req, None)
            if not ended and self._conn.state == "open" and self._conn.lost is None:
                with contextlib.suppress(Exception):
                    self._post(client_link.Unfollow(req))
