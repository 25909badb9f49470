"""The HTTP API's bodies as msgspec types, and the OpenAPI document generated from them.

Requests are decoded with these types (so a wrong field is a 400 naming its path) and the
OpenAPI schema is ``msgspec.json.schema_components`` of the very same types, plus ``TurnResult``
and ``Cause`` from ``wire``: the document cannot drift from what the server does.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from wire import Cause, TurnError, TurnResult


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


class StepCall(msgspec.Struct, kw_only=True):
    """One tool call of a step (LOOP-STEP-INSPECT): ``state`` ``not_started``, ``started`` (its outcome
    unknown if the turn crashed then), ``completed`` (``output``, or ``error``), ``not_recorded``
    (its output was too large to record)."""

    call_id: str
    name: str
    arguments: Any = None
    state: Literal["not_started", "started", "completed", "not_recorded"]
    output: Any = None
    error: str | None = None


class TurnStep(msgspec.Struct, kw_only=True):
    """One model step: the agent loop (``loop``), its index (``step``), the model's text and calls
    (an ``AgentLoop``'s, a pydantic-ai ``durable`` agent's, or a LangGraph graph's: then ``node``
    names the graph node that made it)."""

    loop: int = 0
    step: int = 0
    text: str = ""
    finish: str | None = None
    calls: list[StepCall] = []
    node: str | None = None


class TurnSteps(msgspec.Struct, kw_only=True):
    """``GET /v1/turns/{id}/steps``: the turn's recorded steps, oldest first."""

    turn_id: str
    steps: list[TurnStep]


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
    TurnSteps,
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
        "/v1/turns/{turn_id}/steps": {
            "get": {
                "summary": "The turn's recorded steps, each tool call with its state (LOOP-STEP-INSPECT)",
                "parameters": [turn_id],
                "responses": {"200": _json(_ref("TurnSteps"), "its steps"), **_errors(404, 503)},
            },
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
    paths.update(view_paths())
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


# ---- the dashboard's views (``_views``) --------------------------------------------------------


class LiveTurn(TurnState, kw_only=True):
    """One row of ``GET /v1/live``: a turn's state, with an ended turn's ``error`` and, for a killed
    one, ``kill_reason`` (its cause and the signal that ended it, e.g. ``user: sigkill``)."""

    error: TurnError | None = None
    kill_reason: str | None = None


class LivePage(msgspec.Struct, kw_only=True):
    """``GET /v1/live``: ``total`` turns in ``state`` match the filters; ``turns`` are those from
    ``offset`` (newest first for ``ended``, queue order for ``queued``)."""

    now: float
    state: Literal["queued", "running", "ended"]
    total: int
    offset: int
    turns: list[LiveTurn]


class HistoryRow(msgspec.Struct, kw_only=True):
    """One turn of the history (the journal's row, or a kept ended turn without a journal).
    ``state`` is the journal's: ``queued``, ``dispatched``, ``running`` or ``ended``."""

    turn_id: str
    agent: str
    session: str | None = None
    state: str
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    worker_pid: int | None = None
    outcome: str | None = None
    cause: str | None = None
    error: TurnError | None = None
    kill_reason: str | None = None


class HistoryPage(msgspec.Struct, kw_only=True):
    """``GET /v1/history``: newest first; ``source`` is ``journal``, or ``memory`` (no journal: the
    ended turns the daemon keeps)."""

    now: float
    source: Literal["journal", "memory"]
    total: int
    offset: int
    turns: list[HistoryRow]


class HistoryTurn(msgspec.Struct, kw_only=True):
    """``GET /v1/history/{id}``: the journal's result of a turn (``null`` until it ended) and the
    events the journal kept of it (``serve --journal-events``; at most 500)."""

    now: float
    turn_id: str
    result: TurnResult | None
    kill_reason: str | None = None
    events: list[Any]


class AgentWindow(msgspec.Struct, kw_only=True):
    """One agent's ended turns in a window: counts by outcome and the p50/p99 of queue and run time
    in seconds (to within 10 %; ``null`` when none of its turns started)."""

    turns: int
    outcomes: dict[str, int]
    queue_p50: float | None
    queue_p99: float | None
    run_p50: float | None
    run_p99: float | None


class AgentFigures(msgspec.Struct, kw_only=True):
    """``GET /v1/agents``: per-agent figures over the last 5 minutes (``5m``) and hour (``1h``), to
    within 10 s; agents past the 50th seen are counted as ``other``."""

    now: float
    windows: dict[str, dict[str, AgentWindow]]


class WorkerLogTail(msgspec.Struct, kw_only=True):
    """``GET /v1/worker-log``: where workers' output goes (``output``: a file, ``stderr``,
    ``inherit`` or ``discarded``) and, for a file, its last lines (``truncated``: more came before)."""

    output: str
    path: str | None
    lines: list[str]
    truncated: bool


_TYPES = (
    *_TYPES,
    LiveTurn,
    LivePage,
    HistoryRow,
    HistoryPage,
    HistoryTurn,
    AgentWindow,
    AgentFigures,
    WorkerLogTail,
)


def _query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    out = {"name": name, "in": "query", "schema": schema}
    if description:
        out["description"] = description
    return out


def view_paths() -> dict[str, Any]:
    """The OpenAPI paths of the dashboard's views."""
    page = [
        _query("offset", {"type": "integer", "minimum": 0}),
        _query("limit", {"type": "integer", "minimum": 1, "maximum": 200}),
    ]
    text = {"type": "string", "maxLength": 256}
    outcome = {"type": "string", "enum": ["completed", "failed", "aborted", "killed", "crashed"]}
    return {
        "/v1/live": {
            "get": {
                "summary": "A page of the queued, running or kept ended turns, filtered, with their total",
                "parameters": [
                    _query("state", {"type": "string", "enum": ["queued", "running", "ended"]}),
                    *page,
                    _query("agent", text, "the agent, exactly"),
                    _query("session", text, "the session, exactly"),
                    _query("outcome", outcome),
                    _query("id", text, "the start of the turn id"),
                    _query("q", text, "a part of the id, agent or session"),
                ],
                "responses": {"200": _json(_ref("LivePage"), "the page"), **_errors(400, 401)},
            }
        },
        "/v1/history": {
            "get": {
                "summary": "A page of the journal's turns, newest first, filtered, with their total",
                "parameters": [
                    _query("state", {"type": "string", "enum": ["ended", "open"]}),
                    *page,
                    _query("agent", text),
                    _query("session", text),
                    _query("outcome", outcome),
                    _query("q", text, "a part of the id, agent or session"),
                ],
                "responses": {
                    "200": _json(_ref("HistoryPage"), "the page"),
                    **_errors(400, 401, 503),
                },
            }
        },
        "/v1/history/{turn_id}": {
            "get": {
                "summary": "A turn's result and kept events from the journal",
                "parameters": [
                    {"name": "turn_id", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": _json(_ref("HistoryTurn"), "the turn"),
                    **_errors(401, 404, 503),
                },
            }
        },
        "/v1/agents": {
            "get": {
                "summary": "Per-agent outcome counts and p50/p99 queue and run time, last 5 minutes and hour",
                "responses": {"200": _json(_ref("AgentFigures"), "the figures"), **_errors(401)},
            }
        },
        "/v1/worker-log": {
            "get": {
                "summary": "The last lines of the worker log, or where workers' output goes",
                "parameters": [_query("lines", {"type": "integer", "minimum": 1, "maximum": 1000})],
                "responses": {"200": _json(_ref("WorkerLogTail"), "the tail"), **_errors(400, 401)},
            }
        },
    }
