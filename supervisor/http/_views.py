"""The dashboard's read-only views: paged live lists, the journal's history, per-agent figures and
the worker log's tail.

``GET /v1/live`` pages the queued, running or (kept) ended turns with filters, counting them all
but building views for one page only. ``GET /v1/history`` pages the journal (read on a thread,
on a read-only connection of its own) or, without a journal, the ended turns the daemon keeps.
``GET /v1/agents`` reads an ``AgentRing``: per-agent outcome counts and queue/run-time histograms
in 10-second slots over the last hour, filled once per ended turn (O(1)), so a request costs
the same at any number of turns. ``GET /v1/worker-log`` reads at most ``TAIL_BYTES`` of the
log's end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import wire
from wire import TurnResult

from .._errors import UnknownTurn
from ..daemon.figures import OUTCOMES, AgentRing, kill_reason
from ..journal import reader as journal_read
from ..journal.schema import JournalError
from ._reply import ApiError, query_int
from ._reply import respond as _respond

if TYPE_CHECKING:
    from .._engine.turns import TurnRecord
    from ._server import HttpFrontEnd

MAX_PAGE = 200
MAX_FILTER = 256  # characters of a filter value
MAX_LOG_LINES = 1000
TAIL_BYTES = 256 * 1024
MAX_JOURNAL_EVENTS = 500
WINDOWS = {"5m": 300, "1h": 3600}


# ---- request helpers -------------------------------------------------------------------------


def _filters(request: Request, names: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for name in names:
        value = request.query_params.get(name, "").strip()
        if len(value) > MAX_FILTER:
            raise ApiError(400, "bad_value", f"{name} is longer than {MAX_FILTER} characters")
        if value:
            out[name] = value
    if "outcome" in out and out["outcome"] not in OUTCOMES:
        raise ApiError(
            400, "bad_value", f"outcome must be one of {', '.join(OUTCOMES)}, got {out['outcome']!r}"
        )
    return out


def _matcher(f: dict[str, str]) -> Callable[[TurnRecord], bool]:
    agent, session, outcome = f.get("agent"), f.get("session"), f.get("outcome")
    prefix, q = f.get("id"), f.get("q")

    def match(turn: TurnRecord) -> bool:
        if agent is not None and turn.agent != agent:
            return False
        if session is not None and turn.session != session:
            return False
        if outcome is not None and (turn.result is None or turn.result.outcome != outcome):
            return False
        if prefix is not None and not turn.id.startswith(prefix):
            return False
        return q is None or q in turn.id or q in turn.agent or q in (turn.session or "")

    return match


def _error_fields(view: dict[str, Any], result: TurnResult | None) -> dict[str, Any]:
    """``view`` with the ended turn's ``error`` and ``kill_reason`` (``None`` otherwise)."""
    error = result.error if result is not None else None
    view["error"] = {"type": error.type, "message": error.message} if error is not None else None
    cause = result.cause.kind if result is not None and result.cause is not None else None
    view["kill_reason"] = kill_reason(view.get("outcome"), cause, result.exit_code if result else None)
    return view


# ---- the routes ------------------------------------------------------------------------------


