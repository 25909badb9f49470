"""The daemon's durable journal: SQLite in WAL mode, through the standard library.

What it records is the RFC's coarse durable record: each turn's acceptance (agent, input,
session, limits, parent), its start (worker pid) and its end (outcome, output or error type
and message, cause as the closed enum). No stack, no signal, no runtime object, no free text
about the cancel.

Writes are batched: one writer thread drains everything queued and hands it, as one
transaction, to the writer process (``_journal_writer``: the only owner of a writing
connection, so a stalled disk can hold that process but never the daemon's exit), and only
then resolves the waiters. A submit is acknowledged once its row is committed; a thousand
concurrent submits cost one commit, not a thousand. A turn's "dispatched" row (J6) is
committed before any worker gets the turn.

One live daemon per journal: a Linux abstract-namespace unix socket named from the journal's
real path is bound for the daemon's lifetime (nothing on disk, so deleting files cannot free it).
A corrupt file, a file from a newer schema, or a locked journal is refused at open with a clear
error, and the file is left untouched.

Write failures (J7): when a batch cannot be committed (disk full, read-only, I/O error) the
writer rolls it back, fails the accept rows of that batch (their submits get
``JournalUnavailable``; their turns never ran, the dispatch gate held them), keeps every other
row and retries every ``retry_interval`` seconds until the disk takes them; ``error`` says what
is wrong meanwhile. A journal file deleted or replaced under the daemon (its inode no longer at
the path) is permanent: nothing more is written and ``error`` stays set.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
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

from . import journal_writer as _journal_writer
from .journal_read import (
    RecoveredTurn,
    decode_result,
    lookup,
    lookup_on,
    open_reader,
    read_history,
    read_result,
    unfinished,
)
from .journal_schema import (
    APP_ID,
    SCHEMA,
    SCHEMA_VERSION,
    JournalError,
    check_existing,
    check_private_dir,
    default_journal_path,
    state_dir,
)

# J10: durability is chosen, and said.
DURABILITY = {"normal": "NORMAL", "full": "FULL"}
"""``--durability``: SQLite's ``synchronous`` setting (see docs/guarantees.md for what each promises)."""


def lock_name(path: Path) -> bytes:
    """The abstract unix socket that stands for "a daemon owns this journal" (J7): named from
    the journal's real path, so it cannot be deleted from under the daemon like a lock file."""
    real = os.path.realpath(path)
    return b"\0turnpool-journal-" + hashlib.sha256(real.encode()).hexdigest()[:32].encode()


def _holder(path: Path) -> str:
    """The pid of the daemon holding ``path``'s lock (its socket's peer credentials), or ``?``."""
    import struct

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(lock_name(path))
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return str(struct.unpack("3i", creds)[0])
    except OSError:
        return "?"
    finally:
        probe.close()


log = logging.getLogger("turnpool.journal")

_encode = msgspec.msgpack.Encoder().encode


_START_TIMEOUT = 30.0  # seconds the writer process has to open the database

_PROBE = "INSERT OR REPLACE INTO health (id, at) VALUES (1, ?)"

_STARTED = "UPDATE turns SET state='running', started_at=?, worker_pid=? WHERE turn_id=?"
_REQUEUED = "UPDATE turns SET state='queued', attempts=?, started_at=NULL, worker_pid=NULL WHERE turn_id=?"
_ENDED = (
    "UPDATE turns SET state='ended', ended_at=?, outcome=?, cause=?, error_type=?, error_message=?,"
    " result=? WHERE turn_id=?"
)
_STARTED_ENDED = (
    "UPDATE turns SET state='ended', started_at=?, worker_pid=?, ended_at=?, outcome=?, cause=?,"
    " error_type=?, error_message=?, result=? WHERE turn_id=?"
)


