"""Reading a journal without owning it: what a daemon recovers at start-up (``unfinished``), the
id lookups that keep a submit idempotent across evictions and restarts (JOURNAL-LOOKUP: ``lookup``), and what
``turnpool history`` and ``turnpool result`` print (``read_history``, ``read_result``). Every read
opens its own read-only connection (WAL lets it run beside the writer) after checking the file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from wire import TurnResult

from .schema import JOINED, STATE, JournalError, check_existing

decode_result = msgspec.msgpack.Decoder(TurnResult).decode


@dataclass(frozen=True)
class RecoveredTurn:
    """A turn found unfinished at start-up."""

    turn_id: str
    agent: str
    input: bytes
    session: str | None
    parent: str | None
    timeout: float | None
    grace: float | None
    kill_after: float | None
    retry: bool
    attempts: int
    state: str
    seq: int = 0  # JOURNAL-APPEND: the journal's own number for the turn
    started_at: float | None = None
    worker_pid: int | None = None


def open_reader(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise JournalError(f"no journal at {path}")
    check_existing(path)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    return con


def _schema(con: sqlite3.Connection) -> int:
    """1 for a journal written by a turnpool before JOURNAL-APPEND (one rewritten row per turn), else 2."""
    return 1 if con.execute("PRAGMA user_version").fetchone()[0] == 1 else 2


def unfinished(path: Path) -> Iterator[RecoveredTurn]:
    """The turns not ended (queued or running when the daemon died), in acceptance order. Read
    after the daemon's writer opened the file (so it has schema 2)."""
    con = open_reader(path)
    try:
        query = (
            f"SELECT t.*, o.started_at, o.worker_pid, {STATE} AS state FROM open_turns o"
            " JOIN turns t ON t.seq = o.seq LEFT JOIN ends e ON e.seq = o.seq ORDER BY o.seq"
        )
        for r in con.execute(query):
            yield RecoveredTurn(
                r["turn_id"],
                r["agent"],
                r["input"],
                r["session"],
                r["parent"],
                r["timeout"],
                r["grace"],
                r["kill_after"],
                bool(r["retry"]),
                r["attempts"],
                r["state"],
                r["seq"],
                r["started_at"],
                r["worker_pid"],
            )
    finally:
        con.close()


def lookup(path: Path | str, turn_id: str) -> tuple[str, bytes, TurnResult | None] | None:
    """A turn id's agent, input and result (``None`` until it ended), or ``None`` if the journal
    has never recorded it: the daemon asks before accepting an id it no longer holds (JOURNAL-LOOKUP)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return lookup_on(con, turn_id)
    finally:
        con.close()


def lookup_on(con: sqlite3.Connection, turn_id: str) -> tuple[str, bytes, TurnResult | None] | None:
    """``lookup`` on an open connection."""
    row = con.execute(
        "SELECT t.agent, t.input, e.result FROM turns t LEFT JOIN ends e ON e.seq = t.seq WHERE t.turn_id=?",
        (turn_id,),
    ).fetchone()
    if row is None:
        return None
    return row[0], bytes(row[1]), decode_result(row[2]) if row[2] is not None else None


def read_result(path: Path | str, turn_id: str) -> TurnResult | None:
    """The recorded result of one turn (exactly what the client saw), or None if it has not ended."""
    con = open_reader(Path(path))
    try:
        if _schema(con) == 1:
            row = con.execute("SELECT result FROM turns WHERE turn_id=?", (turn_id,)).fetchone()
        else:
            row = con.execute(
                "SELECT e.result FROM turns t LEFT JOIN ends e ON e.seq = t.seq WHERE t.turn_id=?",
                (turn_id,),
            ).fetchone()
    finally:
        con.close()
    if row is None:
        from .._errors import UnknownTurn

        raise UnknownTurn(turn_id)
    return decode_result(row["result"]) if row["result"] is not None else None


def read_history(
    path: Path | str,
    *,
    session: str | None = None,
    outcome: str | None = None,
    since: float | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Turns newest first, filtered; each a dict of the journal's columns (input left out)."""
    clauses: list[str] = []
    params: list[Any] = []
    con = open_reader(Path(path))
    try:
        old = _schema(con) == 1  # a schema-1 file no daemon has opened since the upgrade
        if session is not None:
            clauses.append("session = ?" if old else "t.session = ?")
            params.append(session)
        if outcome is not None:
            clauses.append("outcome = ?" if old else "e.outcome = ?")
            params.append(outcome)
        if since is not None:
            clauses.append("accepted_at >= ?" if old else "t.accepted_at >= ?")
            params.append(since)
        where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
        if old:
            query = (
                "SELECT turn_id, agent, session, parent, state, attempts, accepted_at, started_at, ended_at,"
                " worker_pid, outcome, cause, error_type, error_message"
                f" FROM turns {where} ORDER BY seq DESC LIMIT ?"
            )
        else:
            query = (
                f"SELECT t.turn_id, t.agent, t.session, t.parent, {STATE} AS state, t.attempts,"
                " t.accepted_at, COALESCE(e.started_at, o.started_at) AS started_at, e.ended_at,"
                " COALESCE(e.worker_pid, o.worker_pid) AS worker_pid, e.outcome, e.cause, e.error_type,"
                f" e.error_message FROM {JOINED} {where} ORDER BY t.seq DESC LIMIT ?"
            )
        rows = con.execute(query, (*params, limit)).fetchall()
    finally:
        con.close()
    return [dict(r) for r in rows]


