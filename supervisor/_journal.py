"""The daemon's durable journal: SQLite in WAL mode, through the standard library.

What it records is the RFC's coarse durable record: each turn's acceptance (agent, input,
session, limits, parent), its start (worker pid) and its end (outcome, output or error type
and message, cause as the closed enum). No stack, no signal, no runtime object, no free text
about the cancel.

Writes are batched: one writer thread owns the connection, drains everything queued, runs
it in one transaction and only then resolves the waiters. A submit is acknowledged once its
row is committed; a thousand concurrent submits cost one commit, not a thousand.

One live daemon per journal: an exclusive ``flock`` on ``PATH.lock`` is held for the
daemon's lifetime. A corrupt file, a file from a newer schema, or a locked journal is refused
at open with a clear error, and the file is left untouched.
"""

from __future__ import annotations

import fcntl
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from wire import TurnResult

from ._errors import TurnpoolError

SCHEMA_VERSION = 1
_APP_ID = 0x54504A31  # "TPJ1": marks a SQLite file as a turnpool journal

_SCHEMA = """
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
CREATE TABLE IF NOT EXISTS events (
    turn_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (turn_id, seq)
);
"""


class JournalError(TurnpoolError):
    """Raised by ``Journal.open`` (and ``turnpool serve --journal``) when the journal file is corrupt,
    from a newer version, not a turnpool journal, or locked by another live daemon."""


def state_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "turnpool"


def default_journal_path(endpoint: str | None = None) -> Path:
    """The journal of the daemon serving ``endpoint`` (default: the default endpoint).

    One daemon serves one endpoint, so each endpoint has its own journal file in the per-user
    state directory; a daemon restarted on the same endpoint finds its journal again.
    """
    import hashlib

    from ._paths import default_endpoint

    key = hashlib.sha256((endpoint or default_endpoint()).encode()).hexdigest()[:16]
    return state_dir() / f"journal-{key}.sqlite3"


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


_encode = msgspec.msgpack.Encoder().encode
_decode_result = msgspec.msgpack.Decoder(TurnResult).decode


