"""The daemon's durable journal: SQLite in WAL mode, through the standard library.

What it records is the RFC's coarse durable record: each turn's acceptance (agent, input,
session, limits, parent), its start (worker pid) and its end (outcome, output or error type
and message, cause as the closed enum). No stack, no signal, no runtime object, no free text
about the cancel.

Writes are batched (``writer_link.py``): a writer thread — or, once the daemon calls ``attach``,
the daemon's event loop (JOURNAL-DIRECT) — drains everything queued and hands it, as one transaction, to
the writer process (``writer``: the only owner of a writing
connection, so a stalled disk can hold that process but never the daemon's exit), and only
then resolves the waiters. A submit is acknowledged once its row is committed; a thousand
concurrent submits cost one commit, not a thousand. A turn's "dispatched" row (JOURNAL-GATE) is
committed before any worker gets the turn.

One live daemon per journal (JOURNAL-ONE-DAEMON, ``lock.py``): an OFD lock on the journal file itself
(whatever namespace, link or mount reaches it) and an abstract unix socket named from its real path
(nothing on disk, so deleting files cannot free it), both held for the daemon's lifetime.
A corrupt file, a file from a newer schema, or a locked journal is refused at open with a clear
error, and the file is left untouched.

Write failures (JOURNAL-UNAVAILABLE): when a batch cannot be committed (disk full, read-only, I/O error) the
writer rolls it back, fails the accept rows of that batch (their submits get
``JournalUnavailable``; their turns never ran, the dispatch gate held them), keeps every other
row and retries every ``retry_interval`` seconds until the disk takes them; ``error`` says what
is wrong meanwhile. A journal file deleted or replaced under the daemon (its inode no longer at
the path) is permanent: nothing more is written and ``error`` stays set.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from wire import TurnResult

from . import writer as _journal_writer
from .lock import lock_file, lock_name, lock_socket
from .reader import (
    RecoveredTurn,
    decode_result,
    lookup,
    lookup_on,
    open_reader,
    read_history,
    read_result,
    unfinished,
)
from .schema import (
    APP_ID,
    MIGRATE_FROM_1,
    SCHEMA,
    SCHEMA_VERSION,
    JournalError,
    check_existing,
    check_private_dir,
    default_journal_path,
    state_dir,
)
from .writer_link import (
    _ACCEPT,
    _DISPATCHED,
    _ENDED_BY_ID,
    _REQUEUED,
    _REQUEUED_BY_ID,
    _STARTED_BY_ID,
    JournalLink,
    Rows,
    runs,
)

# JOURNAL-DURABILITY: durability is chosen, and said.
DURABILITY = {"normal": "NORMAL", "full": "FULL"}
"""``--durability``: SQLite's ``synchronous`` setting (see docs/guarantees.md for what each promises)."""
# JOURNAL-KEEP-NEWEST: the default retention, by count: the newest 100,000 ended turns (≈ 40 MB of journal at
# ≈ 400 bytes a turn) are kept, older ones deleted at the writer's next pass (every minute).
KEEP_TURNS = 100_000


log = logging.getLogger("turnpool.journal")

_encode = msgspec.msgpack.Encoder().encode


_START_TIMEOUT = 30.0  # seconds the writer process has to open the database
UPGRADE_TURNS_PER_S = 13_000.0  # JOURNAL-APPEND: the slowest upgrade waited for (≈ 260,000 turns/s measured)


def _ignore_failure(why: str, conflict: bool) -> None:
    """An accept row nobody waits on (a child turn's): the supervisor's hook handles it."""


