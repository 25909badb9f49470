"""Records and results to feed a ``Journal`` directly in tests (no supervisor around it)."""

from __future__ import annotations

from typing import Any

import wire
from supervisor.lowlevel import TurnRecord


def record(
    turn_id: str, session: str | None = None, retry: bool = False, *, tag: bytes | None = None
) -> TurnRecord:
    """A queued echo turn's record, as the engine would hand it to the journal; ``tag`` makes
    its input differ from another record's of the same id (a conflicting request)."""
    inp: dict[str, Any] = {"id": turn_id} if tag is None else {"id": turn_id, "tag": tag.hex()}
    t = TurnRecord(
        turn_id=turn_id,
        agent="examples.agents:echo",
        input=wire.encode_payload(inp),
        session=session,
        parent=None,
        timeout=None,
        grace=5.0,
        kill_after=2.0,
        now=0.0,
    )
    t.retry = retry
    return t


def completed(turn_id: str) -> wire.TurnResult:
    """A completed result for ``turn_id``."""
    return wire.TurnResult(turn_id=turn_id, outcome="completed", output={"out": turn_id}, started=True)


# A frozen copy of the journal's schema 1 (turnpool before JOURNAL-APPEND: one row per turn, rewritten at
# each step), to build the files an upgrade must read and convert.
SCHEMA_1 = """
CREATE TABLE turns (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_id TEXT NOT NULL UNIQUE,
    agent TEXT NOT NULL,
    input BLOB NOT NULL,
    session TEXT,
    parent TEXT,
    timeout REAL,
    grace REAL,
    kill_after REAL,
    retry INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 1,
    state TEXT NOT NULL,
    accepted_at REAL NOT NULL,
    started_at REAL,
    worker_pid INTEGER,
    ended_at REAL,
    outcome TEXT,
    cause TEXT,
    error_type TEXT,
    error_message TEXT,
    result BLOB
);
CREATE INDEX turns_state ON turns(state);
CREATE INDEX turns_session ON turns(session);
CREATE INDEX turns_ended ON turns(ended_at);
CREATE TABLE health (id INTEGER PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE events (
    turn_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (turn_id, seq)
);
PRAGMA application_id = 1414548017;  -- APP_ID, "TPJ1"
PRAGMA user_version = 1;
"""
