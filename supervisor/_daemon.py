"""The serve daemon: a ROUTER on the client endpoint in front of one embedded ``Supervisor``.

Clients (``Client``, ``SyncClient``, the CLI) connect DEALERs and speak ``wire._client``. The
daemon passes a client's encoded input bytes straight to its supervisor (never re-encoded).

Rules the daemon keeps (see ``docs/design.md`` and ``tests/test_daemon.py``):

* **One daemon per endpoint** (``_endpoint``): for ``ipc://`` a ``flock`` on ``<path>.lock`` held
  for the daemon's life refuses a second daemon with a clear message; a socket file left by a
  dead daemon is replaced. ``tcp://`` relies on the bind, optionally with CURVE.
* **A client never owns a turn.** A client that disconnects cancels nothing; results stay in
  the supervisor's turn table, bounded by ``keep_results`` (default 10 000 ended turns, the
  oldest evicted first), so a reconnecting client can fetch or follow them. A repeated
  ``turn_id`` returns the existing turn and never runs it twice.
* **Bad frames cost one reply.** A frame that does not decode gets ``Error(code="malformed")``
  and is counted; it changes no turn. ``MAXMSGSIZE`` refuses oversized frames at the socket.
* **Shutdown.** The first SIGTERM/SIGINT stops accepting (submits get ``shutting_down``), lets
  accepted turns finish for ``drain`` seconds, then disposes the supervisor (cause
  ``disposed``, escalation, reap) and exits 0; a second signal skips the rest of the drain and
  SIGKILLs every turn being cancelled at once (``Supervisor.kill_now``).
* **Hook sites** for a journal: ``accept_hooks`` (a new turn was accepted; an awaitable it
  returns holds the submit's acknowledgement until it is done, e.g. committed), ``start_hooks``
  (a worker started it), ``end_hooks`` (its one result) — all called on the event loop.
  ``stop()`` is the programmatic SIGTERM (a second call skips the drain).
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import msgspec
import zmq
import zmq.asyncio

import wire
from wire import Cause, TurnResult

from ._core import Supervisor
from ._endpoint import ClientEndpoint
from ._errors import DaemonAlreadyRunning, InvalidAgent, QueueFull, SupervisorClosed, UnknownTurn
from ._metrics import Metrics
from ._paths import default_endpoint
from ._turns import TurnRecord

log = logging.getLogger("turnpool.daemon")

READY_PREFIX = "turnpool serve: ready on "


class Daemon:
    """``turnpool serve``: owns a ``Supervisor`` and answers clients on ``endpoint``.

    ``supervisor`` holds the keyword arguments of ``Supervisor``. ``drain`` is how long accepted
    turns may run on after the first signal. ``metrics_port`` (0: any free port) serves
    Prometheus text on ``metrics_host``. ``curve_secret_key`` (a ``zmq.auth`` certificate file
    with a secret key) turns on CURVE; ``curve_clients`` is then the directory of the public
    certificates of the clients allowed in.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        supervisor: dict[str, Any] | None = None,
        drain: float = 30.0,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        curve_secret_key: str | os.PathLike[str] | None = None,
        curve_clients: str | os.PathLike[str] | None = None,
        insecure_tcp: bool = False,
    ) -> None:
        self._endpoint = ClientEndpoint(endpoint or default_endpoint(), curve_secret_key=curve_secret_key,
                                        curve_clients=curve_clients, insecure_tcp=insecure_tcp)
        if drain < 0:
            raise ValueError(f"drain must be >= 0 seconds, got {drain}")
        self.sup_kwargs = dict(supervisor or {})
        Supervisor(**self.sup_kwargs)  # validate the options now, before binding anything
        self.drain = drain
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host

        # Hook sites (a durable journal hooks in here). Called on the event loop; must not block.
        # An accept hook may return an awaitable: the submit is acknowledged only once it is done
        # (e.g. the journal row is committed).
        self.accept_hooks: list[Callable[[TurnRecord], Awaitable[Any] | None]] = []
        self.start_hooks: list[Callable[[TurnRecord, int], None]] = []
        self.end_hooks: list[Callable[[TurnRecord, TurnResult], None]] = []
        self.event_hooks: list[Callable[[TurnRecord, msgspec.Raw], None]] = []  # each event, as emitted
        # Run once the pool is up, before clients can connect (a journal's restart recovery).
        self.startup_hooks: list[Callable[[Supervisor], Any]] = []

        self.sup: Supervisor | None = None
        self.malformed = 0
        self.accepting = False
        self.metrics: Metrics | None = None
        self.metrics_bound: int | None = None
        self.disposing_at: float | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._sync: zmq.Socket[bytes] | None = None
        self._streams: dict[tuple[bytes, int], _Stream] = {}
        self._inflight = 0
        self._inflight_zero = anyio.Event()
        self._cancel_times: dict[str, float] = {}
        self._cancelling_at: float | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._stop_asked: anyio.Event | None = None
        self._skip_drain: anyio.Event | None = None

    @property
    def endpoint(self) -> str:
        """The client endpoint (a ``tcp://…:0`` one reads as the bound port once serving)."""
        return self._endpoint.address

    # ---- lifecycle ---------------------------------------------------------------------

    async def serve(self, *, ready: Callable[[str], None] | None = None) -> None:
        """Run until SIGTERM/SIGINT (or ``stop()``), then drain, dispose and return.

        ``ready`` is called with the announcement once clients can connect. Raises
        ``DaemonAlreadyRunning`` when another daemon holds the endpoint and ``WorkerStartError``
        when the pool cannot start.
        """
        self._stop_asked = anyio.Event()
        self._skip_drain = anyio.Event()
        self._inflight_zero = anyio.Event()
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            self._endpoint.claim()
            try:
                await self._serve(signals, ready)
            finally:
                self._endpoint.release()

    def stop(self, *, skip_drain: bool = False) -> None:
        """Begin the shutdown, as the first SIGTERM does; a second call (or ``skip_drain``) skips
        the drain, as a second signal does. Call it on the daemon's event loop."""
        if self._stop_asked is None or self._skip_drain is None:
            raise RuntimeError("the daemon is not serving")
        if self._stop_asked.is_set() or skip_drain:
            self._skip_drain.set()
        self._stop_asked.set()

    async def _watch_signals(self, signals: Any) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            if self._stop_asked is not None and self._stop_asked.is_set():
                # SPEC disposal rule: a second signal moves every turn to its kill step at once,
                # whatever grace its client chose (bounded anyway by --max-grace).
                log.info("received %s again: skipping the drain, killing every cancelled turn now", name)
                if self.sup is not None:
                    self.sup.kill_now()
            else:
                log.info("received %s: draining for up to %ss", name, self.drain)
            self.stop()

    async def _serve(self, signals: Any, ready: Callable[[str], None] | None) -> None:
        sup = Supervisor(**self.sup_kwargs)
        self.sup = sup
        sup._start_hooks.append(self._on_start)
        sup._result_hooks.append(self._on_end)
        sup._event_hooks.extend(self.event_hooks)
        self.metrics = Metrics(self)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._watch_signals, signals)
                # The supervisor's own task group nests inside this one: it is started and
                # closed from this task at this level (anyio's scopes must nest).
                await sup.start()
                try:
                    for startup_hook in self.startup_hooks:
                        started = startup_hook(sup)
                        if inspect.isawaitable(started):
                            await started
                    self._sock = self._endpoint.bind()
                    self._sync = zmq.Socket.shadow(self._sock.underlying)
                    tg.start_soon(self._receive)
                    if self.metrics_port is not None:
                        self.metrics_bound = await tg.start(self.metrics.serve, self.metrics_host,
                                                            self.metrics_port)
                    self.accepting = True
                    line = f"{READY_PREFIX}{self.endpoint} (pid {os.getpid()})"
                    if self.metrics_bound is not None:
                        line += f" metrics http://{self.metrics_host}:{self.metrics_bound}/metrics"
                    log.info("%s", line)
                    if ready is not None:
                        ready(line)
                    assert self._stop_asked is not None
                    await self._stop_asked.wait()
                    await self._shutdown()
                finally:
                    with anyio.CancelScope(shield=True):
                        await sup.aclose()
                    tg.cancel_scope.cancel()
        finally:
            self._sock = self._sync = None
            self._endpoint.close()

    async def _shutdown(self) -> None:
        assert self.sup is not None and self._skip_drain is not None
        self.accepting = False
        sup, skip = self.sup, self._skip_drain
        with anyio.move_on_after(self.drain):
            async with anyio.create_task_group() as drain:
                async def skipped() -> None:
                    await skip.wait()
                    drain.cancel_scope.cancel()

                drain.start_soon(skipped)
                await sup.when_idle()
                drain.cancel_scope.cancel()
        self.disposing_at = anyio.current_time()
        log.info("disposing: %d turns still queued or running", sup._active)
        await sup.aclose()
        # Let the requests woken by disposal (results, follows, when_idle) answer before the socket goes.
        with anyio.move_on_after(5):
            while self._inflight:
                await self._inflight_zero.wait()

    # ---- the client link ---------------------------------------------------------------

    async def _receive(self) -> None:
        assert self._sock is not None and self._sync is not None
        sock, sync = self._sock, self._sync
        while True:
            batch = [await sock.recv_multipart()]
            while True:
                try:
                    batch.append(sync.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
            for parts in batch:
                self._on_frame(parts)

    def _on_frame(self, parts: list[bytes]) -> None:
        ident = parts[0]
        if len(parts) != 2:
            self._malformed(ident, f"a request is one frame, got {len(parts) - 1}")
            return
        try:
            msg = wire.decode_to_daemon(parts[1])
        except msgspec.DecodeError as exc:
            self._malformed(ident, f"undecodable request: {exc}")
            return
        try:
            self._dispatch(ident, msg)
        except Exception as exc:  # a bug here must cost one request, never the daemon
            log.exception("request %r failed", msg)
            self._send(ident, wire.Error(msg.req, "internal", f"{type(exc).__name__}: {exc}"))

    def _malformed(self, ident: bytes, why: str) -> None:
        self.malformed += 1
        # Warn about the first few only: a flood of garbage must not flood the log too.
        level = logging.WARNING if self.malformed <= 10 else logging.DEBUG
        log.log(level, "malformed frame from a client: %s", why)
        self._send(ident, wire.Error(0, "malformed", why))

    def _send(self, ident: bytes, msg: Any) -> bool:
        """Send one reply; ``False`` when the client is gone (ROUTER_MANDATORY tells us)."""
        assert self._sync is not None and self._sock is not None
        try:
            self._sync.send_multipart([ident, wire.encode(msg)], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            log.debug("reply to a client failed (client gone?): %s", exc)
            return False
        finally:
            # A send can consume the edge of ZeroMQ's edge-triggered FD: re-arm the receiver.
            self._sock.get(zmq.EVENTS)

    def _dispatch(self, ident: bytes, msg: Any) -> None:
        sup = self.sup
        assert sup is not None
        match msg:
            case wire.Hello(req=req, version=version):
                if version != wire.CLIENT_PROTOCOL_VERSION:
                    why = (f"the daemon speaks client protocol {wire.CLIENT_PROTOCOL_VERSION}, "
                           f"the client {version}")
                    self._send(ident, wire.Error(req, "protocol", why))
                else:
                    self._send(ident, wire.Welcome(req, wire.CLIENT_PROTOCOL_VERSION, wire.MAX_MESSAGE_SIZE,
                                                   os.getpid()))
            case wire.Submit():
                self._submit(ident, msg)
            case wire.Cancel(req=req, turn_id=turn_id, cause=cause):
                try:
                    turn = sup._get(turn_id)
                except UnknownTurn as exc:
                    self._send(ident, wire.Error(req, "unknown_turn", str(exc)))
                    return
                winner = self._cancel(lambda: sup._cancel(turn, cause), [turn_id])
                self._send(ident, wire.Cancelled(req, winner))
            case wire.CancelSession(req=req, session=session, cause=cause):
                if not session:
                    self._send(ident, wire.Error(req, "bad_value", "session must be a non-empty string"))
                    return
                ids: list[str] = []

                def cancel_session() -> None:
                    ids.extend(sup._cancel_session(session, cause))

                self._cancel(cancel_session, ids)
                self._send(ident, wire.SessionCancelled(req, ids))
            case wire.GetResult(req=req, turn_id=turn_id):
                self._task(self._result, ident, req, turn_id)
            case wire.Follow(req=req, turn_id=turn_id, window=window):
                try:
                    sup._get(turn_id)
                except UnknownTurn as exc:
                    self._send(ident, wire.Error(req, "unknown_turn", str(exc)))
                    return
                stream = _Stream(window)
                self._streams[(ident, req)] = stream
                self._task(self._follow, ident, req, turn_id, stream)
            case wire.Credit(req=req, n=n):
                credited = self._streams.get((ident, req))
                if credited is not None and n > 0:
                    credited.grant(n)
            case wire.Unfollow(req=req):
                unfollowed = self._streams.pop((ident, req), None)
                if unfollowed is not None:
                    unfollowed.scope.cancel()
            case wire.Lookup(req=req, turn_id=turn_id):
                if turn_id in sup._turns:
                    self._send(ident, wire.Ok(req))
                else:
                    self._send(ident, wire.Error(req, "unknown_turn", str(UnknownTurn(turn_id))))
            case wire.GetStatus(req=req):
                self._send(ident, wire.Status(req, self.status()))
            case wire.WhenIdle(req=req):
                self._task(self._when_idle, ident, req)

    def _submit(self, ident: bytes, msg: wire.Submit) -> None:
        sup = self.sup
        assert sup is not None
        req = msg.req
        existing = msg.turn_id is not None and msg.turn_id in sup._turns
        if existing and msg.turn_id is not None:
            # Idempotent by turn_id: the known turn is returned, never run twice (even while draining).
            self._send(ident, wire.Accepted(req, msg.turn_id, True))
            if msg.wait:
                self._task(self._result, ident, req, msg.turn_id)
            return
        if not self.accepting:
            why = f"the daemon at {self.endpoint} is shutting down: it accepts no new turn"
            self._send(ident, wire.Error(req, "shutting_down", why))
            return
        try:
            turn = sup._accept(msg.agent, msg.input, session=msg.session, timeout=msg.timeout,
                               grace=msg.grace, kill_after=msg.kill_after, turn_id=msg.turn_id, parent=None,
                               retry=msg.retry)
        except InvalidAgent as exc:
            self._send(ident, wire.Error(req, "invalid_agent", str(exc)))
            return
        except QueueFull as exc:
            self._send(ident, wire.Error(req, "queue_full", str(exc)))
            return
        except SupervisorClosed as exc:
            self._send(ident, wire.Error(req, "shutting_down", str(exc)))
            return
        except TypeError as exc:
            self._send(ident, wire.Error(req, "bad_type", str(exc)))
            return
        except ValueError as exc:
            self._send(ident, wire.Error(req, "bad_value", str(exc)))
            return
        if self.metrics is not None:
            self.metrics.accepted += 1
        gates = [gate for gate in (hook(turn) for hook in self.accept_hooks) if inspect.isawaitable(gate)]
        if gates:
            self._task(self._ack_after, ident, req, turn.id, gates, msg.wait)
        else:
            self._send(ident, wire.Accepted(req, turn.id, False))
            if msg.wait:
                self._task(self._result, ident, req, turn.id)

    async def _ack_after(self, ident: bytes, req: int, turn_id: str, gates: list[Awaitable[Any]],
                         wait: bool) -> None:
        """Acknowledge a submit only once every accept hook's awaitable is done (a journal's commit)."""
        for gate in gates:
            try:
                await gate
            except Exception as exc:
                log.exception("accept hook failed for turn %s", turn_id)
                why = f"turn {turn_id} accepted but not recorded: {exc}"
                self._send(ident, wire.Error(req, "internal", why))
                return
        self._send(ident, wire.Accepted(req, turn_id, False))
        if wait:
            await self._result(ident, req, turn_id)

    def _cancel(self, do: Callable[[], Any], ids: list[str]) -> Any:
        """Run a cancel and note when it was asked, for the cancel-to-end latency."""
        assert self.sup is not None
        now = anyio.current_time()
        self._cancelling_at = now  # turns that end inside the call (queued ones) see it
        try:
            out = do()
        finally:
            self._cancelling_at = None
        for turn_id in ids:
            turn = self.sup._turns.get(turn_id)
            if turn is not None and turn.state != "ended":
                self._cancel_times.setdefault(turn_id, now)
        return out

    def _task(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._tg is not None
        self._inflight += 1
        if self._inflight == 1:
            self._inflight_zero = anyio.Event()
        self._tg.start_soon(self._run_task, fn, args)

    async def _run_task(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            await fn(*args)
        except Exception:
            log.exception("request task %s failed", getattr(fn, "__name__", fn))
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._inflight_zero.set()

    async def _result(self, ident: bytes, req: int, turn_id: str) -> None:
        assert self.sup is not None
        try:
            result = await self.sup._result(turn_id)
        except UnknownTurn as exc:
            self._send(ident, wire.Error(req, "unknown_turn", str(exc)))
            return
        self._send(ident, wire.Result(req, result))

    async def _follow(self, ident: bytes, req: int, turn_id: str, stream: _Stream) -> None:
        assert self.sup is not None
        scope = stream.scope
        try:
            with scope:
                events = self.sup.follow_raw(turn_id)
                try:
                    async for seq, raw in events:
                        await stream.spend()  # flow control: wait for the client's credit
                        if not self._send(ident, wire.Events(req, seq, [raw])):
                            return  # the client is gone: stop streaming, the turn goes on
                finally:
                    await events.aclose()  # type: ignore[attr-defined]
            if not scope.cancel_called:
                self._send(ident, wire.FollowEnd(req))
        except UnknownTurn as exc:
            self._send(ident, wire.Error(req, "unknown_turn", str(exc)))
        finally:
            self._streams.pop((ident, req), None)

    async def _when_idle(self, ident: bytes, req: int) -> None:
        assert self.sup is not None
        await self.sup.when_idle()
        self._send(ident, wire.Ok(req))

    # ---- hooks and status --------------------------------------------------------------

    def _on_start(self, turn: TurnRecord, pid: int) -> None:
        for hook in self.start_hooks:
            hook(turn, pid)

    def _on_end(self, turn: TurnRecord, result: TurnResult) -> None:
        asked = self._cancel_times.pop(turn.id, None)
        if self.metrics is not None:
            self.metrics.turn_ended(turn, result, self._cancel_asked_at(turn, result.cause, asked))
        for hook in self.end_hooks:
            hook(turn, result)

    def _cancel_asked_at(self, turn: TurnRecord, cause: Cause | None, asked: float | None) -> float | None:
        """When the cancellation that ended ``turn`` was asked (``None``: not known)."""
        if cause is None:
            return None
        if cause.kind == "disposed":
            return self.disposing_at
        if cause.kind == "deadline" and turn.started_at is not None and turn.timeout is not None:
            return turn.started_at + turn.timeout
        if asked is not None:
            return asked
        return self._cancelling_at

    def status(self) -> dict[str, Any]:
        """The supervisor's status plus the daemon's own facts."""
        assert self.sup is not None
        st = self.sup.status()
        st["daemon"] = {
            "pid": os.getpid(),
            "endpoint": self.endpoint,
            "accepting": self.accepting,
            "malformed_frames": self.malformed,
            "streams": len(self._streams),
            "turns_kept": len(self.sup._turns),
            "keep_results": self.sup.keep_results,
            "metrics_port": self.metrics_bound,
        }
        return st


class _Stream:
    """One follow: its cancel scope and, with a window, the events the client still allows."""

    __slots__ = ("scope", "credit", "_more")

    def __init__(self, window: int) -> None:
        self.scope = anyio.CancelScope()
        self.credit = window if window > 0 else None
        self._more: anyio.Event | None = None

    async def spend(self) -> None:
        if self.credit is None:
            return
        while self.credit <= 0:
            self._more = anyio.Event()
            await self._more.wait()
        self.credit -= 1

    def grant(self, n: int) -> None:
        if self.credit is not None:
            self.credit += n
            if self._more is not None:
                self._more.set()


def run_daemon(daemon: Daemon) -> int:
    """Run ``daemon`` to completion (blocking); the exit code of ``turnpool serve``."""
    from ._errors import WorkerStartError

    def ready(line: str) -> None:
        print(line, flush=True)

    try:
        anyio.run(lambda: daemon.serve(ready=ready), backend="asyncio")
    except BaseException as exc:
        inner: BaseException = exc
        while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
            inner = inner.exceptions[0]
        if isinstance(inner, (DaemonAlreadyRunning, WorkerStartError, ValueError, OSError, zmq.ZMQError)):
            print(f"turnpool serve: {inner}", file=sys.stderr, flush=True)
            return 1
        raise
    return 0


__all__ = ["Daemon", "READY_PREFIX", "run_daemon"]
