"""The journal file: its schema, how a file is recognised as a journal, and where it lives.

``SCHEMA`` is the one definition of the tables (schema 2, JOURNAL-APPEND: ``turns``, one row per accepted
turn written once; ``ends``, one row per ended turn; ``open_turns`` and ``cleared``, what is still
open and what may run; ``events``; ``health``: the row the writer rewrites to learn that a failed
disk is back); ``MIGRATE_FROM_1`` brings a schema-1 file to it. A file is a turnpool journal
when its SQLite ``application_id`` is ``APP_ID``; ``check_existing`` refuses, read-only and
without touching the file, a corrupt file, a file from a newer schema, a damaged journal (a
table of its schema gone) or another application's database. ``check_private_dir`` refuses a
directory other users can read or write (the journal holds every turn's input and output).
``Journal`` (``store.py``) writes the file; ``reader.py`` reads it.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from pathlib import Path

from .._errors import DaemonAlreadyRunning, TurnpoolError
from .steps import STEPS_SCHEMA

SCHEMA_VERSION = 2
APP_ID = 0x54504A31  # "TPJ1": marks a SQLite file as a turnpool journal

# JOURNAL-APPEND (schema 2): rows are inserted, not rewritten. A turn's acceptance is one ``turns`` row
# (``seq`` given by the daemon, in acceptance order), its end one ``ends`` row; while it is open
# it has an ``open_turns`` row (made and removed by the triggers), which its start fills in; the
# turns cleared to run (JOURNAL-GATE) are runs of seqs in ``cleared``. A turn's state is derived: ``ended``
# (an ``ends`` row), ``running`` (started), ``dispatched`` (in a cleared run), else ``queued``.
# Schema 1 kept one row per turn and rewrote it at every step (three updates of a row and of four
# indexes per turn): twice the writer's work.
TABLES = """
CREATE TABLE IF NOT EXISTS turns (
    seq INTEGER PRIMARY KEY,           -- given by the daemon: acceptance order
    turn_id TEXT NOT NULL UNIQUE,
    agent TEXT NOT NULL,
    input BLOB NOT NULL,
    session TEXT,
    parent TEXT,
    timeout REAL,
    grace REAL,
    kill_after REAL,
    retry INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 1,  -- rewritten only when recovery queues a turn again
    accepted_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS turns_by_session ON turns(session) WHERE session IS NOT NULL;
CREATE TABLE IF NOT EXISTS open_turns (  -- accepted, not ended; started_at and worker_pid once running
    seq INTEGER PRIMARY KEY,
    started_at REAL,
    worker_pid INTEGER
);
CREATE TABLE IF NOT EXISTS cleared (     -- JOURNAL-GATE: turns seq lo..hi (inclusive) may run
    lo INTEGER NOT NULL,
    hi INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS ends (
    seq INTEGER PRIMARY KEY,
    started_at REAL,
    worker_pid INTEGER,
    ended_at REAL NOT NULL,
    outcome TEXT NOT NULL,
    cause TEXT,
    error_type TEXT,
    error_message TEXT,
    result BLOB                        -- the TurnResult as the client saw it (msgpack)
);
CREATE INDEX IF NOT EXISTS ends_by_time ON ends(ended_at);
CREATE TABLE IF NOT EXISTS health (   -- one row the writer rewrites to learn that a failed disk is back
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    turn_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (turn_id, seq)
);
"""

TRIGGERS = """
CREATE TRIGGER IF NOT EXISTS turn_opens AFTER INSERT ON turns
BEGIN
    INSERT INTO open_turns (seq) VALUES (NEW.seq);
END;
CREATE TRIGGER IF NOT EXISTS turn_closes AFTER INSERT ON ends
BEGIN
    DELETE FROM open_turns WHERE seq = NEW.seq;
END;
-- Recovery queues a turn that may have run again (retry=True): it is no longer started, and no
-- longer cleared (every other turn of its run is decided by the same recovery: ended or queued
-- again), so a second crash before it runs sees it as never started.
CREATE TRIGGER IF NOT EXISTS turn_queued_again AFTER UPDATE OF attempts ON turns
BEGIN
    UPDATE open_turns SET started_at = NULL, worker_pid = NULL WHERE seq = NEW.seq;
    DELETE FROM cleared WHERE lo <= NEW.seq AND NEW.seq <= hi;
END;
"""

# LOOP-STEP-DURABLE: the ``steps`` table (``steps.py``) is made at open too, but is not one JOURNAL-REFUSE-BAD
# requires: a journal from before it gets it, empty.
SCHEMA = TABLES + TRIGGERS + STEPS_SCHEMA
# JOURNAL-REFUSE-BAD: the tables every journal of a schema has (a schema-1 file had ``turns`` and ``events``
# from its first version; ``health`` came later).
REQUIRED = frozenset(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", TABLES))
REQUIRED_V1 = frozenset({"turns", "events"})

# Schema 1 -> 2, in the writer's first transaction on a schema-1 file (JOURNAL-REFUSE-BAD's checks passed
# first).
MIGRATE_FROM_1 = (
    """
ALTER TABLE turns RENAME TO turns_v1;
DROP INDEX IF EXISTS turns_state;
DROP INDEX IF EXISTS turns_session;
DROP INDEX IF EXISTS turns_ended;
"""
    + TABLES
    + """
INSERT INTO turns (seq, turn_id, agent, input, session, parent, timeout, grace, kill_after, retry,
                   attempts, accepted_at)
    SELECT seq, turn_id, agent, input, session, parent, timeout, grace, kill_after, retry, attempts,
           accepted_at FROM turns_v1;
INSERT INTO ends (seq, started_at, worker_pid, ended_at, outcome, cause, error_type, error_message, result)
    SELECT seq, started_at, worker_pid, COALESCE(ended_at, accepted_at), COALESCE(outcome, 'crashed'),
           cause, error_type, error_message, result FROM turns_v1 WHERE state = 'ended';
INSERT INTO open_turns (seq, started_at, worker_pid)
    SELECT seq, CASE WHEN state = 'running' THEN started_at END,
           CASE WHEN state = 'running' THEN worker_pid END FROM turns_v1 WHERE state != 'ended';
INSERT INTO cleared (lo, hi) SELECT seq, seq FROM turns_v1 WHERE state IN ('dispatched', 'running');
DROP TABLE turns_v1;
"""
    + TRIGGERS
)

# The state of a turn row ``t`` (with ``e`` its ``ends`` row and ``o`` its ``open_turns`` row,
# both LEFT JOINed), as schema 1 stored it.
STATE = (
    "CASE WHEN e.seq IS NOT NULL THEN 'ended' WHEN o.started_at IS NOT NULL THEN 'running'"
    " WHEN EXISTS (SELECT 1 FROM cleared c WHERE c.lo <= t.seq AND t.seq <= c.hi) THEN 'dispatched'"
    " ELSE 'queued' END"
)
JOINED = "turns t LEFT JOIN ends e ON e.seq = t.seq LEFT JOIN open_turns o ON o.seq = t.seq"


class JournalError(TurnpoolError):
    """Raised by ``Journal.open`` (and ``turnpool serve --journal``) when the journal file is corrupt,
    damaged (a table gone), from a newer version, not a turnpool journal, locked by another live
    daemon, or in a directory other users can read or write."""


class JournalLocked(JournalError, DaemonAlreadyRunning):
    """The journal is held by another live daemon (JOURNAL-ONE-DAEMON): a ``JournalError`` and a
    ``DaemonAlreadyRunning``."""


# JOURNAL-REFUSE-BAD: a bad journal is refused untouched (read-only checks).
def check_existing(path: Path) -> None:
    """Validate an existing file read-only, so a bad file is refused without being touched."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise JournalError(f"journal {path} cannot be opened: {exc}") from None
    try:
        app_id = con.execute("PRAGMA application_id").fetchone()[0]
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if app_id != APP_ID and tables:
            raise JournalError(f"{path} is an SQLite file but not a turnpool journal")
        if app_id == APP_ID:
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise JournalError(
                    f"journal {path} has schema version {version}, newer than this turnpool's "
                    f"{SCHEMA_VERSION}: upgrade turnpool or use another journal"
                )
            check = con.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise JournalError(f"journal {path} is corrupt: {check}")
            # JOURNAL-REFUSE-BAD: a table gone from a journal is damage, not a fresh start: the writer's
            # ``CREATE TABLE IF NOT EXISTS`` would make it again, empty, and its turns would be lost.
            missing = sorted((REQUIRED_V1 if version == 1 else REQUIRED) - tables)
            if missing:
                raise JournalError(
                    f"journal {path} is damaged: its table{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(missing)} {'are' if len(missing) > 1 else 'is'} missing; restore it from "
                    "a backup, or move it aside to start an empty journal"
                )
    except sqlite3.DatabaseError as exc:
        raise JournalError(f"journal {path} is corrupt or not an SQLite file: {exc}") from None
    finally:
        con.close()


# SEC-JOURNAL: the journal is private.
def check_private_dir(directory: Path) -> None:
    """Refuse a journal directory that other users can read or write: the journal holds every
    turn's input and output."""
    st = directory.stat()
    if st.st_mode & 0o077:
        raise JournalError(
            f"journal directory {directory} is readable or writable by other users (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): use a private directory (chmod 700 {directory})"
        )


def state_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "turnpool"


def default_journal_path(endpoint: str | None = None) -> Path:
    """The journal of the daemon serving ``endpoint`` (default: the default endpoint).

    One daemon serves one endpoint, so each endpoint has its own journal file in the per-user
    state directory; a daemon restarted on the same endpoint finds its journal again.
    """
    import hashlib

    from .._paths import default_endpoint

    key = hashlib.sha256((endpoint or default_endpoint()).encode()).hexdigest()[:16]
    return state_dir() / f"journal-{key}.sqlite3"