def view_routes(front: HttpFrontEnd) -> list[Route]:
    """The views' routes for ``front``; its ended turns feed the per-agent figures from now on."""
    figures = AgentRing()
    front.daemon.end_hooks.append(figures.add)

    def _with_errors(views: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for view in views:
            turn = front.sup.find(view["turn_id"]) if view["state"] == "ended" else None
            _error_fields(view, turn.result if turn is not None else None)
        return views

    async def live(request: Request) -> Response:
        state = request.query_params.get("state", "running")
        f = _filters(request, ("agent", "session", "outcome", "id", "q"))
        offset = query_int(request, "offset", 0, 0, 10**9)
        limit = query_int(request, "limit", 50, 1, MAX_PAGE)
        try:
            total, views = front.sup.turns_page(state, _matcher(f), offset, limit)
        except ValueError as exc:
            raise ApiError(400, "bad_value", str(exc)) from None
        return _respond(
            {
                "now": time.time(),
                "state": state,
                "total": total,
                "offset": offset,
                "turns": _with_errors(views),
            }
        )

    async def history(request: Request) -> Response:
        f = _filters(request, ("agent", "session", "outcome", "q"))
        state = request.query_params.get("state", "")
        if state not in ("", "ended", "open"):
            raise ApiError(400, "bad_value", f"state must be ended or open, got {state!r}")
        if state:
            f["state"] = state
        offset = query_int(request, "offset", 0, 0, 10**9)
        limit = query_int(request, "limit", 50, 1, MAX_PAGE)
        path = front.daemon.journal_path
        now = time.time()
        if path is None:  # no journal: the ended turns this daemon keeps
            if state == "open":
                return _respond({"now": now, "source": "memory", "total": 0, "offset": offset, "turns": []})
            total, views = front.sup.turns_page("ended", _matcher(f), offset, limit)
            rows = [_memory_row(v) for v in _with_errors(views)]
            return _respond({"now": now, "source": "memory", "total": total, "offset": offset, "turns": rows})
        try:
            total, found = await anyio.to_thread.run_sync(
                lambda: journal_read.history_page(path, filters=f, offset=offset, limit=limit)
            )
        except JournalError as exc:
            raise ApiError(503, "internal", f"the journal cannot be read: {exc}") from None
        rows = [_journal_row(r) for r in found]
        return _respond({"now": now, "source": "journal", "total": total, "offset": offset, "turns": rows})

    async def history_turn(request: Request) -> Response:
        turn_id = request.path_params["turn_id"]
        path = front.daemon.journal_path
        if path is None:
            raise ApiError(404, "unknown_turn", f"{UnknownTurn(turn_id)} (this daemon keeps no journal)")

        def read() -> tuple[TurnResult | None, list[bytes]]:
            return journal_read.read_result(path, turn_id), journal_read.read_events(
                path, turn_id, MAX_JOURNAL_EVENTS
            )

        try:
            result, events = await anyio.to_thread.run_sync(read)
        except UnknownTurn as exc:
            raise ApiError(404, "unknown_turn", str(exc)) from None
        except JournalError as exc:
            raise ApiError(503, "internal", f"the journal cannot be read: {exc}") from None
        decoded = []
        for data in events:
            try:
                decoded.append(wire.decode_payload(data))
            except ValueError:
                decoded.append({"undecodable": len(data)})
        reason = None
        if result is not None:
            reason = kill_reason(
                result.outcome, result.cause.kind if result.cause else None, result.exit_code
            )
        return _respond(
            {
                "turn_id": turn_id,
                "result": result,
                "kill_reason": reason,
                "events": decoded,
                "now": time.time(),
            }
        )

    async def agents(request: Request) -> Response:
        now = time.time()
        return _respond(
            {"now": now, "windows": {name: figures.figures(sec, now) for name, sec in WINDOWS.items()}}
        )

    async def worker_log(request: Request) -> Response:
        lines = query_int(request, "lines", 200, 1, MAX_LOG_LINES)
        where = front.sup.describe_output()
        found = await anyio.to_thread.run_sync(lambda: _tail(Path(where), lines))
        if found is None:  # stderr, inherit, discarded, or a file not written yet
            return _respond({"output": where, "path": None, "lines": [], "truncated": False})
        return _respond({"output": where, "path": where, "lines": found[0], "truncated": found[1]})

    return [
        Route("/v1/live", live, methods=["GET"]),
        Route("/v1/history", history, methods=["GET"]),
        Route("/v1/history/{turn_id}", history_turn, methods=["GET"]),
        Route("/v1/agents", agents, methods=["GET"]),
        Route("/v1/worker-log", worker_log, methods=["GET"]),
    ]


def _memory_row(view: dict[str, Any]) -> dict[str, Any]:
    return {
        "turn_id": view["turn_id"],
        "agent": view["agent"],
        "session": view["session"],
        "state": view["state"],
        "submitted_at": view["submitted_at"],
        "started_at": view["started_at"],
        "ended_at": view["ended_at"],
        "worker_pid": view["worker_pid"],
        "outcome": view["outcome"],
        "cause": view["cause"]["kind"] if view["cause"] else None,
        "error": view["error"],
        "kill_reason": view["kill_reason"],
    }


def _journal_row(row: dict[str, Any]) -> dict[str, Any]:
    error = None
    if row["error_type"] is not None:
        error = {"type": row["error_type"], "message": row["error_message"] or ""}
    return {
        "turn_id": row["turn_id"],
        "agent": row["agent"],
        "session": row["session"],
        "state": row["state"],
        "submitted_at": row["accepted_at"],
        "started_at": row["started_at"],
        "ended_at": row["ended_at"],
        "worker_pid": row["worker_pid"],
        "outcome": row["outcome"],
        "cause": row["cause"],
        "error": error,
        "kill_reason": kill_reason(row["outcome"], row["cause"], row["exit_code"]),
    }


def _tail(path: Path, lines: int) -> tuple[list[str], bool] | None:
    """The last ``lines`` lines of ``path`` within its last ``TAIL_BYTES`` bytes, and whether more
    lines came before them; ``None`` if ``path`` is no file."""
    if not path.is_absolute() or not path.is_file():
        return None
    with path.open("rb") as f:
        size = f.seek(0, 2)
        start = max(0, size - TAIL_BYTES)
        f.seek(start)
        data = f.read()
    text = data.decode("utf-8", "replace").splitlines()
    if start > 0 and text:
        text = text[1:]  # a line cut in the middle
    return text[-lines:], start > 0 or len(text) > lines
