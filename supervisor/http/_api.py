"""The routes of the HTTP API (``/v1/…``) and the dashboard's static files (``/``).

Every handler calls public methods only: ``Daemon.submit`` / ``Daemon.status`` and the
supervisor's ``handle``, ``cancel``, ``cancel_session``, ``follow_raw``, ``turn_info`` and
``turns``. Bad input is a 4xx with ``{"error": {"code", "message"}}``, never a 500 (HTTP-BAD-INPUT).
"""

from __future__ import annotations

import sqlite3
import time
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, unquote_to_bytes

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import wire

from .._errors import (
    AgentNotAllowed,
    InvalidAgent,
    QueueFull,
    SupervisorClosed,
    TurnIdConflict,
    TurnpoolError,
    UnknownTurn,
)
from .._tracing import CALLER_TRACE, valid_traceparent
from ..journal import reader as journal_read
from ..journal.schema import JournalError
from ..journal.steps import view_steps
from . import _schema
from ._guard import Guard
from ._reply import ApiError, query_float
from ._reply import respond as _respond
from ._sse import EventStream

if TYPE_CHECKING:
    from ._server import HttpFrontEnd

MAX_BODY = wire.MAX_MESSAGE_SIZE  # a submit's JSON body; the encoded input must also fit MAX_PAYLOAD_SIZE
MAX_WAIT = 60.0  # seconds a GET /v1/turns/{id}?wait= may hold the request
MAX_LIST = 1000
_json = msgspec.json.Encoder()
_submit_decoder = msgspec.json.Decoder(_schema.SubmitRequest)


def _result_json(result: Any) -> bytes:
    try:
        return _json.encode(result)
    except (TypeError, ValueError) as exc:  # an output JSON cannot carry: say so, keep the rest
        return _json.encode(msgspec.structs.replace(result, output={"unencodable": str(exc)}))


def _front(request: Request) -> HttpFrontEnd:
    front: HttpFrontEnd = request.app.state.front  # set by the front end when it builds the app
    return front


# ---- ids in paths ----------------------------------------------------------------------


def id_segment(value: str) -> str:
    """LINK-TURN-ID: ``value`` (a turn id or session) as one path segment: every character but letters,
    digits and ``_.-~`` percent-encoded (``/`` included), and an id of dots only (``.``, ``..``)
    written ``%2E…`` so that no client or proxy takes it for a relative path step."""
    if value.strip(".") == "":
        return "%2E" * len(value)
    return quote(value, safe="")


def _param(request: Request, name: str) -> str:
    """A turn id or session from the path, as the client wrote it (see ``IdPaths``)."""
    return unquote(request.path_params[name])


