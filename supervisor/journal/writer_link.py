"""How the journal's rows reach its writer process, and how the answers come back.

Two paths, one at a time (``JournalLink``, mixed into ``Journal``): the **writer thread**, which
takes batches from a queue, sends each to the writer process and blocks for the reply (any
caller; the failure path: retries every ``retry_interval``, respawns a dead writer, notices a
replaced file); and, once the daemon calls ``attach``, the **event loop** itself (JOURNAL-DIRECT): one
batch in flight over a non-blocking socket, the reply read in a reader callback, what is handed
over meanwhile sent as the next batch. Any failure on the loop hands everything back to a thread.
A turn's end carries its start: its "running" row in the same batch is dropped (JOURNAL-MERGE-ROWS).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
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

from .._fds import is_shortage
from . import writer as _journal_writer
from .schema import JournalError

log = logging.getLogger("turnpool.journal")

_PROBE = "INSERT OR REPLACE INTO health (id, at) VALUES (1, ?)"

# JOURNAL-APPEND (schema 2): rows are inserted, not rewritten, and name their turn by its ``seq`` (given
# by the daemon when it accepts the turn, ``Journal.accepted``). A turn's end carries its start
# (the journal keeps both in memory), so a trivial turn costs one accept row and one end row.
# The ``_BY_ID`` forms find a turn by its id: for a turn that this journal object neither accepted
# nor recovered (a test feeding a journal directly, say). A turn whose accept row was refused is
# forgotten before its refusal is delivered (``JournalLink._forget``), so no end is written for it.
_ACCEPT = (
    "INSERT INTO turns (seq, turn_id, agent, input, session, parent, timeout, grace, kill_after,"
    " retry, attempts, accepted_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(turn_id) DO NOTHING"
)
_REQUEUED = "UPDATE turns SET attempts=? WHERE seq=?"  # the trigger un-starts and un-clears it
_DISPATCHED = "INSERT INTO cleared (lo, hi) VALUES (?, ?)"
_STARTED = "UPDATE open_turns SET started_at=?, worker_pid=? WHERE seq=?"
_ENDED = (
    "INSERT OR IGNORE INTO ends (started_at, worker_pid, ended_at, outcome, cause, error_type,"
    " error_message, result, seq) VALUES (?,?,?,?,?,?,?,?,?)"
)
_REQUEUED_BY_ID = "UPDATE turns SET attempts=? WHERE turn_id=?"
_STARTED_BY_ID = (
    "UPDATE open_turns SET started_at=?, worker_pid=? WHERE seq=(SELECT seq FROM turns WHERE turn_id=?)"
)
_ENDED_BY_ID = (
    "INSERT OR IGNORE INTO ends (seq, started_at, worker_pid, ended_at, outcome, cause, error_type,"
    " error_message, result) SELECT t.seq, o.started_at, COALESCE(o.worker_pid, ?), ?, ?, ?, ?, ?, ?"
    " FROM turns t LEFT JOIN open_turns o ON o.seq = t.seq WHERE t.turn_id=?"
)


LOST: Any = object()
"""JOURNAL-LOST-WRITER: a batch was sent and its writer died before it replied; a writer thread finds out from
the file whether it was committed (``JournalLink._finish``)."""


def runs(seqs: list[int]) -> list[tuple[int, int]]:
    """``seqs`` as runs of consecutive numbers ``(lo, hi)``: one ``cleared`` row per run (JOURNAL-GATE)."""
    out: list[tuple[int, int]] = []
    for seq in sorted(seqs):
        if out and seq == out[-1][1] + 1:
            out[-1] = (out[-1][0], seq)
        else:
            out.append((seq, seq))
    return out


class Group:
    """The rows of one statement in a batch (JOURNAL-GROUP): their parameters in order and the callbacks
    to run once they are committed. For an accept group (rows that report a conflict instead of
    being retried, JOURNAL-LOOKUP) ``commits`` and ``fails`` hold one entry per row (``None``: nobody waits);
    for any other group ``commits`` holds only the callbacks given."""

    __slots__ = ("accept", "commits", "fails", "params", "sql")

    def __init__(self, sql: str, accept: bool) -> None:
        self.sql = sql
        self.accept = accept
        self.params: list[Any] = []
        self.commits: list[Any] = []
        self.fails: list[Any] = []


class Rows:
    """JOURNAL-GROUP: a batch of journal rows, grouped per statement as they are written, so that neither
    the daemon nor the writer process loops in Python over the rows of a batch: the writer runs one
    ``executemany`` per group. Groups run in the order a turn's rows must be applied — accept,
    queued again, dispatched, running, ended — then any other statement in the order first
    written: rows of one turn keep their order whichever turns they share a batch with, and rows
    of different turns never depended on each other's order.

    JOURNAL-MERGE-ROWS: an end carries its turn's start, so a turn's "running" row in the same batch as its
    end is dropped (kept by seq until its end comes): a trivial turn's start and end reach the
    daemon in one frame, and SQLite then writes one row for both. A "queued again" row supersedes
    a "running" row of the same turn still in the batch."""

    __slots__ = ("accept", "dispatched", "ended", "other", "requeued", "size", "started", "started_calls")

    def __init__(self) -> None:
        self.accept = Group(_ACCEPT, True)
        self.dispatched = Group(_DISPATCHED, False)
        self.requeued = Group(_REQUEUED, False)
        self.started: dict[int, Any] = {}  # seq -> the params of its "running" row
        self.started_calls: list[Any] = []
        self.ended = Group(_ENDED, False)
        self.other: dict[tuple[str, bool], Group] = {}
        self.size = 0  # writes added (a write of no rows counts: its callback must still run)

    def add(self, sql: str, params: Any, on_commit: Any, on_fail: Any) -> None:
        """Add one write: ``params`` a tuple (one row) or a list of tuples (one row each)."""
        self.size += 1
        many = params if type(params) is list else (params,)
        if on_fail is not None:
            group = self.accept if sql == _ACCEPT else self._other(sql, True)
            for p in many:
                group.params.append(p)
                group.commits.append(on_commit)
                group.fails.append(on_fail)
            return
        if sql == _STARTED:
            for p in many:
                self.started[p[2]] = p
            if on_commit is not None:
                self.started_calls.append(on_commit)
            return
        if sql == _ENDED:
            for p in many:
                self.add_ended(p)
            group = self.ended
        elif sql == _REQUEUED:
            for p in many:
                self.started.pop(p[1], None)
            group = self.requeued
            group.params.extend(many)
        else:
            group = self.dispatched if sql == _DISPATCHED else self._other(sql, False)
            group.params.extend(many)
        if on_commit is not None:
            group.commits.append(on_commit)

    def add_ended(self, p: Any) -> None:
        self.started.pop(p[-1], None)  # the end carries the start (JOURNAL-MERGE-ROWS)
        self.ended.params.append(p)

    def _other(self, sql: str, accept: bool) -> Group:
        group = self.other.get((sql, accept))
        if group is None:
            group = self.other[(sql, accept)] = Group(sql, accept)
        return group

    def groups(self) -> list[Group]:
        """The non-empty groups, in the order they run."""
        started = Group(_STARTED, False)
        started.params = list(self.started.values())
        started.commits = self.started_calls
        # "queued again" before "dispatched": recovery requeues a turn that may have run (which
        # takes it out of its cleared run), and its readmission can clear it again in the same batch.
        order = [self.accept, self.requeued, self.dispatched, started, self.ended]
        order.extend(self.other.values())
        return [g for g in order if g.params or g.commits]

    def extend(self, later: Rows) -> None:
        """Add the rows of a batch written after this one (the writer thread merges what it
        takes from its queue, and what is retried with what came meanwhile)."""
        self.size += later.size
        for mine, theirs in ((self.accept, later.accept), (self.dispatched, later.dispatched)):
            mine.params.extend(theirs.params)
            mine.commits.extend(theirs.commits)
            mine.fails.extend(theirs.fails)
        for p in later.requeued.params:
            self.started.pop(p[1], None)
        self.requeued.params.extend(later.requeued.params)
        self.requeued.commits.extend(later.requeued.commits)
        self.started.update(later.started)
        self.started_calls.extend(later.started_calls)
        for p in later.ended.params:
            self.add_ended(p)
        self.ended.commits.extend(later.ended.commits)
        for key, theirs in later.other.items():
            mine = self._other(*key)
            mine.params.extend(theirs.params)
            mine.commits.extend(theirs.commits)
            mine.fails.extend(theirs.fails)

    def refuse(self, why: str) -> None:
        """The batch failed: its accept rows are refused (never acknowledged, never run) and
        dropped; every other row stays, to be retried."""
        for group in [self.accept, *self.other.values()]:
            if group.accept:
                for fn in group.fails:
                    fn(why, False)
        self.accept = Group(_ACCEPT, True)
        self.other = {key: g for key, g in self.other.items() if not g.accept}

    def has_probe(self) -> bool:
        return (_PROBE, False) in self.other


def _callbacks(groups: list[Group], conflicts: list[Any]) -> list[Any]:
    """The commit callbacks of a committed batch, in order; an accept row that inserted nothing
    (``conflicts``: ``(group, row)`` indexes) is refused instead, in its place (JOURNAL-LOOKUP)."""
    done: list[Any] = []
    conflicted = set(map(tuple, conflicts)) if conflicts else None
    for k, group in enumerate(groups):
        if not group.accept:
            done.extend(group.commits)
        elif conflicted is None:
            done.extend([fn for fn in group.commits if fn is not None])
        else:
            for i, fn in enumerate(group.commits):
                if (k, i) in conflicted:  # refused in its place, in order
                    why = f"turn id {group.params[i][1]!r} is already in the journal"
                    done.append(functools.partial(group.fails[i], why, True))
                elif fn is not None:
                    done.append(fn)
    return done


def _wire(groups: list[Group]) -> list[tuple[str, list[Any], bool | str]]:
    """What the writer process gets: one ``(sql, rows, accept)`` per group; ``accept`` is ``"seq"``
    for the turns' accept rows, which lead with their seq (the writer finds a conflict by it)."""
    return [(g.sql, g.params, "seq" if g.sql is _ACCEPT else g.accept) for g in groups]


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
    # WORKER-FD-RETRY: commits that met EMFILE/ENFILE on this side (a writer respawned, a socket)
    fd_shortage: int
    error: str | None
    broken: bool
    _queue: queue.SimpleQueue[Any]
    _held: Rows
    _held_lock: threading.Lock
    _thread: threading.Thread | None
    _loop: asyncio.AbstractEventLoop | None
    _loop_thread: int
    _pending: Rows | None
    _pending_waiters: list[Callable[[], None]]
    _inflight: Rows | None
    _inflight_groups: list[Group]
    _inflight_waiters: list[Callable[[], None]]
    _wbuf: bytes
    _rbuf: bytearray
    _lost: bool
    _sock: socket.socket | None
    _child: subprocess.Popen[bytes] | None
    _identity: tuple[int, int]

    def _spawn(self) -> None:
        raise NotImplementedError

    def _forget(self, accepts: list[Any]) -> None:
        """JOURNAL-APPEND: these accept rows were refused: their turns are not in the journal (so no row
        of theirs is written by seq any more). ``Journal`` keeps the open turns."""

    def _landed(self, groups: list[Group]) -> list[tuple[int, int]] | None:
        """JOURNAL-LOST-WRITER: the writer died before it replied to ``groups``: if the file shows the batch
        was committed, its accept rows that inserted nothing (JOURNAL-LOOKUP), else ``None``. ``Journal``
        reads it."""
        return None

    def _stop_child(self, timeout: float | None) -> bool:
        raise NotImplementedError

    def hand_over(self) -> None:
        """Give the writer every row held so far, in order: the writer thread as one item, or
        (JOURNAL-DIRECT) the writer process at once when no commit is in flight, else with the next batch."""
        loop = self._loop
        if loop is not None:
            if threading.get_ident() != self._loop_thread:
                # The loop may be closed: then ``close`` hands the rows to the thread.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self.hand_over)
                return
            if self._inflight is not None:
                # JOURNAL-DIRECT: a commit is in flight; the rows held go as the next batch, taken when its
                # reply comes (``_on_reply``). Moving them aside at every reply the daemon sends
                # (``before_reply``) only cost a new batch object and a merge each time: on the
                # loop, held and handed over are the same memory until the batch is sent.
                return
        with self._held_lock:
            if not self._held.size:
                return
            rows, self._held = self._held, Rows()
        if self._loop is None:
            self._queue.put(("rows", rows))
            return
        if self._pending is not None:
            self._pending.extend(rows)
        else:
            self._pending = rows
        if self._inflight is None:
            self._send_pending()

    def flush(self) -> None:
        """Block until everything queued so far is committed. With the loop attached (JOURNAL-DIRECT) this
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
        if self._inflight is None and self._pending is None:
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
        """Is the file we write still the one at the path? (JOURNAL-UNAVAILABLE: deleted or replaced is
        noticed.)"""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return f"the journal file {self.path} was deleted while the daemon was using it"
        except OSError as exc:
            return f"the journal file {self.path} cannot be checked: {exc}"
        if (st.st_dev, st.st_ino) != self._identity:
            return f"the journal file {self.path} was replaced while the daemon was using it"
        return None

    def _commit(self, rows: Rows) -> str | None:
        """Run ``rows`` in one transaction in the writer process; the error as text when it failed
        (then nothing of the batch was written)."""
        groups = rows.groups()
        try:
            if self._child is None or self._child.poll() is not None:
                self._stop_child(0)
                self._spawn()
            assert self._sock is not None
            _journal_writer.send(self._sock, _wire(groups))
            reply = _journal_writer.recv(self._sock)
        except (OSError, JournalError) as exc:
            if is_shortage(exc):
                # WORKER-FD-RETRY: counted; the batch is retried as any failed one (JOURNAL-UNAVAILABLE)
                self.fd_shortage += 1
            reply = (str(exc), [])
        return self._finish(groups, reply)

    def _finish(self, groups: list[Group], reply: Any) -> str | None:
        """Act on the writer's reply to ``groups`` (``None``: it died): the callbacks of a commit,
        in order (JOURNAL-CALLBACKS: handed to ``deliver`` as one list), or the error as text."""
        if reply is None:
            self._stop_child(0)
            # JOURNAL-LOST-WRITER: it may have died after its commit, before its reply: a batch is all or
            # nothing, so its accept rows in the file say it was committed. Refusing them then
            # would tell a client "not recorded, never run" of a turn that the next daemon on this
            # journal runs. (A batch without accept rows is retried: every other row is idempotent.)
            landed = self._landed(groups)
            reply = ("the journal writer process died", []) if landed is None else (None, landed)
        error, conflicts = reply
        if error is not None:
            return f"cannot write the journal {self.path}: {error}"
        if conflicts:
            self._forget([groups[k].params[i] for k, i in conflicts])
        self.commits += 1
        self.rows_written += sum(len(g.params) for g in groups)
        done = _callbacks(groups, conflicts)
        if not done:
            return None
        deliver = self.deliver
        if deliver is not None:
            deliver(done)  # JOURNAL-CALLBACKS: the batch's callbacks, handed over at once
        else:
            for fn in done:
                fn()  # in the writer thread, in order
        return None

    def _fail(self, rows: Rows | None, waiters: list[Any], why: str) -> tuple[Rows | None, list[Any]]:
        """A batch could not be committed: refuse its accept rows (never acknowledged, never run),
        and return what is to be retried — its other rows with a probe row that tells when the
        disk is back, and its waiters (nothing when the journal is broken: the waiters are released)."""
        self.failures += 1
        self._set_error(why)
        if rows is not None:
            self._forget(rows.accept.params)
            rows.refuse(why)  # never acknowledged, never run: the submits are refused
        if self.broken:
            for item in waiters:
                item[1]()
            return None, []
        if rows is None:
            rows = Rows()
        if not rows.has_probe():
            rows.add(_PROBE, (time.time(),), None, None)  # tells when the disk is back
        return rows, waiters

    def _writer(
        self,
        rows: Rows | None = None,
        waiters: list[Any] | None = None,
        pause: bool = False,
        inflight: Any = None,
    ) -> None:
        try:
            self._write_loop(rows, waiters or [], pause, inflight)
        except BaseException as exc:  # a bug must not leave submits waiting forever unanswered
            self.broken = True
            self._set_error(f"the journal writer failed: {type(exc).__name__}: {exc}")
            raise

    def _write_loop(self, rows: Rows | None, waiters: list[Any], pause: bool, inflight: Any) -> None:
        """The writer thread: batches from the queue, one transaction each; a failed batch (rows
        and flush waiters) is retried, with what came meanwhile, every ``retry_interval``. Started
        by ``_detach`` with what the loop left: ``rows`` and ``waiters`` to retry (after a pause
        when they failed) or, at close, the batch in flight (``inflight``: its unsent bytes and
        reply bytes read so far)."""
        if pause:
            time.sleep(self.retry_interval)
        while True:
            batch, ws = rows, waiters
            rows, waiters = None, []
            items = [self._queue.get()] if batch is None and not ws else []
            if inflight is None:
                while True:
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
            for item in items:
                if item[0] != "rows":
                    ws.append(item)
                elif batch is None:
                    batch = item[1]
                else:
                    batch.extend(item[1])
            stop = any(item[0] == "stop" for item in ws)
            if inflight is not None:
                assert batch is not None
                if inflight is LOST:
                    why = self._finish(batch.groups(), None)
                else:
                    why = self._complete(batch, *inflight)
                inflight = None
            else:
                why = self.error if self.broken else self._identity_lost()
                if why is not None:
                    self.broken = True
                elif batch is not None and batch.size:
                    why = self._commit(batch)
            if why is None:
                self._set_error(None)
                for item in ws:
                    item[1]()
                if stop:
                    return
                continue
            rows, waiters = self._fail(batch, ws, why)
            if self.broken:
                if stop:
                    return
                continue
            time.sleep(self.retry_interval)  # the disk is failing: try again later, not in a spin

    def _complete(self, rows: Rows, unsent: bytes, got: bytes) -> str | None:
        """Finish, blocking, a batch the loop had sent when it detached (``close`` after the loop
        ended): send what the socket had not taken, read the reply."""
        groups = rows.groups()
        sock = self._sock
        try:
            if sock is None:
                raise OSError("the journal writer is gone")
            if unsent:
                sock.sendall(unsent)
            reply = _journal_writer.recv_after(sock, got)
        except OSError as exc:
            reply = (str(exc), [])
        return self._finish(groups, reply)

    # ---- JOURNAL-DIRECT: the event loop talks to the writer process ----------------------------

    def attach(self) -> bool:
        """Take the writer thread out (JOURNAL-DIRECT): from now on the running event loop sends each batch
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

    def _take_pending(self) -> tuple[Rows | None, list[Any]]:
        """Everything not sent yet (handed over, then still held), for a writer thread."""
        rows, waiters = self._pending, [("sync", fn) for fn in self._pending_waiters]
        self._pending, self._pending_waiters = None, []
        return self._with_held(rows), waiters

    def _with_held(self, rows: Rows | None) -> Rows | None:
        """``rows`` followed by the rows still held (JOURNAL-DIRECT: they wait there while a batch is in
        flight), which are taken."""
        with self._held_lock:
            held = self._held
            if held.size:
                self._held = Rows()
                if rows is None:
                    return held
                rows.extend(held)
        return rows

    def _send_pending(self) -> None:
        """Send every row handed over as one batch (on the loop; nothing is in flight)."""
        rows, waiters = self._pending, self._pending_waiters
        if rows is None:
            if waiters:
                self._pending_waiters = []
                for fn in waiters:
                    fn()
            return
        self._pending, self._pending_waiters = None, []
        sock, child = self._sock, self._child
        if sock is None or child is None or child.poll() is not None or self._identity_lost() is not None:
            # Not the happy path: the thread respawns the writer or notices the broken file.
            self._detach(rows, [("sync", fn) for fn in waiters], pause=False)
            return
        groups = rows.groups()
        frame = _journal_writer.frame(_wire(groups))
        self._inflight, self._inflight_groups, self._inflight_waiters = rows, groups, waiters
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
            self._detach(*self._take_pending(), pause=False)
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
        rows, groups, waiters = self._inflight, self._inflight_groups, self._inflight_waiters
        assert rows is not None
        self._inflight, self._inflight_groups, self._inflight_waiters = None, [], []
        if reply is None:
            self._unwatch()
            if any(g.sql is _ACCEPT and g.params for g in groups):
                # JOURNAL-LOST-WRITER: whether the dead writer committed it is read from the file, by a writer
                # thread (never the loop: the disk may be the reason the writer died).
                self._inflight, self._inflight_groups, self._inflight_waiters = rows, groups, waiters
                self._wbuf, self._rbuf, self._lost = b"", bytearray(), True
                self._detach(*self._take_pending(), pause=False)
                return
        why = self._finish(groups, reply)
        if why is None:
            self._set_error(None)
            for fn in waiters:
                fn()
            if self._loop is not None and self._inflight is None:
                self.hand_over()  # what was held meanwhile goes now, as one batch (group commit)
                if self._inflight is None:
                    self._send_pending()  # no rows: releases ``flush`` waiters
            return
        # A failed batch: as the thread does, then the thread takes over and retries.
        held, ws = self._fail(rows, [("sync", fn) for fn in waiters], why)
        later, later_ws = self._take_pending()
        if held is None:
            held = later
        elif later is not None:
            held.extend(later)
        self._detach(held, ws + later_ws, pause=not self.broken)

    def _unwatch(self) -> None:
        loop, sock = self._loop, self._sock
        if loop is not None and sock is not None and not loop.is_closed():
            loop.remove_reader(sock.fileno())
            loop.remove_writer(sock.fileno())

    def _detach(self, rows: Rows | None, waiters: list[Any], pause: bool) -> None:
        """Hand the journal back to a writer thread: ``rows`` and ``waiters`` first (after a pause
        when they just failed), then what is handed over later; a batch still in flight is
        finished first."""
        if self._loop is None:
            return
        self._unwatch()
        self._loop = None
        rows = self._with_held(rows)
        inflight = None
        if self._inflight is not None:
            first, first_ws = self._inflight, [("sync", fn) for fn in self._inflight_waiters]
            inflight = LOST if self._lost else (self._wbuf, bytes(self._rbuf))
            self._lost = False
            self._inflight, self._inflight_groups, self._inflight_waiters = None, [], []
            if rows is not None:
                self._queue.put(("rows", rows))
            for item in waiters:
                self._queue.put(item)
            rows, waiters = first, first_ws
        self._wbuf, self._rbuf = b"", bytearray()
        if self._sock is not None:
            self._sock.setblocking(True)
        self._thread = threading.Thread(
            target=self._writer, args=(rows, waiters, pause, inflight), name="turnpool-journal", daemon=True
        )
        self._thread.start()