def merge_rows(rows: list[Any]) -> list[Any]:
    """J-ROWS: a turn's "running" row and its "ended" row in one batch become one ``UPDATE`` (in
    the ended row's place): a trivial turn's start and end reach the daemon in one frame, and
    SQLite then finds and rewrites the row once, not twice. A "queued again" row of the turn in
    between keeps both. Rows with callbacks are never merged. ``rows`` itself is not changed."""
    running: dict[str, int] = {}
    out: list[Any] | None = None
    for i, row in enumerate(rows):
        sql = row[1]
        if sql is _STARTED:
            if row[3] is None:
                running[row[2][2]] = i
        elif sql is _ENDED:
            j = running.pop(row[2][6], None)
            if j is not None and row[3] is None:
                if out is None:
                    out = list(rows)
                start = rows[j][2]
                out[i] = ("row", _STARTED_ENDED, (start[0], start[1], *row[2]), None, None)
                out[j] = None
        elif sql is _REQUEUED:
            running.pop(row[2][1], None)
    return rows if out is None else [row for row in out if row is not None]


def _wire_rows(rows: list[Any]) -> list[tuple[str, Any, bool, bool]]:
    """What the writer process gets of each row: ``(sql, params, many, accept)``."""
    return [(r[1], r[2], type(r[2]) is list, r[4] is not None) for r in rows]


def _ignore_failure(why: str, conflict: bool) -> None:
    """An accept row nobody waits on (a child turn's): the supervisor's hook handles it."""


