"""The HTTP API's bodies as msgspec types, and the OpenAPI document generated from them.

Requests are decoded with these types (so a wrong field is a 400 naming its path) and the
OpenAPI schema is ``msgspec.json.schema_components`` of the very same types, plus ``TurnResult``
and ``Cause`` from ``wire``: the document cannot drift from what the server does.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from wire import Cause, TurnResult


class SubmitRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/turns``: the arguments of ``Supervisor.submit``."""

    agent: str
    input: Any = None
    session: str | None = None
    timeout: float | None = None
    grace: float | None = None
    kill_after: float | None = None
    turn_id: str | None = None
    retry: bool = False


class Submitted(msgspec.Struct, kw_only=True):
    """``201`` (new turn) or ``200`` (the same request again under a known ``turn_id``)."""

    turn_id: str
    existing: bool = False


class TurnState(msgspec.Struct, kw_only=True):
    """A turn that has not ended (``202``), or one row of ``GET /v1/turns``.

    ``escalation``: ``null`` (not cancelled), ``abort`` (Abort sent, grace running), ``sigterm``,
    ``sigkill`` (the last signal sent); ``next_signal`` / ``next_signal_at`` (epoch seconds): the
    step still to come. ``input`` is present on ``GET /v1/turns/{id}`` while the daemon keeps it."""

    turn_id: str
    state: Literal["queued", "running", "ended"]
    agent: str
    session: str | None = None
    parent: str | None = None
    worker_pid: int | None = None
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    events: int = 0
    cause: Cause | None = None
    escalation: Literal["abort", "sigterm", "sigkill"] | None = None
    next_signal: Literal["sigterm", "sigkill"] | None = None
    next_signal_at: float | None = None
    deadline_at: float | None = None
    timeout: float | None = None
    grace: float
    kill_after: float
    outcome: str | None = None
    input: Any = None
    input_retained: bool | None = None
    now: float | None = None


class TurnList(msgspec.Struct, kw_only=True):
    """``GET /v1/turns?state=…``: ``now`` is the server's clock (epoch seconds) for ages and countdowns."""

    now: float
    turns: list[TurnState]


class CancelReply(msgspec.Struct, kw_only=True):
    """``POST /v1/turns/{id}/cancel``: the winning cause (``null``: the turn ended uncancelled)."""

    turn_id: str
    cause: Cause | None


class SessionCancelReply(msgspec.Struct, kw_only=True):
    """``POST /v1/sessions/{session}/cancel``: the ids of the turns it cancelled."""

    session: str
    cancelled: list[str]


class OutcomeSeries(msgspec.Struct, kw_only=True):
    """``GET /v1/outcomes``: turns ended per ``interval`` seconds, by outcome, oldest bucket first;
    the last bucket ends at ``now``."""

    now: float
    interval: float
    outcomes: dict[str, list[int]]


ErrorCode = Literal[
    "malformed",
    "bad_type",
    "bad_value",
    "invalid_agent",
    "agent_not_allowed",
    "unknown_turn",
    "not_found",
    "method_not_allowed",
    "turn_id_conflict",
    "too_large",
    "unsupported_media_type",
    "queue_full",
    "shutting_down",
    "unauthorized",
    "forbidden",
    "internal",
]


class ErrorDetail(msgspec.Struct, kw_only=True):
    code: ErrorCode
    message: str


class ErrorReply(msgspec.Struct, kw_only=True):
    """Every 4xx/5xx: ``{"error": {"code", "message"}}``."""

    error: ErrorDetail