def history_page(
    path: Path | str,
    *,
    filters: dict[str, str],
    offset: int = 0,
    limit: int = 50,
) -> tuple[int, list[dict[str, Any]]]:
    """One page of the journal's turns, newest first, for the dashboard's history: how many match
    ``filters`` (``session``, ``outcome``, ``agent`` equal; ``state``: ``ended`` or ``open``; ``q``:
    a part of the id, agent or session) and those rows, each with its result's ``exit_code``."""
    clauses: list[str] = []
    params: list[Any] = []
    for name in ("session", "agent"):
        if filters.get(name):
            clauses.append(f"t.{name} = ?")
            params.append(filters[name])
    if filters.get("outcome"):
        clauses.append("e.outcome = ?")
        params.append(filters["outcome"])
    if filters.get("state") == "ended":
        clauses.append("e.seq IS NOT NULL")
    elif filters.get("state") == "open":
        clauses.append("e.seq IS NULL")
    if filters.get("q"):
        clauses.append("(instr(t.turn_id, ?) > 0 OR instr(t.agent, ?) > 0 OR instr(t.session, ?) > 0)")
        params.extend([filters["q"]] * 3)
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    con = open_reader(Path(path))
    try:
        if _schema(con) == 1:
            raise JournalError(f"{path} is a journal of an older turnpool: open it with a daemon first")
        total = con.execute(f"SELECT COUNT(*) FROM {JOINED} {where}", params).fetchone()[0]
        query = (
            f"SELECT t.turn_id, t.agent, t.session, t.parent, {STATE} AS state, t.attempts,"
            " t.accepted_at, COALESCE(e.started_at, o.started_at) AS started_at, e.ended_at,"
            " COALESCE(e.worker_pid, o.worker_pid) AS worker_pid, e.outcome, e.cause, e.error_type,"
            f" e.error_message, e.result FROM {JOINED} {where} ORDER BY t.seq DESC LIMIT ? OFFSET ?"
        )
        rows = con.execute(query, (*params, limit, offset)).fetchall()
    finally:
        con.close()
    out = []
    for r in rows:
        row = dict(r)
        blob = row.pop("result")
        row["exit_code"] = decode_result(blob).exit_code if blob is not None else None
        out.append(row)
    return total, out


def read_events(path: Path | str, turn_id: str, limit: int) -> list[bytes]:
    """The first ``limit`` events the journal kept of a turn (msgpack-encoded, in order)."""
    con = open_reader(Path(path))
    try:
        rows = con.execute(
            "SELECT data FROM events WHERE turn_id = ? ORDER BY seq LIMIT ?", (turn_id, limit)
        ).fetchall()
    finally:
        con.close()
    return [bytes(r[0]) for r in rows]