class Journal:
    """The durable record of every turn a daemon accepted. Thread-safe; writes are batched."""

    def __init__(
        self,
        path: Path,
        *,
        keep_days: float | None = None,
        events: bool = False,
        durability: str = "normal",
        retry_interval: float = 0.5,
    ) -> None:
        if durability not in DURABILITY:
            raise ValueError(f"durability must be 'normal' or 'full', got {durability!r}")
        self.path = Path(path)
        self.keep_days = keep_days
        self.journal_events = events
        self.durability = durability
        self.retry_interval = retry_interval
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # B2: rows written during one pass of the event loop reach the writer thread as one item
        # (a put per row woke the thread per row, and the two fought over the GIL a row at a time).
        self._held: list[Any] = []
        self._held_lock = threading.Lock()
        # B3: when set, the ``on_commit`` callbacks of a committed batch are passed to it as one list
        # (the daemon runs them on its loop) instead of being called one by one in the writer thread.
        self.deliver: Callable[[list[Callable[[], None]]], None] | None = None
        self._thread: threading.Thread | None = None
        # J-LOOP: once ``attach`` is called the daemon's event loop talks to the writer process
        # itself (non-blocking socket, reader callback) and the writer thread is gone; on any
        # failure the journal goes back to the thread (``_detach``), which knows how to retry.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._pending: list[Any] = []  # rows handed over, not yet sent
        self._pending_waiters: list[Callable[[], None]] = []  # ``flush`` waiters behind them
        self._inflight: list[Any] | None = None  # the batch sent, its reply not read yet
        self._inflight_waiters: list[Callable[[], None]] = []
        self._wbuf = b""  # what of the batch's frame the socket did not take yet
        self._rbuf = bytearray()
        self._lock: socket.socket | None = None
        self._sock: socket.socket | None = None  # to the writer process
        self._child: subprocess.Popen[bytes] | None = None
        self._reader: sqlite3.Connection | None = None  # for ``lookup``
        self._identity: tuple[int, int] = (0, 0)
        self.commits = 0
        self.rows_written = 0
        self.failures = 0  # batches that could not be committed
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
        events: bool = False,
        durability: str = "normal",
        retry_interval: float = 0.5,
    ) -> Journal:
        journal = cls(
            Path(path),
            keep_days=keep_days,
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
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            lock.bind(lock_name(path))
        except OSError as exc:
            lock.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            holder = _holder(path)
            raise JournalError(f"journal {path} is locked by another live daemon (pid {holder})") from None
        lock.listen(8)
        self._lock = lock
        try:
            if path.exists() and path.stat().st_size > 0:
                check_existing(path)
            self._spawn()
            for side in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                if side.exists():
                    os.chmod(side, 0o600)  # made private by the writer's umask; files of old versions too
            st = path.stat()
            self._identity = (st.st_dev, st.st_ino)
        except BaseException:
            self._stop_child(0)
            self._release_lock()
            raise
        self._thread = threading.Thread(target=self._writer, name="turnpool-journal", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        """Start the writer process (J7: see ``_journal_writer``) and open the database in it."""
        assert self._lock is not None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            child = subprocess.Popen(
                [sys.executable, "-I", _journal_writer.__file__, str(theirs.fileno())],
                pass_fds=(theirs.fileno(), self._lock.fileno()),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self._sock, self._child = mine, child
        init = {
            "path": str(self.path),
            "synchronous": DURABILITY[self.durability],
            "keep_days": self.keep_days,
            "schema": SCHEMA,  # idempotent: IF NOT EXISTS
            "app_id": APP_ID,
            "version": SCHEMA_VERSION,
        }
        mine.settimeout(_START_TIMEOUT)
        try:
            _journal_writer.send(mine, init)
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

    def close(self, timeout: float | None = None) -> bool:
        """Flush what is queued, stop the writer, close the file and release the lock.

        With ``timeout``, waits at most that long (a stalled or failing disk): returns ``False``
        if rows were left unwritten. A writer process stuck on the disk is left to die on its own
        (it cannot be stopped from outside while it is in the kernel); it keeps the lock until then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = True
        if self._loop is not None:
            self._detach(self._take_pending(), pause=False)  # the loop is gone: the thread finishes
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
        every other row of that pass (B2); elsewhere it is handed over at once."""
        item = ("row", sql, params, on_commit, on_fail)
        with self._held_lock:
            held = self._held
            held.append(item)
            if len(held) > 1:
                return  # a hand-over is already on its way
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.hand_over()
            return
        loop.call_soon(self.hand_over)

    def hand_over(self) -> None:
        """Give the writer every row held so far, in order: the writer thread as one item, or
        (J-LOOP) the writer process at once when no commit is in flight, else with the next batch."""
        loop = self._loop
        if loop is not None and threading.get_ident() != self._loop_thread:
            loop.call_soon_threadsafe(self.hand_over)
            return
        with self._held_lock:
            if not self._held:
                return
            rows, self._held = self._held, []
        if self._loop is None:
            self._queue.put(("rows", rows))
            return
        if self._pending:
            self._pending.extend(rows)
        else:
            self._pending = rows
        if self._inflight is None:
            self._send_pending()

    def accepted(
        self,
        turn: Any,
        on_commit: Callable[[], None] | None = None,
        on_fail: Callable[[str, bool], None] | None = None,
    ) -> None:
        """Record an accepted turn (a ``TurnRecord``-like object with ``input`` as msgpack bytes).
        An id already in the journal is never silently kept (J8): ``on_fail(why, True)``."""
        self.write(
            "INSERT INTO turns (turn_id, agent, input, session, parent, timeout, grace, kill_after,"
            " retry, attempts, state, accepted_at) VALUES (?,?,?,?,?,?,?,?,?,?, 'queued', ?)"
            " ON CONFLICT(turn_id) DO NOTHING",
            (
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
            ),
            on_commit,
            on_fail or _ignore_failure,
        )

    def dispatched(self, turn_ids: list[str], on_commit: Callable[[], None]) -> None:
        """J6: record that these turns may now run (committed before any worker gets them)."""
        self.write(
            "UPDATE turns SET state='dispatched' WHERE turn_id=? AND state='queued'",
            [(t,) for t in turn_ids],
            on_commit,
        )

    def started(self, turn_id: str, worker_pid: int) -> None:
        self.write(_STARTED, (time.time(), worker_pid, turn_id))

    def requeued(self, turn_id: str, attempts: int) -> None:
        self.write(_REQUEUED, (attempts, turn_id))

    # J2: the durable record is coarse: outcome, error type and message, cause kind.
    def ended(self, result: TurnResult) -> None:
        self.write(
            _ENDED,
            (
                result.ended_at or time.time(),
                result.outcome,
                result.cause.kind if result.cause else None,
                result.error.type if result.error else None,
                result.error.message if result.error else None,
                _encode(result),
                result.turn_id,
            ),
        )

    def event(self, turn_id: str, seq: int, data: bytes) -> None:
        if self.journal_events:
            self.write(
                "INSERT OR IGNORE INTO events (turn_id, seq, data) VALUES (?,?,?)", (turn_id, seq, data)
            )

    def flush(self) -> None:
        """Block until everything queued so far is committed. With the loop attached (J-LOOP) this
        must be called from another thread: the loop itself reads the commit's reply."""
        done = threading.Event()
        loop = self._loop
        if loop is not None:
            if threading.get_ident() == self._loop_thread:
                raise RuntimeError("Journal.flush() would block the event loop that commits the rows")
            loop.call_soon_threadsafe(self._sync_on_loop, done.set)
            done.wait()
            return
        self.hand_over()
        self._queue.put(("sync", done.set))
        done.wait()

    def _sync_on_loop(self, fn: Callable[[], None]) -> None:
        if self._loop is None:  # detached meanwhile: the thread answers it
            self.hand_over()
            self._queue.put(("sync", fn))
            return
        self.hand_over()
        if self._inflight is None and not self._pending:
            fn()
            return
        self._pending_waiters.append(fn)

    def _set_error(self, error: str | None) -> None:
        if error != self.error:
            self.error = error
            if error is not None:
                log.error("journal %s: %s", self.path, error)
            else:
                log.warning("journal %s: writing again", self.path)
            if self.on_error_change is not None:
                self.on_error_change(error)

    def _identity_lost(self) -> str | None:
        """Is the file we write still the one at the path? (J7: deleted or replaced is noticed.)"""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return f"the journal file {self.path} was deleted while the daemon was using it"
        except OSError as exc:
            return f"the journal file {self.path} cannot be checked: {exc}"
        if (st.st_dev, st.st_ino) != self._identity:
            return f"the journal file {self.path} was replaced while the daemon was using it"
        return None

    def _commit(self, rows: list[Any]) -> str | None:
        """Run ``rows`` in one transaction in the writer process; the error as text when it failed
        (then nothing of the batch was written)."""
        try:
            if self._child is None or self._child.poll() is not None:
                self._stop_child(0)
                self._spawn()
            assert self._sock is not None
            rows = merge_rows(rows)
            _journal_writer.send(self._sock, _wire_rows(rows))
            reply = _journal_writer.recv(self._sock)
        except (OSError, JournalError) as exc:
            reply = (str(exc), [])
        return self._finish(rows, reply)

    def _finish(self, rows: list[Any], reply: Any) -> str | None:
        """Act on the writer's reply to ``rows`` (``None``: it died): the callbacks of a commit, in
        order (B3: handed to ``deliver`` as one list), or the error as text."""
        if reply is None:
            self._stop_child(0)
            reply = ("the journal writer process died", [])
        error, conflicts = reply
        if error is not None:
            return f"cannot write the journal {self.path}: {error}"
        self.commits += 1
        self.rows_written += len(rows)
        deliver = self.deliver
        done = []
        if conflicts:
            conflicted = set(conflicts)
            for i, row in enumerate(rows):
                if i in conflicted:
                    row[4](f"turn id {row[2][0]!r} is already in the journal", True)
                elif row[3] is None:
                    continue
                elif deliver is not None:
                    done.append(row[3])
                else:
                    row[3]()  # in the writer thread, in order
            if done and deliver is not None:
                deliver(done)
            return None
        else:
            done = [row[3] for row in rows if row[3] is not None]
        if deliver is not None:
            if done:
                deliver(done)  # B3: the batch's callbacks, handed over at once
        else:
            for fn in done:
                fn()  # in the writer thread, in order
        return None

    def _fail(self, rows: list[Any], waiters: list[Any], why: str) -> list[Any]:
        """A batch could not be committed: refuse its accept rows (never acknowledged, never run),
        and return what is to be retried — its other rows, its waiters and a probe row that tells
        when the disk is back (nothing when the journal is broken: the waiters are released)."""
        self.failures += 1
        self._set_error(why)
        held = []
        for row in rows:
            if row[4] is not None:
                row[4](why, False)  # never acknowledged, never run: the submit is refused
            elif not self.broken:
                held.append(row)
        if self.broken:
            for item in waiters:
                item[1]()
            return []
        held.extend(waiters)
        held.append(("row", _PROBE, (time.time(),), None, None))  # tells when the disk is back
        return held

    def _writer(self, held: list[Any] | None = None, pause: bool = False, inflight: Any = None) -> None:
        try:
            self._write_loop(held or [], pause, inflight)
        except BaseException as exc:  # a bug must not leave submits waiting forever unanswered
            self.broken = True
            self._set_error(f"the journal writer failed: {type(exc).__name__}: {exc}")
            raise

    def _write_loop(self, held: list[Any], pause: bool, inflight: Any) -> None:
        """The writer thread: batches from the queue, one transaction each; a failed batch (rows
        and flush waiters) is retried in order every ``retry_interval``. Started by ``_detach``
        with what the loop left: ``held`` to retry (after a pause when it failed) or, at close,
        the batch in flight (``inflight``: its rows, unsent bytes and reply bytes read so far)."""
        if pause:
            time.sleep(self.retry_interval)
        while True:
            batch, held = held, []
            if not batch:
                batch.append(self._queue.get())
            if inflight is None:
                while True:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
            if any(item[0] == "rows" for item in batch):
                batch = [row for item in batch for row in (item[1] if item[0] == "rows" else (item,))]
            rows = [item for item in batch if item[0] == "row"]
            waiters = [item for item in batch if item[0] != "row"]
            stop = any(item[0] == "stop" for item in waiters)
            if inflight is not None:
                why = self._complete(rows, *inflight)
                inflight = None
            else:
                why = self.error if self.broken else self._identity_lost()
                if why is not None:
                    self.broken = True
                elif rows:
                    why = self._commit(rows)
            if why is None:
                self._set_error(None)
                for item in waiters:
                    item[1]()
                if stop:
                    return
                continue
            held = self._fail(rows, waiters, why)
            if self.broken:
                if stop:
                    return
                continue
            time.sleep(self.retry_interval)  # the disk is failing: try again later, not in a spin

    def _complete(self, rows: list[Any], unsent: bytes, got: bytes) -> str | None:
        """Finish, blocking, a batch the loop had sent when it detached (``close`` after the loop
        ended): send what the socket had not taken, read the reply."""
        sock = self._sock
        try:
            if sock is None:
                raise OSError("the journal writer is gone")
            if unsent:
                sock.sendall(unsent)
            reply = _journal_writer.recv_after(sock, got)
        except OSError as exc:
            reply = (str(exc), [])
        return self._finish(rows, reply)

    # ---- J-LOOP: the event loop talks to the writer process ----------------------------

    def attach(self) -> bool:
        """Take the writer thread out (J-LOOP): from now on the running event loop sends each batch
        to the writer process over a non-blocking socket and reads the reply in a reader callback,
        so a commit's callbacks run as soon as the loop sees the reply — no thread blocked in
        ``recv`` that must then win the GIL from the busy loop. One batch is in flight at a time;
        what is handed over meanwhile goes in the next one (group commit). Call on the loop, after
        recovery. Returns ``False`` (and keeps the thread) when the journal is failing now. A later
        failure hands everything back to the thread (``_detach``), which retries as before."""
        if self._loop is not None or self._thread is None:
            return self._loop is not None
        loop = asyncio.get_running_loop()
        self.flush()  # everything so far committed by the thread
        if self.error is not None or self.broken or self._sock is None:
            return False
        self._queue.put(("stop", lambda: None))
        self._thread.join()
        self._thread = None
        self._loop, self._loop_thread = loop, threading.get_ident()
        self._sock.setblocking(False)
        loop.add_reader(self._sock.fileno(), self._on_readable)
        return True

    def _take_pending(self) -> list[Any]:
        items = self._pending + [("sync", fn) for fn in self._pending_waiters]
        self._pending, self._pending_waiters = [], []
        return items

    def _send_pending(self) -> None:
        """Send every row handed over as one batch (on the loop; nothing is in flight)."""
        rows, waiters = self._pending, self._pending_waiters
        if not rows:
            if waiters:
                self._pending_waiters = []
                for fn in waiters:
                    fn()
            return
        self._pending, self._pending_waiters = [], []
        sock, child = self._sock, self._child
        if sock is None or child is None or child.poll() is not None or self._identity_lost() is not None:
            # Not the happy path: the thread respawns the writer or notices the broken file.
            self._detach(rows + [("sync", fn) for fn in waiters], pause=False)
            return
        rows = merge_rows(rows)
        frame = _journal_writer.frame(_wire_rows(rows))
        self._inflight, self._inflight_waiters = rows, waiters
        try:
            sent = sock.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._on_reply(None)  # the writer is gone
            return
        if sent < len(frame):
            self._wbuf = frame[sent:]
            assert self._loop is not None
            self._loop.add_writer(sock.fileno(), self._on_writable)

    def _on_writable(self) -> None:
        sock = self._sock
        assert sock is not None and self._loop is not None
        try:
            sent = sock.send(self._wbuf)
        except BlockingIOError:
            return
        except OSError:
            self._loop.remove_writer(sock.fileno())
            self._wbuf = b""
            self._on_reply(None)
            return
        self._wbuf = self._wbuf[sent:]
        if not self._wbuf:
            self._loop.remove_writer(sock.fileno())

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None or self._inflight is None:
            return
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._on_reply(None)
            return
        buf = self._rbuf
        buf += chunk
        reply = _journal_writer.parse(buf)
        if reply is not _journal_writer.INCOMPLETE:
            self._on_reply(reply)

    def _on_reply(self, reply: Any) -> None:
        rows, waiters = self._inflight, self._inflight_waiters
        assert rows is not None
        self._inflight, self._inflight_waiters = None, []
        if reply is None:
            self._unwatch()
        why = self._finish(rows, reply)
        if why is None:
            self._set_error(None)
            for fn in waiters:
                fn()
            if self._loop is not None and self._inflight is None:
                self._send_pending()
            return
        # A failed batch: as the thread does, then the thread takes over and retries.
        held = self._fail(rows, [("sync", fn) for fn in waiters], why)
        self._detach(held + self._take_pending(), pause=not self.broken)

    def _unwatch(self) -> None:
        loop, sock = self._loop, self._sock
        if loop is not None and sock is not None and not loop.is_closed():
            loop.remove_reader(sock.fileno())
            loop.remove_writer(sock.fileno())

    def _detach(self, items: list[Any], pause: bool) -> None:
        """Hand the journal back to a writer thread: ``items`` first (after a pause when they just
        failed), then what is handed over later; a batch still in flight is finished first."""
        if self._loop is None:
            return
        self._unwatch()
        self._loop = None
        inflight = None
        if self._inflight is not None:
            first = self._inflight + [("sync", fn) for fn in self._inflight_waiters]
            inflight = (self._wbuf, bytes(self._rbuf))
            self._inflight, self._inflight_waiters = None, []
            if items:
                self._queue.put(("rows", items))
            items = first
        self._wbuf, self._rbuf = b"", bytearray()
        if self._sock is not None:
            self._sock.setblocking(True)
        self._thread = threading.Thread(
            target=self._writer, args=(items, pause, inflight), name="turnpool-journal", daemon=True
        )
        self._thread.start()

    def compact(self) -> int:
        """Apply retention now on a connection of its own (chunked: the writer waits at most one
        chunk). Returns the number of turns removed."""
        if self.keep_days is None:
            return 0
        other = sqlite3.connect(self.path, isolation_level=None, timeout=5)
        try:
            return _journal_writer.compact(other, self.keep_days)
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
        """Unfinished turns (queued or running when the daemon died), in acceptance order."""
        return list(unfinished(self.path))

    def recent_results(self, limit: int) -> list[TurnResult]:
        """The results of the ``limit`` most recently ended turns, oldest first."""
        con = open_reader(self.path)
        try:
            rows = con.execute(
                "SELECT result FROM turns WHERE state='ended' AND result IS NOT NULL"
                " ORDER BY seq DESC LIMIT ?",
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
