"""Step records in a daemon's journal (LOOP-STEP-DURABLE): the ``steps`` table, the sink that writes a
record and acknowledges it once committed, and what a restart reads back (LOOP-RESUME).

A record is one row, ``(turn_id, seq)`` its key, written through the journal's batched writer like
every other row: a worker's ``StepAck`` goes out only from the commit's callback, so a record a
worker was told is durable survives a SIGKILL of the daemon. The table is not among JOURNAL-REFUSE-BAD's
required tables: a journal made before it existed gets it at open, empty. A turn's rows go with the turn
(retention deletes its ``turns`` row; a trigger its steps).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._engine.steps import describe

if TYPE_CHECKING:
    from .._engine.supervisor import Supervisor
    from .store import Journal

STEPS_SCHEMA = """
CREATE TABLE IF NOT EXISTS steps (
    turn_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    step INTEGER NOT NULL,
    kind TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (turn_id, seq)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS turn_steps_go AFTER DELETE ON turns
BEGIN
    DELETE FROM steps WHERE turn_id = OLD.turn_id;
END;
"""

_INSERT = "INSERT OR REPLACE INTO steps (turn_id, seq, step, kind, data) VALUES (?,?,?,?,?)"


class JournalSteps:
    """The supervisor's step sink (``StepRecords.set_sink``): one journal row per record; ``done``
    runs on the daemon's event loop once the row is committed."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def write(
        self, turn_id: str, seq: int, step: int, kind: str, record: bytes, done: Callable[[], None]
    ) -> None:
        self.journal.write(_INSERT, (turn_id, seq, step, kind, record), done)


def read_steps(path: Path | str, turn_id: str) -> list[tuple[str, bytes]]:
    """A turn's records as ``(kind, data)`` in ``seq`` order (none: an empty list; a journal
    without the table yet: none either)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        rows = con.execute(
            "SELECT kind, data FROM steps WHERE turn_id = ? ORDER BY seq", (turn_id,)
        ).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
    finally:
        con.close()
    return [(kind, bytes(data)) for kind, data in rows]


def attach_steps(sup: Supervisor, journal: Journal) -> None:
    """At start, after recovery: step records go to ``journal`` from now on, and every turn recovery
    queued again (``retry=True``, ``attempts`` > 1) gets its records back and its ``resumed`` event,
    so its next attempt resumes from its last committed step."""
    sup.steps.set_sink(JournalSteps(journal))
    for turn in sup.records():
        if turn.state != "queued" or turn.attempts <= 1:
            continue
        records = read_steps(journal.path, turn.id)
        if records:
            sup.steps.restore(turn.id, records)
        sup.steps.announce(turn)


def view_steps(path: Path | str, turn_id: str) -> list[dict[str, Any]]:
    """LOOP-STEP-INSPECT: a turn's steps as the journal holds them (``StepRecords.describe``)."""
    return describe([data for _, data in read_steps(path, turn_id)])
