"""``turnpool serve --ray``: the client endpoint of the serve daemon, with turns run cluster-wide.

The daemon proper (``supervisor.daemon``) is written against the engine's record API (journal,
hooks, turn records); this front end is written against the ``Backend`` contract only, so it runs
on a ``RaySupervisor``. It speaks the same client protocol (``wire``'s client messages), so
``Client``, ``turnpool submit/cancel/status`` and ``batch --connect`` work unchanged. What it does
not have: a journal (a restart forgets turns; each node's engine keeps no state either), the
HTTP front end, CURVE over tcp. ``status`` shows each node's pool (RAY-SERVE).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import msgspec
import zmq

import wire
from wire import client_link

from .._errors import InvalidAgent, QueueFull, SupervisorClosed, UnknownTurn
from ..daemon.endpoint import ClientEndpoint
from ..daemon.run import GC_THRESHOLDS
from .router import RaySupervisor

log = logging.getLogger("turnpool.ray.serve")

READY_PREFIX = "turnpool serve: ready on "

# A refused request's error code, by the first class that matches (as the daemon's table).
_ERROR_CODES: tuple[tuple[type[BaseException], client_link.ErrorCode], ...] = (
    (UnknownTurn, "unknown_turn"),
    (InvalidAgent, "invalid_agent"),
    (QueueFull, "queue_full"),
    (SupervisorClosed, "shutting_down"),
    (TypeError, "bad_type"),
    (ValueError, "bad_value"),
)


def _code(exc: BaseException) -> client_link.ErrorCode | None:
    return next((code for kind, code in _ERROR_CODES if isinstance(exc, kind)), None)


class RayDaemon:
    """Serves the client protocol at ``endpoint`` with a ``RaySupervisor`` behind it."""

    def __init__(self, endpoint: str, sup: RaySupervisor) -> None:
        self.endpoint = endpoint
        self.sup = sup
        self._ep = ClientEndpoint(endpoint)
        self._sock: Any = None
        self._tasks: dict[tuple[bytes, int], anyio.CancelScope] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def serve(self, ready: Callable[[str], None] = print) -> None:
        """Run until SIGTERM or SIGINT, then dispose every node's turns and return."""
        self._ep.claim()
        self._sock = self._ep.bind()
        try:
            async with self.sup, anyio.create_task_group() as tg:
                self._tg = tg
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    tg.start_soon(self._receive)
                    ready(f"{READY_PREFIX}{self.endpoint} (pid {os.getpid()}, Ray cluster)")
                    async for _ in signals:
                        break
                tg.cancel_scope.cancel()
        finally:
            self._ep.close()
            self._ep.release()

    async def _receive(self) -> None:
        while True:
            ident, frame = await self._sock.recv_multipart()
            try:
                # a Hello alone, then batches (CLIENT-BATCHES)
                msgs = client_link.decode_to_daemon_frame(frame)
            except msgspec.DecodeError as exc:
                self._send(ident, client_link.Error(0, "malformed", str(exc)[:200]))
                continue
            for msg in msgs:
                try:
                    await self._dispatch(ident, msg)
                except Exception as exc:  # noqa: BLE001 - a request's failure is its reply, never the daemon's end
                    code = _code(exc)
                    req = getattr(msg, "req", 0)
                    self._send(
                        ident,
                        client_link.Error(req, code or "internal", f"{type(exc).__name__}: {exc}"[:500]),
                    )

    def _send(self, ident: bytes, msg: Any) -> None:
        try:
            self._sock.send_multipart([ident, wire.encode(msg)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the client is gone or not reading: its requests are dropped
            log.debug("reply to a client failed: %s", exc)

    def _later(self, ident: bytes, req: int, work: Callable[[], Awaitable[Any]]) -> None:
        """Run ``work`` for request ``req`` in its own task; ``Abandon``/``Unfollow`` cancel it."""
        scope = anyio.CancelScope()
        self._tasks[(ident, req)] = scope

        async def run() -> None:
            try:
                with scope:
                    await work()
            except Exception as exc:  # noqa: BLE001 - the request's error goes back to its client
                self._send(
                    ident,
                    client_link.Error(req, _code(exc) or "internal", f"{type(exc).__name__}: {exc}"),
                )
            finally:
                self._tasks.pop((ident, req), None)

        assert self._tg is not None
        self._tg.start_soon(run)

    async def _dispatch(self, ident: bytes, msg: Any) -> None:
        sup = self.sup
        match msg:
            case client_link.Hello(req=req, version=version):
                if (
                    not client_link.MIN_CLIENT_PROTOCOL_VERSION
                    <= version
                    <= client_link.CLIENT_PROTOCOL_VERSION
                ):
                    self._send(
                        ident,
                        client_link.Error(req, "protocol", f"unsupported client protocol {version}"),
                    )
                    return
                # RAY-SERVE: this endpoint reads the client's batches and answers one message per
                # frame (a client reads both); a Reload is refused (``protocol``): no workers to recycle.
                self._send(ident, client_link.Welcome(req, version, wire.MAX_MESSAGE_SIZE, os.getpid()))
            case client_link.Submit(req=req):
                existing = msg.turn_id is not None and sup.sent(msg.turn_id)
                handle = await sup.submit(
                    msg.agent,
                    wire.decode_payload(msg.input),
                    session=msg.session,
                    timeout=msg.timeout,
                    grace=msg.grace,
                    kill_after=msg.kill_after,
                    turn_id=msg.turn_id,
                    retry=msg.retry,
                )
                self._send(ident, client_link.Accepted(req, handle.turn_id, existing))
                if msg.wait:

                    async def wait() -> None:
                        self._send(ident, client_link.Result(req, await handle.result()))

                    self._later(ident, req, wait)
            case client_link.Cancel(req=req, turn_id=turn_id, cause=cause):
                self._send(ident, client_link.Cancelled(req, await sup.cancel(turn_id, cause)))
            case client_link.CancelSession(req=req, session=session, cause=cause):
                self._send(ident, client_link.SessionCancelled(req, await sup.cancel_session(session, cause)))
            case client_link.GetResult(req=req, turn_id=turn_id):

                async def result() -> None:
                    self._send(ident, client_link.Result(req, await sup.result(turn_id)))

                self._later(ident, req, result)
            case client_link.Follow(req=req, turn_id=turn_id):
                sup.handle(turn_id)  # UnknownTurn at once

                async def follow() -> None:
                    seq = 0
                    async for event in sup.events(turn_id):
                        self._send(
                            ident,
                            client_link.Events(req, seq, [wire.encode_payload(event, what="event")]),
                        )
                        seq += 1
                    self._send(ident, client_link.FollowEnd(req))

                self._later(ident, req, follow)
            case client_link.Unfollow(req=req) | client_link.Abandon(req=req):
                scope = self._tasks.pop((ident, req), None)
                if scope is not None:
                    scope.cancel()
                if isinstance(msg, client_link.Unfollow):
                    self._send(ident, client_link.FollowEnd(req))
            case client_link.Credit():
                pass  # events are sent as they come: a window is never exceeded by more than a batch
            case client_link.Lookup(req=req, turn_id=turn_id):
                sup.handle(turn_id)
                self._send(ident, client_link.Ok(req))
            case client_link.GetStatus(req=req):
                status = await sup.status()
                status["daemon"] = {"pid": os.getpid(), "endpoint": self.endpoint, "ray": True}
                self._send(ident, client_link.Status(req, msgspec.to_builtins(status)))
            case client_link.WhenIdle(req=req):

                async def idle() -> None:
                    await sup.when_idle()
                    self._send(ident, client_link.Ok(req))

                self._later(ident, req, idle)
            case client_link.Reload(req=req):
                why = "a Ray cluster's daemon cannot reload: restart it to run edited agent code"
                self._send(ident, client_link.Error(req, "protocol", why))
            case _:
                self._send(
                    ident, client_link.Error(getattr(msg, "req", 0), "malformed", "unexpected message")
                )


def run_ray_daemon(endpoint: str, address: str, **options: Any) -> int:
    """``turnpool serve --ray``: blocking; the exit code."""
    from .._errors import DaemonAlreadyRunning, WorkerStartError

    daemon = RayDaemon(endpoint, RaySupervisor(address, **options))
    # DAEMON-GC here too, and more so: the driver holds Ray's own tens of thousands of objects, and each
    # full collection walked them all (≈ 90 ms a pass at load 10, several per 15k turns). They are
    # frozen out of collection once Ray and the node supervisors are up (the ready line).
    gc.set_threshold(*GC_THRESHOLDS)

    def ready(line: str) -> None:
        gc.freeze()
        print(line, flush=True)

    try:
        anyio.run(lambda: daemon.serve(ready=ready), backend="asyncio")
    except BaseException as exc:
        inner: BaseException = exc
        while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
            inner = inner.exceptions[0]
        if isinstance(inner, (DaemonAlreadyRunning, WorkerStartError, ValueError, OSError, zmq.ZMQError)):
            print(f"turnpool serve: {inner}", flush=True)
            return 1
        raise
    return 0