def _check_existing(path: Path) -> None:
    """Validate an existing file read-only, so a bad file is refused without being touched."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise JournalError(f"journal {path} cannot be opened: {exc}") from None
    try:
        app_id = con.execute("PRAGMA application_id").fetchone()[0]
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if app_id != _APP_ID and tables:
            raise JournalError(f"{path} is an SQLite file but not a turnpool journal")
        if app_id == _APP_ID:
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


class Journal:
    """The durable record of every turn a daemon accepted. Thread-safe; writes are batched."""

    def __init__(self, path: Path, *, keep_days: float | None = None, events: bool = False) -> None:
        self.path = Path(path)
        self.keep_days = keep_days
        self.journal_events = events
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock_fd = -1
        self._con: sqlite3.Connection | None = None
        self.commits = 0
        self.rows_written = 0

    # ---- opening -----------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str, *, keep_days: float | None = None, events: bool = False) -> Journal:
        journal = cls(Path(path), keep_days=keep_days, events=events)
        journal._open()
        return journal

    def _open(self) -> None:
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock_path = path.with_name(path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            finally:
                os.close(fd)
            raise JournalError(f"journal {path} is locked by another live daemon (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd
        try:
            if path.exists() and path.stat().st_size > 0:
                _check_existing(path)
            con = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
            con.execute("PRAGMA busy_timeout=5000")
            con.executescript(_SCHEMA)
            con.execute(f"PRAGMA application_id={_APP_ID}")
            con.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            os.chmod(path, 0o600)
        except BaseException:
            self._release_lock()
            raise
        self._con = con
        self._thread = threading.Thread(target=self._writer, name="turnpool-journal", daemon=True)
        self._thread.start()

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def close(self) -> None:
        """Flush what is queued, stop the writer, close the file and release the lock."""
        if self._thread is not None:
            done = threading.Event()
            self._queue.put(("stop", done.set))
            self._thread.join()
            self._thread = None
        if self._con is not None:
            self._con.close()
            self._con = None
        self._release_lock()

    # ---- writing -----------------------------------------------------------------------

    def write(self, sql: str, params: tuple[Any, ...], on_commit: Callable[[], None] | None = None) -> None:
        """Queue one statement; ``on_commit`` runs (in the writer thread) once it is committed."""
        self._queue.put((sql, params, on_commit))

    def accepted(self, turn: Any, on_commit: Callable[[], None] | None = None) -> None:
        """Record an accepted turn (a ``TurnRecord``-like object with ``input`` as msgpack bytes)."""
        self.write(
            "INSERT OR IGNORE INTO turns (turn_id, agent, input, session, parent, timeout, grace, kill_after,"
            " retry, attempts, state, accepted_at) VALUES (?,?,?,?,?,?,?,?,?,?, 'queued', ?)",
            (turn.id, turn.agent, bytes(turn.input), turn.session, turn.parent, turn.timeout, turn.grace,
             turn.kill_after, int(turn.retry), turn.attempts, time.time()),
            on_commit,
        )

    def started(self, turn_id: str, worker_pid: int) -> None:
        self.write("UPDATE turns SET state='running', started_at=?, worker_pid=? WHERE turn_id=?",
                   (time.time(), worker_pid, turn_id))

    def requeued(self, turn_id: str, attempts: int) -> None:
        self.write("UPDATE turns SET state='queued', attempts=?, started_at=NULL, worker_pid=NULL WHERE turn_id=?",
                   (attempts, turn_id))

    def ended(self, result: TurnResult) -> None:
        self.write(
            "UPDATE turns SET state='ended', ended_at=?, outcome=?, cause=?, error_type=?, error_message=?,"
            " result=? WHERE turn_id=?",
            (result.ended_at or time.time(), result.outcome, result.cause.kind if result.cause else None,
             result.error.type if result.error else None, result.error.message if result.error else None,
             _encode(result), result.turn_id),
        )

    def event(self, turn_id: str, seq: int, data: bytes) -> None:
        if self.journal_events:
            self.write("INSERT OR IGNORE INTO events (turn_id, seq, data) VALUES (?,?,?)", (turn_id, seq, data))

    def flush(self) -> None:
        """Block until everything queued so far is committed."""
        done = threading.Event()
        self._queue.put(("sync", done.set))
        done.wait()

    def _writer(self) -> None:
        con = self._con
        assert con is not None
        last_compaction = time.monotonic()  # first periodic pass one interval after start
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            callbacks: list[Callable[[], None]] = []
            stop = False
            con.execute("BEGIN")
            try:
                for item in batch:
                    if item[0] == "stop":
                        stop = True
                        callbacks.append(item[1])
                        continue
                    if item[0] == "sync":
                        callbacks.append(item[1])
                        continue
                    sql, params, on_commit = item
                    con.execute(sql, params)
                    self.rows_written += 1
                    if on_commit is not None:
                        callbacks.append(on_commit)
                con.execute("COMMIT")
                self.commits += 1
            except sqlite3.Error:
                con.execute("ROLLBACK")
                raise
            for cb in callbacks:
                cb()
            if stop:
                return
            now = time.monotonic()
            if self.keep_days is not None and now - last_compaction > 60:
                last_compaction = now
                self._compact(con)

    def _compact(self, con: sqlite3.Connection) -> int:
        """Delete ended turns older than ``keep_days``, in small chunks (runs in the writer thread,
        so serving never waits on it beyond one chunk)."""
        assert self.keep_days is not None
        cutoff = time.time() - self.keep_days * 86400
        removed = 0
        while True:
            cur = con.execute(
                "DELETE FROM turns WHERE seq IN (SELECT seq FROM turns WHERE state='ended' AND ended_at < ? LIMIT 500)",
                (cutoff,),
            )
            removed += cur.rowcount
            if cur.rowcount < 500:
                break
        con.execute("DELETE FROM events WHERE turn_id NOT IN (SELECT turn_id FROM turns)")
        return removed

    def compact(self) -> int:
        """Apply retention now on a connection of its own (chunked: the writer waits at most one
        chunk). Returns the number of turns removed."""
        if self.keep_days is None:
            return 0
        other = sqlite3.connect(self.path, isolation_level=None, timeout=5)
        try:
            return self._compact(other)
        finally:
            other.close()

    # ---- reading (any thread, own connection) ------------------------------------------

    def recover(self) -> list[RecoveredTurn]:
        """Unfinished turns (queued or running when the daemon died), in acceptance order."""
        return list(_unfinished(self.path))

    def recent_results(self, limit: int) -> list[TurnResult]:
        """The results of the ``limit`` most recently ended turns, oldest first."""
        con = _reader(self.path)
        try:
            rows = con.execute(
                "SELECT result FROM turns WHERE state='ended' AND result IS NOT NULL ORDER BY seq DESC LIMIT ?",
                (limit,),
            ).fetchall()
        finally:
            con.close()
        return [_decode_result(r["result"]) for r in reversed(rows)]


def _reader(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise JournalError(f"no journal at {path}")
    _check_existing(path)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    return con


def _unfinished(path: Path) -> Iterator[RecoveredTurn]:
    con = _reader(path)
    try:
        for r in con.execute("SELECT * FROM turns WHERE state != 'ended' ORDER BY seq"):
            yield RecoveredTurn(r["turn_id"], r["agent"], r["input"], r["session"], r["parent"], r["timeout"],
                                r["grace"], r["kill_after"], bool(r["retry"]), r["attempts"], r["state"])
    finally:
        con.close()


def read_result(path: Path | str, turn_id: str) -> TurnResult | None:
    """The recorded result of one turn (exactly what the client saw), or None if it has not ended."""
    con = _reader(Path(path))
    try:
        row = con.execute("SELECT state, result FROM turns WHERE turn_id=?", (turn_id,)).fetchone()
    finally:
        con.close()
    if row is None:
        from ._errors import UnknownTurn

        raise UnknownTurn(turn_id)
    return _decode_result(row["result"]) if row["result"] is not None else None


def read_history(
    path: Path | str,
    *,
    session: str | None = None,
    outcome: str | None = None,
    since: float | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Turns newest first, filtered; each a dict of the journal's columns (input left out)."""
    clauses, params = [], []
    if session is not None:
        clauses.append("session = ?")
        params.append(session)
    if outcome is not None:
        clauses.append("outcome = ?")
        params.append(outcome)
    if since is not None:
        clauses.append("accepted_at >= ?")
        params.append(since)
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    con = _reader(Path(path))
    try:
        rows = con.execute(
            "SELECT turn_id, agent, session, parent, state, attempts, accepted_at, started_at, ended_at,"
            f" worker_pid, outcome, cause, error_type, error_message FROM turns {where} ORDER BY seq DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
    finally:
        con.close()
    return [dict(r) for r in rows]