class IdPaths:
    """LINK-TURN-ID: route on the path as sent, so that an id holding ``/`` (sent as ``%2F``) is one
    segment. The server decodes ``%2F`` into ``/`` in ``path``; this rebuilds ``path`` from
    ``raw_path`` with each segment decoded then percent-encoded again (``id_segment``), and the
    handlers decode the id once (``_param``). A path that is not UTF-8 names nothing: 404."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path")
            try:
                segments = (
                    [unquote_to_bytes(part).decode() for part in raw.split(b"/")]
                    if isinstance(raw, bytes)
                    else scope["path"].split("/")
                )
            except UnicodeDecodeError:
                reply = _respond({"error": {"code": "not_found", "message": "the path is not UTF-8"}}, 404)
                await reply(scope, receive, send)
                return
            scope = dict(scope, path="/".join(quote(part, safe="") for part in segments))
        await self.app(scope, receive, send)


# ---- submit --------------------------------------------------------------------------


async def _body(request: Request) -> bytes:
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/json" and not kind.endswith("+json"):
        raise ApiError(
            415, "unsupported_media_type", f"send the body as application/json, not {kind or 'nothing'}"
        )
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY:
        raise ApiError(413, "too_large", f"the body is {length} bytes; the limit is {MAX_BODY}")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise ApiError(413, "too_large", f"the body passes the limit of {MAX_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _conflict(front: HttpFrontEnd, req: _schema.SubmitRequest) -> list[str]:
    """What differs between ``req`` and the known turn with its ``turn_id`` (SPEC: the same id
    with another agent or input is refused)."""
    assert req.turn_id is not None
    try:
        known = front.sup.turn_info(req.turn_id)
    except UnknownTurn:
        return []
    differs = []
    if known["agent"] != req.agent:
        differs.append("agent")
    if known["session"] != req.session:
        differs.append("session")
    kept, value = (True, known["input"]) if known.get("input_retained") else front.inputs.get(req.turn_id)
    if kept and value != req.input:
        differs.append("input")
    return differs


async def submit(request: Request) -> Response:
    front = _front(request)
    body = await _body(request)
    try:
        req = _submit_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise ApiError(400, "bad_type", str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, "malformed", f"the body is not JSON: {exc}") from None
    except RecursionError:  # LINK-DEPTH
        raise ApiError(400, "bad_value", f"the body {wire.TOO_DEEP}") from None
    if req.turn_id is not None:
        differs = _conflict(front, req)
        if differs:
            raise ApiError(
                409,
                "turn_id_conflict",
                f"turn {req.turn_id!r} exists with another "
                f"{' and '.join(differs)}: a turn_id names one request",
            )
    # OBS-TRACE: the caller's W3C trace context, carried to the agent (an invalid one is ignored).
    CALLER_TRACE.set(valid_traceparent(request.headers.get("traceparent")))
    try:
        turn_id, existed = await front.daemon.submit(
            req.agent,
            req.input,
            session=req.session,
            timeout=req.timeout,
            grace=req.grace,
            kill_after=req.kill_after,
            turn_id=req.turn_id,
            retry=req.retry,
        )
    except AgentNotAllowed as exc:  # SEC-ALLOW
        raise ApiError(403, "agent_not_allowed", str(exc)) from None
    except InvalidAgent as exc:
        raise ApiError(400, "invalid_agent", str(exc)) from None
    except TurnIdConflict as exc:  # API-TURN-ID, found by the daemon (e.g. an id known from the journal)
        raise ApiError(409, "turn_id_conflict", str(exc)) from None
    except QueueFull as exc:
        raise ApiError(429, "queue_full", str(exc), {"retry-after": "1"}) from None
    except SupervisorClosed as exc:
        raise ApiError(503, "shutting_down", str(exc)) from None
    except wire.PayloadTooLarge as exc:
        raise ApiError(413, "too_large", str(exc)) from None
    except TypeError as exc:
        raise ApiError(400, "bad_type", str(exc)) from None
    except ValueError as exc:
        raise ApiError(400, "bad_value", str(exc)) from None
    except TurnpoolError as exc:  # e.g. the journal could not record it: not the client's fault
        raise ApiError(503, "internal", f"{type(exc).__name__}: {exc}") from None
    if not existed:
        front.inputs.put(turn_id, req.input, len(body))
    location = f"/v1/turns/{id_segment(turn_id)}"  # LINK-TURN-ID: any accepted id, percent-encoded
    return _respond(
        _schema.Submitted(turn_id=turn_id, existing=existed), 200 if existed else 201, {"location": location}
    )


# ---- read ----------------------------------------------------------------------------


def _state(front: HttpFrontEnd, turn_id: str) -> dict[str, Any]:
    try:
        view: dict[str, Any] = front.sup.turn_info(turn_id)
    except UnknownTurn as exc:
        raise ApiError(404, "unknown_turn", str(exc)) from None
    if not view.get("input_retained"):
        kept, value = front.inputs.get(turn_id)
        if kept:
            view["input"], view["input_retained"] = value, True
    view["now"] = time.time()
    return view


async def get_turn(request: Request) -> Response:
    front = _front(request)
    turn_id = _param(request, "turn_id")
    wait = query_float(request, "wait", 0.0, 0.0, MAX_WAIT)
    try:
        handle = front.sup.handle(turn_id)
    except UnknownTurn as exc:
        raise ApiError(404, "unknown_turn", str(exc)) from None
    result = None
    with anyio.move_on_after(wait):
        result = await handle.result()  # a handle only observes: giving up the wait cancels nothing
    if result is not None:
        return Response(_result_json(result), media_type="application/json")
    return _respond(_state(front, turn_id), 202)


async def get_turn_state(request: Request) -> Response:
    """``GET /v1/turns/{id}/state``: the turn's state (and input) whether or not it has ended."""
    front = _front(request)
    return _respond(_state(front, _param(request, "turn_id")))


async def get_turn_steps(request: Request) -> Response:
    """LOOP-STEP-INSPECT: ``GET /v1/turns/{id}/steps``: the turn's step records as steps, each tool call with
    its state (from the daemon's memory while it holds them, else from its journal)."""
    front = _front(request)
    turn_id = _param(request, "turn_id")
    steps = front.sup.steps.view(turn_id)
    if steps is None:
        path = front.daemon.journal_path
        known = front.sup.find(turn_id) is not None
        if path is not None:
            try:
                steps = await anyio.to_thread.run_sync(view_steps, path, turn_id)
                known = known or await anyio.to_thread.run_sync(read_result_or_none, path, turn_id)
            except (sqlite3.Error, JournalError) as exc:
                raise ApiError(503, "internal", f"the journal cannot be read: {exc}") from None
        if not known:
            raise ApiError(404, "unknown_turn", str(UnknownTurn(turn_id)))
    return _respond({"turn_id": turn_id, "steps": steps or []})


def read_result_or_none(path: str, turn_id: str) -> bool:
    """Whether the journal at ``path`` knows ``turn_id`` (ended or not)."""
    try:
        journal_read.read_result(path, turn_id)
    except UnknownTurn:
        return False
    return True


async def list_turns(request: Request) -> Response:
    front = _front(request)
    states = tuple(s for s in request.query_params.get("state", "running").split(",") if s)
    limit = int(query_float(request, "limit", 100, 0, MAX_LIST))
    try:
        turns = front.sup.turns(states, limit=limit)
    except ValueError as exc:
        raise ApiError(400, "bad_value", str(exc)) from None
    return _respond({"now": time.time(), "turns": turns})