def _last_seq(path: Path) -> int:
    """The highest seq the journal file has used (JOURNAL-APPEND: the daemon gives each accepted turn
    the next one; a seq in a cleared run is never given again)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = con.execute(
            "SELECT MAX(COALESCE((SELECT MAX(seq) FROM turns), 0),"
            " COALESCE((SELECT MAX(hi) FROM cleared), 0), COALESCE((SELECT MAX(seq) FROM ends), 0))"
        ).fetchone()
    finally:
        con.close()
    return int(row[0])


class Journal(JournalLink):
    """The durable record of every turn a daemon accepted. Thread-safe; writes are batched."""

    def __init__(
        self,
        path: Path,
        *,
        keep_days: float | None = None,
        keep_turns: int | None = KEEP_TURNS,
        events: bool = False,
        durability: str = "normal",
        retry_interval: float = 0.5,
    ) -> None:
        if durability not in DURABILITY:
            raise ValueError(f"durability must be 'normal' or 'full', got {durability!r}")
        self.path = Path(path)
        self.keep_days = keep_days
        if keep_turns is not None and (isinstance(keep_turns, bool) or not isinstance(keep_turns, int)):
            raise TypeError(f"keep_turns must be an int or None, got {keep_turns!r}")
        # JOURNAL-KEEP-NEWEST: 0 or None keeps every turn
        self.keep_turns = keep_turns if keep_turns else None
        self.journal_events = events
        self.durability = durability
        self.retry_interval = retry_interval
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # JOURNAL-HANDOFF: rows written during one pass of the event loop reach the writer thread as one item
        # (a put per row woke the thread per row, and the two fought over the GIL a row at a time).
        self._held = Rows()  # JOURNAL-GROUP: grouped per statement as they are written
        # JOURNAL-APPEND: every open turn this object accepted or recovered: turn id -> [seq, started_at,
        # worker_pid] (its end row carries its start). Guarded by ``_held_lock``.
        self._live: dict[str, list[Any]] = {}
        self._next_seq = 1
        self._held_lock = threading.Lock()
        self._scheduled = False  # a hand-over of the held rows is on its way (``_schedule``)
        # JOURNAL-CALLBACKS: when set, the ``on_commit`` callbacks of a committed batch are passed to it as
        # one list (the daemon runs them on its loop) instead of being called one by one in the writer thread.
        self.deliver: Callable[[list[Callable[[], None]]], None] | None = None
        self._thread: threading.Thread | None = None
        # JOURNAL-DIRECT: once ``attach`` is called the daemon's event loop talks to the writer process
        # itself (non-blocking socket, reader callback) and the writer thread is gone; on any
        # failure the journal goes back to the thread (``_detach``), which knows how to retry.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._pending: Rows | None = None  # rows handed over, not yet sent
        self._pending_waiters: list[Callable[[], None]] = []  # ``flush`` waiters behind them
        self._inflight: Rows | None = None  # the batch sent, its reply not read yet
        self._inflight_groups: list[Any] = []  # as it was sent (conflicts are indexes into it)
        self._inflight_waiters: list[Callable[[], None]] = []
        self._wbuf = b""  # what of the batch's frame the socket did not take yet
        self._lost = False  # JOURNAL-LOST-WRITER: the batch in flight lost its writer before its reply
        self._rbuf = bytearray()
        self._lock: socket.socket | None = None  # JOURNAL-ONE-DAEMON: the abstract lock socket
        self._lock_fd = -1  # JOURNAL-ONE-DAEMON: the journal file, OFD-locked
        self._sock: socket.socket | None = None  # to the writer process
        self._child: subprocess.Popen[bytes] | None = None
        self._reader: sqlite3.Connection | None = None  # for ``lookup``
        self._identity: tuple[int, int] = (0, 0)
        self.commits = 0
        self.rows_written = 0
        self.failures = 0  # batches that could not be committed
        self.fd_shortage = 0  # of those, the ones that met EMFILE/ENFILE here (WORKER-FD-RETRY)
        self.error: str | None = None  # what is wrong now (None: writing fine)
        self.broken = False  # the file was deleted or replaced: nothing more will be written
        # Called (in the writer thread) with the new ``error`` each time it changes.
        self.on_error_change: Callable[[str | None], None] | None = None

    # ---- opening -----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: Path | str,
        *,
        keep_days: float | None = None,
        keep_turns: int | None = KEEP_TURNS,
        events: bool = False,
        durability: str = "normal",
        retry_interval: float = 0.5,
    ) -> Journal:
        journal = cls(
            Path(path),
            keep_days=keep_days,
            keep_turns=keep_turns,
            events=events,
            durability=durability,
            retry_interval=retry_interval,
        )
        journal._open()
        return journal

    def _open(self) -> None:
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        check_private_dir(path.parent)
        # JOURNAL-ONE-DAEMON: the journal's two locks (``lock``), held for the daemon's life.
        self._lock = lock_socket(path)
        try:
            self._lock_fd = lock_file(path)
        except BaseException:
            self._release_lock()
            raise
        try:
            if path.exists() and path.stat().st_size > 0:
                check_existing(path)
            self._spawn()
            for side in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                if side.exists():
                    os.chmod(side, 0o600)  # made private by the writer's umask; files of old versions too
            st, locked = path.stat(), os.fstat(self._lock_fd)
            if (st.st_dev, st.st_ino) != (locked.st_dev, locked.st_ino):
                raise JournalError(f"journal {path} was replaced while it was being opened")
            self._identity = (st.st_dev, st.st_ino)
            self._next_seq = _last_seq(path) + 1
        except BaseException:
            self._stop_child(0)
            self._release_lock()
            raise
        self._thread = threading.Thread(target=self._writer, name="turnpool-journal", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        """Start the writer process (JOURNAL-UNAVAILABLE: see ``writer``) and open the database in it."""
        assert self._lock is not None and self._lock_fd >= 0
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            child = subprocess.Popen(
                [sys.executable, "-I", _journal_writer.__file__, str(theirs.fileno())],
                pass_fds=(theirs.fileno(), self._lock.fileno(), self._lock_fd),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self._sock, self._child = mine, child
        init = {
            "path": str(self.path),
            "synchronous": DURABILITY[self.durability],
            "keep_days": self.keep_days,
            "keep_turns": self.keep_turns,
            "schema": SCHEMA,  # idempotent: IF NOT EXISTS
            "migrate_from_1": MIGRATE_FROM_1,  # JOURNAL-APPEND: a schema-1 file is upgraded at open
            "app_id": APP_ID,
            "version": SCHEMA_VERSION,
        }
        mine.settimeout(_START_TIMEOUT)
        try:
            _journal_writer.send(mine, init)
            reply = _journal_writer.recv(mine)
            if reply is not None and reply[0] == "upgrading":
                # JOURNAL-APPEND: a schema-1 file is converted first, in one transaction; its time grows
                # with the file, so the bound does too (a twentieth of the rate measured here).
                log.warning(
                    "journal %s: upgrading %d turns to schema %d", self.path, reply[1], SCHEMA_VERSION
                )
                mine.settimeout(_START_TIMEOUT + reply[1] / UPGRADE_TURNS_PER_S)
                reply = _journal_writer.recv(mine)
        except OSError as exc:
            reply = (f"the journal writer did not start: {exc}", None)
        mine.settimeout(None)
        if reply is None or reply[0] is not None:
            self._stop_child(5)
            why = reply[0] if reply is not None else "the journal writer exited at start"
            raise JournalError(f"journal {self.path} cannot be opened: {why}")

    def _stop_child(self, timeout: float | None) -> bool:
        """End the writer process: the end of its socket, then (bounded) its exit."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        child, self._child = self._child, None
        if child is None:
            return True
        try:
            child.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False  # stuck on the disk: it dies with its parent-death signal once it wakes

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def close(self, timeout: float | None = None) -> bool:
        """Flush what is queued, stop the writer, close the file and release the lock.

        With ``timeout``, waits at most that long (a stalled or failing disk): returns ``False``
        if rows were left unwritten. A writer process stuck on the disk is left to die on its own
        (it cannot be stopped from outside while it is in the kernel); it keeps the lock until then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = True
        if self._loop is not None:
            self._detach(*self._take_pending(), pause=False)  # the loop is gone: the thread finishes
        if self._thread is not None:
            self.hand_over()
            self._queue.put(("stop", lambda: None))
            self._thread.join(timeout)
            if self._thread.is_alive():
                ok = False
            else:
                self._thread = None
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._stop_child(left):
            ok = False
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._release_lock()
        return ok and self.error is None

    # ---- writing -----------------------------------------------------------------------

    def write(
        self,
        sql: str,
        params: Any,
        on_commit: Callable[[], None] | None = None,
        on_fail: Callable[[str, bool], None] | None = None,
    ) -> None:
        """Queue one statement (``params`` a list of tuples: one statement per tuple); ``on_commit``
        runs (in the writer thread) once it is committed. A row with ``on_fail`` is an accept row:
        it is never retried; ``on_fail(why, conflict)`` runs instead of ``on_commit`` when its batch
        failed (``conflict``: the row was not inserted because the id was already there).

        On an event loop the row is held until the end of the loop's pass, then handed over with
        every other row of that pass (JOURNAL-HANDOFF); elsewhere it is handed over at once. Rows are grouped
        per statement as they are written (JOURNAL-GROUP, ``writer_link.Rows``)."""
        with self._held_lock:
            self._held.add(sql, params, on_commit, on_fail)
            first, self._scheduled = not self._scheduled, True
        if first:
            self._schedule()

    def _schedule(self) -> None:
        """The first row of a pass was held: hand the pass's rows over at its end (JOURNAL-HANDOFF). Once per
        pass: the daemon also hands rows over before each reply (``before_reply``), and a row
        written after that is taken by the next one or by this call at the end of the pass (a
        ``call_soon`` per reply cost more than the rows it handed over)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._scheduled_hand_over()
            return
        loop.call_soon(self._scheduled_hand_over)

    def _scheduled_hand_over(self) -> None:
        with self._held_lock:
            self._scheduled = False
        self.hand_over()

    def accepted(
        self,
        turn: Any,
        on_commit: Callable[[], None] | None = None,
        on_fail: Callable[[str, bool], None] | None = None,
    ) -> None:
        """Record an accepted turn (a ``TurnRecord``-like object with ``input`` as msgpack bytes).
        An id already in the journal is never silently kept (JOURNAL-LOOKUP): ``on_fail(why, True)``."""
        params = [
            0,  # the seq, given under the lock
            turn.id,
            turn.agent,
            bytes(turn.input),
            turn.session,
            turn.parent,
            turn.timeout,
            turn.grace,
            turn.kill_after,
            int(turn.retry),
            turn.attempts,
            time.time(),
        ]
        # JOURNAL-GROUP: straight into the batch's accept group (the per-row work of ``write``, inlined:
        # this runs once per submit).
        with self._held_lock:
            seq = params[0] = self._next_seq
            self._next_seq = seq + 1
            self._live[turn.id] = [seq, None, None]
            held = self._held
            held.size += 1
            group = held.accept
            group.params.append(params)
            group.commits.append(on_commit)
            group.fails.append(on_fail or _ignore_failure)
            first, self._scheduled = not self._scheduled, True
        if first:
            self._schedule()

    def _forget(self, accepts: list[Any]) -> None:
        # Kept, with no seq, until the turn's end (its withdrawal, right after): that end writes
        # nothing, not even by id (the id may be another turn's, JOURNAL-LOOKUP).
        with self._held_lock:
            live = self._live
            for p in accepts:
                entry = live.get(p[1])
                if entry is not None and entry[0] == p[0]:
                    entry[0] = None

    def _landed(self, groups: list[Any]) -> list[tuple[int, int]] | None:
        accepts = [
            (k, i, p[0]) for k, g in enumerate(groups) if g.sql is _ACCEPT for i, p in enumerate(g.params)
        ]
        if not accepts:
            return None
        try:
            con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5)
            try:
                absent = _journal_writer.missing(con, [a[2] for a in accepts])
            finally:
                con.close()
        except sqlite3.Error:
            return None  # cannot tell: refused, as any failed batch (the thread retries the rest)
        if len(absent) == len(accepts):
            return None
        log.warning("journal %s: the writer died after committing a batch; its acks stand", self.path)
        return [accepts[j][:2] for j in absent]

    def dispatched(self, turn_ids: list[str], on_commit: Callable[[], None]) -> None:
        """JOURNAL-GATE: record that these turns may now run (committed before any worker gets them): one
        ``cleared`` row per run of consecutive seqs (JOURNAL-APPEND)."""
        with self._held_lock:
            known = [e[0] for e in map(self._live.get, turn_ids) if e is not None and e[0] is not None]
        self.write(_DISPATCHED, runs(known), on_commit)

    def started(self, turn_id: str, worker_pid: int) -> None:
        now = time.time()
        with self._held_lock:
            entry = self._live.get(turn_id)
            if entry is None:
                self._held.add(_STARTED_BY_ID, (now, worker_pid, turn_id), None, None)
            elif entry[0] is None:
                return  # refused: not in the journal
            else:
                entry[1], entry[2] = now, worker_pid
                held = self._held
                held.size += 1
                held.started[entry[0]] = (now, worker_pid, entry[0])
            first, self._scheduled = not self._scheduled, True
        if first:
            self._schedule()

    def requeued(self, turn_id: str, attempts: int) -> None:
        """Recovery queues a turn that may have run again (``retry=True``): ``attempts`` + 1, no
        longer started nor cleared (the schema's trigger)."""
        with self._held_lock:
            entry = self._live.get(turn_id)
            if entry is not None:
                entry[1] = entry[2] = None
        if entry is not None and entry[0] is None:
            return  # refused: not in the journal
        if entry is None:
            self.write(_REQUEUED_BY_ID, (attempts, turn_id))
        else:
            self.write(_REQUEUED, (attempts, entry[0]))

    # JOURNAL-COARSE: the durable record is coarse: outcome, error type and message, cause kind.
    def ended(self, result: TurnResult) -> None:
        cause, error = result.cause, result.error
        ended_at = result.ended_at or time.time()
        outcome = result.outcome
        kind = cause.kind if cause else None
        etype = error.type if error else None
        emsg = error.message if error else None
        data = _encode(result)
        with self._held_lock:
            entry = self._live.pop(result.turn_id, None)
            held = self._held
            if entry is not None and entry[0] is None:
                return  # refused: not in the journal (and its id may be another turn's, JOURNAL-LOOKUP)
            if entry is None:
                params: tuple[Any, ...] = (result.worker_pid, ended_at, outcome, kind, etype, emsg, data)
                held.add(_ENDED_BY_ID, (*params, result.turn_id), None, None)
            else:
                held.size += 1
                held.add_ended((entry[1], entry[2], ended_at, outcome, kind, etype, emsg, data, entry[0]))
            first, self._scheduled = not self._scheduled, True
        if first:
            self._schedule()

    def event(self, turn_id: str, seq: int, data: bytes) -> None:
        if self.journal_events:
            self.write(
                "INSERT OR IGNORE INTO events (turn_id, seq, data) VALUES (?,?,?)", (turn_id, seq, data)
            )

    def compact(self) -> int:
        """Apply retention now on a connection of its own (chunked: the writer waits at most one
        chunk). Returns the number of turns removed."""
        if self.keep_days is None and self.keep_turns is None:
            return 0
        other = sqlite3.connect(self.path, isolation_level=None, timeout=5)
        try:
            return _journal_writer.compact(other, self.keep_days, self.keep_turns)
        finally:
            other.close()

    # ---- reading (any thread, own connection) ------------------------------------------

    def lookup(self, turn_id: str) -> tuple[str, bytes, TurnResult | None] | None:
        """``lookup`` on one read connection kept open (the daemon asks on its event loop, once per
        submit of an id it does not hold: opening a connection each time would cost more than the query)."""
        if self._reader is None:
            self._reader = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        return lookup_on(self._reader, turn_id)

    def recover(self) -> list[RecoveredTurn]:
        """Unfinished turns (queued or running when the daemon died), in acceptance order; from now
        on this journal writes their rows by seq."""
        turns = list(unfinished(self.path))
        with self._held_lock:
            for t in turns:
                self._live[t.turn_id] = [t.seq, t.started_at, t.worker_pid]
        return turns

    def recent_results(self, limit: int) -> list[TurnResult]:
        """The results of the ``limit`` most recently ended turns, oldest first."""
        con = open_reader(self.path)
        try:
            rows = con.execute(
                "SELECT result FROM ends WHERE result IS NOT NULL ORDER BY seq DESC LIMIT ?",
                (limit,),
            ).fetchall()
        finally:
            con.close()
        return [decode_result(r["result"]) for r in reversed(rows)]


__all__ = [
    "DURABILITY",
    "SCHEMA_VERSION",
    "Journal",
    "JournalError",
    "RecoveredTurn",
    "default_journal_path",
    "lock_name",
    "lookup",
    "read_history",
    "read_result",
    "state_dir",
]