_TYPES: tuple[Any, ...] = (
    SubmitRequest,
    Submitted,
    TurnResult,
    TurnState,
    TurnList,
    CancelReply,
    SessionCancelReply,
    OutcomeSeries,
    ErrorReply,
    Cause,
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_WHAT = {
    400: "bad input",
    401: "no or wrong bearer token",
    403: "another user's connection, a foreign Host or Origin, or (submit) an agent outside --allow-agent",
    404: "unknown turn",
    409: "turn_id conflict",
    413: "body too large",
    415: "not JSON",
    429: "queue full",
    500: "an unexpected error (a bug: the message names it)",
    503: "shutting down, or the journal cannot record the turn",
}


def _errors(*codes: int, api: bool = True) -> dict[str, Any]:
    """The error answers of an operation: ``codes``, plus what the guard in front of every route may
    answer (403; 401 under /v1, when a token is set) and the catch-all 500."""
    every = {*codes, 403, 500, *((401,) if api else ())}
    return {str(c): _json(_ref("ErrorReply"), _WHAT[c]) for c in sorted(every)}


def openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the HTTP API."""
    (_, components) = msgspec.json.schema_components(_TYPES, ref_template="#/components/schemas/{name}")
    turn_id = {"name": "turn_id", "in": "path", "required": True, "schema": {"type": "string"}}
    sse = {
        "description": "text/event-stream: `event: event` (id = sequence number, data = the event), "
        "`event: gap` (data {from, to}: events no longer retained), then `event: end` "
        "(data = TurnResult)",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
    paths: dict[str, Any] = {
        "/v1/turns": {
            "post": {
                "summary": "Submit a turn (idempotent by turn_id)",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("SubmitRequest")}},
                },
                "responses": {
                    "201": _json(_ref("Submitted"), "accepted"),
                    "200": _json(_ref("Submitted"), "the same request under a known turn_id"),
                    **_errors(400, 409, 413, 415, 429, 503),
                },
            },
            "get": {
                "summary": "List turns by state",
                "parameters": [
                    {
                        "name": "state",
                        "in": "query",
                        "schema": {"type": "string", "enum": ["queued", "running", "ended"]},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 0, "maximum": 1000},
                    },
                ],
                "responses": {"200": _json(_ref("TurnList"), "the turns"), **_errors(400)},
            },
        },
        "/v1/turns/{turn_id}": {
            "get": {
                "summary": "The result (200) or the turn's state while it runs (202)",
                "parameters": [
                    turn_id,
                    {
                        "name": "wait",
                        "in": "query",
                        "description": "long-poll up to this many seconds (at most 60)",
                        "schema": {"type": "number", "minimum": 0},
                    },
                ],
                "responses": {
                    "200": _json(_ref("TurnResult"), "the turn ended"),
                    "202": _json(_ref("TurnState"), "the turn has not ended"),
                    **_errors(400, 404),
                },
            },
        },
        "/v1/turns/{turn_id}/events": {
            "get": {
                "summary": "Server-Sent Events of the turn from its start; Last-Event-ID resumes",
                "parameters": [
                    turn_id,
                    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "integer", "minimum": -1}},
                ],
                "responses": {"200": sse, **_errors(400, 404)},
            },
        },
        "/v1/turns/{turn_id}/cancel": {
            "post": {
                "summary": "Cancel the turn (cause user); returns the winning cause",
                "parameters": [turn_id],
                "responses": {"200": _json(_ref("CancelReply"), "cancelled"), **_errors(404)},
            },
        },
        "/v1/sessions/{session}/cancel": {
            "post": {
                "summary": "Cancel the session's running turn and its turns queued now",
                "parameters": [
                    {"name": "session", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {"200": _json(_ref("SessionCancelReply"), "cancelled"), **_errors(400)},
            },
        },
        "/v1/status": {
            "get": {
                "summary": "What `turnpool status --json` prints",
                "responses": {"200": _json({"type": "object"}, "workers, queue, counts"), **_errors()},
            }
        },
        "/v1/outcomes": {
            "get": {
                "summary": "Turns ended per second by outcome, the last minutes",
                "parameters": [
                    {
                        "name": "seconds",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 600},
                    }
                ],
                "responses": {"200": _json(_ref("OutcomeSeries"), "the series"), **_errors(400)},
            }
        },
        "/v1/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1"), **_errors()},
            }
        },
        "/v1/turns/{turn_id}/state": {
            "get": {
                "summary": "The turn's state (and input, while kept), whether or not it has ended",
                "parameters": [turn_id],
                "responses": {"200": _json(_ref("TurnState"), "the turn's state"), **_errors(404)},
            },
        },
        **{
            path: {
                "get": {
                    "summary": f"The dashboard: {what}",
                    "responses": {
                        "200": {"description": what, "content": {kind: {"schema": {"type": "string"}}}}
                    }
                    | _errors(api=False),
                }
            }
            for path, what, kind in (
                ("/", "its page", "text/html"),
                ("/static/dashboard.js", "its script", "text/javascript"),
                ("/static/dashboard.css", "its style sheet", "text/css"),
            )
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "turnpool",
            "version": "1",
            "description": "Submit, follow and cancel agent turns on a turnpool daemon.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
    }