async def events(request: Request) -> Any:
    front = _front(request)
    turn_id = _param(request, "turn_id")
    text = (
        request.headers.get("last-event-id", request.query_params.get("last_event_id", "-1")).strip() or "-1"
    )
    try:
        after = int(text)
    except ValueError:
        raise ApiError(
            400, "bad_value", f"Last-Event-ID must be an event's sequence number, got {text!r}"
        ) from None
    if after < -1:
        raise ApiError(400, "bad_value", f"Last-Event-ID must be >= -1, got {after}")
    try:
        front.sup.handle(turn_id)
    except UnknownTurn as exc:
        raise ApiError(404, "unknown_turn", str(exc)) from None
    return EventStream(front, turn_id, after, front.sse_buffer)


async def status(request: Request) -> Response:
    front = _front(request)
    st = front.daemon.status()
    st["http"] = front.status()
    return _respond(st)


async def outcomes(request: Request) -> Response:
    front = _front(request)
    seconds = int(query_float(request, "seconds", 300, 1, front.history.size))
    now = time.time()
    return _respond({"now": now, "interval": 1.0, "outcomes": front.history.series(seconds, now)})


# ---- cancel --------------------------------------------------------------------------


async def cancel(request: Request) -> Response:
    front = _front(request)
    turn_id = _param(request, "turn_id")
    sup = front.sup
    turn = sup.find(turn_id)
    if turn is None:
        raise ApiError(404, "unknown_turn", str(UnknownTurn(turn_id)))
    # Timed like a client's cancel: HTTP cancels feed turnpool_cancel_to_end_seconds too.
    cause = front.daemon.cancel_timed(lambda: sup.cancel_record(turn, wire.USER), [turn_id])
    return _respond({"turn_id": turn_id, "cause": cause})


async def cancel_session(request: Request) -> Response:
    front = _front(request)
    session = _param(request, "session")
    sup = front.sup
    if not session:
        raise ApiError(400, "bad_value", "session must be a non-empty string")
    ids: list[str] = []  # filled by the cancel, then timed (as the client link does)
    try:
        front.daemon.cancel_timed(lambda: ids.extend(sup.cancel_session_now(session, wire.USER)), ids)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "bad_value", str(exc)) from None
    return _respond({"session": session, "cancelled": ids})


# ---- documents -----------------------------------------------------------------------


def _static(name: str) -> bytes:
    return resources.files("supervisor.http").joinpath("static", name).read_bytes()


_STATIC_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}


def _static_route(path: str, name: str) -> Route:
    body = _static(name)
    headers = {
        "cache-control": "no-cache",
        "x-content-type-options": "nosniff",
        "content-security-policy": "default-src 'self'; style-src 'self'; script-src 'self'; "
        "img-src 'self' data:; frame-ancestors 'none'",
    }

    async def serve(request: Request) -> Response:
        return Response(body, media_type=_STATIC_TYPES[name], headers=headers)

    return Route(path, serve, methods=["GET", "HEAD"])


def build_app(front: HttpFrontEnd) -> tuple[Any, Guard]:
    """The ASGI app of ``front``: the guard around Starlette's router."""
    document = _json.encode(_schema.openapi())

    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return _respond({"error": {"code": exc.code, "message": exc.message}}, exc.status, exc.headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "malformed")
        return _respond(
            {"error": {"code": code, "message": str(exc.detail)}}, exc.status_code, dict(exc.headers or {})
        )

    async def internal(request: Request, exc: Exception) -> Response:
        return _respond({"error": {"code": "internal", "message": f"{type(exc).__name__}: {exc}"}}, 500)

    from ._views import view_routes  # the dashboard's views (paged lists, history, figures, log)

    routes = [
        *view_routes(front),
        Route("/v1/turns", submit, methods=["POST"]),
        Route("/v1/turns", list_turns, methods=["GET"]),
        Route("/v1/turns/{turn_id}", get_turn, methods=["GET"]),
        Route("/v1/turns/{turn_id}/state", get_turn_state, methods=["GET"]),
        Route("/v1/turns/{turn_id}/steps", get_turn_steps, methods=["GET"]),
        Route("/v1/turns/{turn_id}/events", events, methods=["GET"]),
        Route("/v1/turns/{turn_id}/cancel", cancel, methods=["POST"]),
        Route("/v1/sessions/{session}/cancel", cancel_session, methods=["POST"]),
        Route("/v1/status", status, methods=["GET"]),
        Route("/v1/outcomes", outcomes, methods=["GET"]),
        Route("/v1/openapi.json", openapi, methods=["GET"]),
        _static_route("/", "index.html"),
        _static_route("/static/dashboard.js", "dashboard.js"),
        _static_route("/static/dashboard.css", "dashboard.css"),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: internal},
    )
    app.state.front = front
    guard = Guard(IdPaths(app), token=front.token, loopback=front.loopback)
    return guard, guard
