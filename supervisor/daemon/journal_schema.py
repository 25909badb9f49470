"""The journal file: its schema, how a file is recognised as a journal, and where it lives.

``SCHEMA`` is the one definition of the tables (``turns``: one row per accepted turn, its
acceptance, start and end; ``events``; ``health``: the row the writer rewrites to learn that a
failed disk is back). A file is a turnpool journal when its SQLite ``application_id`` is
``APP_ID``; ``check_existing`` refuses, read-only and without touching the file, a corrupt file, a
file from a newer schema or another application's database. ``check_private_dir`` refuses a
directory other users can read or write (the journal holds every turn's input and output).
``Journal`` (``journal.py``) writes the file; ``journal_read.py`` reads it.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from .._errors import TurnpoolError

SCHEMA_VERSION = 1
APP_ID = 0x54504A31  # "TPJ1": marks a SQLite file as a turnpool journal

SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
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
    state TEXT NOT NULL,               -- queued | running | ended
    accepted_at REAL NOT NULL,
    started_at REAL,
    worker_pid INTEGER,
    ended_at REAL,
    outcome TEXT,
    cause TEXT,
    error_type TEXT,
    error_message TEXT,
    result BLOB                        -- the TurnResult as the client saw it (msgpack)
);
CREATE INDEX IF NOT EXISTS turns_state ON turns(state);
CREATE INDEX IF NOT EXISTS turns_session ON turns(session);
CREATE INDEX IF NOT EXISTS turns_ended ON turns(ended_at);
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


class JournalError(TurnpoolError):
    """Raised by ``Journal.open`` (and ``turnpool serve --journal``) when the journal file is corrupt,
    from a newer version, not a turnpool journal, locked by another live daemon, or in a directory
    other users can read or write."""


# J4: a bad journal is refused untouched (read-only checks).
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
    except sqlite3.DatabaseError as exc:
        raise JournalError(f"journal {path} is corrupt or not an SQLite file: {exc}") from None
    finally:
        con.close()


# J9: the journal is private.
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
