"""How the journal's rows reach its writer process, and how the answers come back.

Two paths, one at a time (``JournalLink``, mixed into ``Journal``): the **writer thread**, which
takes batches from a queue, sends each to the writer process and blocks for the reply (any
caller; the failure path: retries every ``retry_interval``, respawns a dead writer, notices a
replaced file); and, once the daemon calls ``attach``, the **event loop** itself (J-LOOP): one
batch in flight over a non-blocking socket, the reply read in a reader callback, what is handed
over meanwhile sent as the next batch. Any failure on the loop hands everything back to a thread.
A turn's "running" and "ended" rows in one batch go as one statement (J-ROWS, ``merge_rows``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import journal_writer as _journal_writer
from .journal_schema import JournalError

log = logging.getLogger("turnpool.journal")

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


class JournalLink:
    """The transport half of ``Journal`` (see the module's docstring). ``Journal`` sets every
    attribute below in its ``__init__`` and provides ``_spawn`` and ``_stop_child``."""

    path: Path
    retry_interval: float
    deliver: Callable[[list[Callable[[], None]]], None] | None
    on_error_change: Callable[[str | None], None] | None
    commits: int
    rows_written: int
    failures: int
    error: str | None
    broken: bool
    _queue: queue.SimpleQueue[Any]
    _held: list[Any]
    _held_lock: threading.Lock
    _thread: threading.Thread | None
    _loop: asyncio.AbstractEventLoop | None
    _loop_thread: int
    _pending: list[Any]
    _pending_waiters: list[Callable[[], None]]
    _inflight: list[Any] | None
    _inflight_waiters: list[Callable[[], None]]
    _wbuf: bytes
    _rbuf: bytearray
    _sock: socket.socket | None
    _child: subprocess.Popen[bytes] | None
    _identity: tuple[int, int]

    def _spawn(self) -> None:
        raise NotImplementedError

    def _stop_child(self, timeout: float | None) -> bool:
        raise NotImplementedError

    def hand_over(self) -> None:
        """Give the writer every row held so far, in order: the writer thread as one item, or
        (J-LOOP) the writer process at once when no commit is in flight, else with the next batch."""
        loop = self._loop
        if loop is not None and threading.get_ident() != self._loop_thread:
            try:
                loop.call_soon_threadsafe(self.hand_over)
            except RuntimeError:
                pass  # the loop is closed: ``close`` hands the rows to the thread
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
        if sock is None:
            return
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if self._inflight is None:
            # Nothing asked: the writer's end of the socket closed (it died while idle). Left
            # readable, it would call this callback on every pass of the loop: the thread takes
            # over now and starts a new writer with the next batch.
            self._detach(self._take_pending(), pause=False)
            return
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
