"""The journal's writer process: the only thing that writes the daemon's SQLite journal.

Why a process and not a thread (JOURNAL-UNAVAILABLE): a write to a stalled filesystem (frozen, a hung network
disk) puts the writing thread in uninterruptible sleep, and the kernel cannot end a process while
one of its threads is in that state: a writer *thread* would keep ``turnpool serve`` from exiting
after SIGTERM for as long as the disk stalls. A stuck writer *process* only keeps itself; the
daemon stops on time. The process holds the journal's locks too (inherited, JOURNAL-ONE-DAEMON), so no second
daemon opens the journal while a stuck writer might still write to it; it dies with the daemon
(parent-death signal) or at the end of its pipe.

Run as a script (``python -I writer.py FD``) so it imports nothing but the standard
library. It speaks length-prefixed ``marshal`` frames over the socket ``FD``: first an init dict,
answered ``(None, None)`` or ``(error, None)`` (after ``("upgrading", turns)`` when a schema-1 file is
converted first); then one frame per batch, a list of
``(sql, rows, accept)`` (one per statement, JOURNAL-GROUP; ``accept`` is ``"seq"`` for rows that lead with
the seq of the turn they insert, JOURNAL-APPEND), answered ``(error or None, [(group, row)
indexes of accept rows that inserted nothing])``. A batch runs in one transaction: all or nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import marshal
import os
import signal
import socket
import sqlite3
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

_LEN = struct.Struct("<I")


def recv(sock: socket.socket) -> Any:
    """One frame, or ``None`` at the end of the stream."""
    head = _exactly(sock, _LEN.size)
    if head is None:
        return None
    body = _exactly(sock, _LEN.unpack(head)[0])
    return None if body is None else marshal.loads(body)


def frame(obj: Any) -> bytes:
    """``obj`` as one length-prefixed frame."""
    body = marshal.dumps(obj)
    return _LEN.pack(len(body)) + body


def send(sock: socket.socket, obj: Any) -> None:
    sock.sendall(frame(obj))


INCOMPLETE: Any = object()
"""What ``parse`` returns while ``buf`` does not hold a whole frame yet."""


def parse(buf: bytearray) -> Any:
    """The first whole frame of ``buf`` (removed from it), or ``INCOMPLETE`` (JOURNAL-DIRECT: the daemon's
    loop reads the reply in pieces from a non-blocking socket)."""
    if len(buf) < _LEN.size:
        return INCOMPLETE
    end = _LEN.size + _LEN.unpack_from(buf)[0]
    if len(buf) < end:
        return INCOMPLETE
    obj = marshal.loads(bytes(buf[_LEN.size : end]))
    del buf[:end]
    return obj


def recv_after(sock: socket.socket, got: bytes) -> Any:
    """One frame of which ``got`` was already read (blocking), or ``None`` at the end of the stream."""
    buf = bytearray(got)
    while True:
        obj = parse(buf)
        if obj is not INCOMPLETE:
            return obj
        chunk = sock.recv(1 << 16)
        if not chunk:
            return None
        buf += chunk


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def _die_with_parent() -> None:
    """SIGKILL when the thread that started us ends: the daemon's main thread at open (a respawn
    after a writer death comes from the journal's writer thread, which lives as long as we are needed)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # the end of the pipe still stops it


class Writer:
    def __init__(self, init: dict[str, Any]) -> None:
        self.path: str = init["path"]
        self.synchronous: str = init["synchronous"]
        self.keep_days: float | None = init["keep_days"]
        self.keep_turns: int | None = init.get("keep_turns")  # JOURNAL-KEEP-NEWEST
        self.con: sqlite3.Connection | None = None
        self.last_compaction = time.monotonic()
        self.batches = 0

    def connect(
        self, init: dict[str, Any] | None = None, upgrading: Callable[[int], None] | None = None
    ) -> sqlite3.Connection:
        """Open the database; with ``init`` (the first time) create or upgrade its schema, calling
        ``upgrading`` with the number of turns before a schema-1 file is converted."""
        con = sqlite3.connect(self.path, isolation_level=None)
        if init is not None:
            con.execute("PRAGMA journal_mode=WAL")
        con.execute(f"PRAGMA synchronous={self.synchronous}")
        con.execute("PRAGMA busy_timeout=5000")
        if init is not None:
            version = int(init["version"])
            if con.execute("PRAGMA user_version").fetchone()[0] == 1:
                # JOURNAL-APPEND: a schema-1 journal (JOURNAL-REFUSE-BAD checked it) is brought to schema 2 in
                # one transaction: all of it or, on any error, none of it.
                if upgrading is not None:
                    upgrading(con.execute("SELECT COUNT(*) FROM turns").fetchone()[0])
                try:
                    con.executescript(
                        f"BEGIN IMMEDIATE;\n{init['migrate_from_1']}\nPRAGMA user_version={version};\nCOMMIT;"
                    )
                except sqlite3.Error:
                    if con.in_transaction:
                        con.execute("ROLLBACK")
                    raise
            con.executescript(init["schema"])
            con.execute(f"PRAGMA application_id={int(init['app_id'])}")
            con.execute(f"PRAGMA user_version={version}")
        return con

    def commit(
        self, groups: list[tuple[str, list[Any], bool | str]]
    ) -> tuple[str | None, list[tuple[int, int]]]:
        """Run a batch in one transaction: one ``executemany`` per group (JOURNAL-GROUP: the daemon
        sends its rows grouped per statement, so nothing here loops over rows in Python). Returns
        the error as text (nothing written) or ``None`` and the ``(group, row)`` indexes of accept
        rows that inserted nothing (JOURNAL-LOOKUP)."""
        conflicts: list[tuple[int, int]] = []
        try:
            if self.con is None:
                self.con = self.connect()
            con = self.con
            con.execute("BEGIN")
            for k, (sql, params, accept) in enumerate(groups):
                if not accept:
                    con.executemany(sql, params)
                elif accept == "seq":
                    # JOURNAL-APPEND: an accept row that inserted nothing left its (fresh) seq unused:
                    # the rows whose seq is not in the table are the conflicts. (A savepoint to undo
                    # and redo them one by one cost more than the inserts once the schema had triggers.)
                    if con.executemany(sql, params).rowcount != len(params):
                        conflicts.extend((k, i) for i in missing(con, [p[0] for p in params]))
                elif len(params) == 1:
                    if con.execute(sql, params[0]).rowcount == 0:
                        conflicts.append((k, 0))
                else:
                    # Accept rows report conflicts row by row: try the group at once, and only if
                    # some row inserted nothing, redo it one row at a time to say which.
                    con.execute("SAVEPOINT run")
                    cur = con.executemany(sql, params)
                    if cur.rowcount == len(params):
                        con.execute("RELEASE run")
                    else:
                        con.execute("ROLLBACK TO run")
                        con.execute("RELEASE run")
                        for i, p in enumerate(params):
                            if con.execute(sql, p).rowcount == 0:
                                conflicts.append((k, i))
            con.execute("COMMIT")
        except (sqlite3.Error, OSError) as exc:
            failed, self.con = self.con, None  # reconnect next time: a failed connection may stay failed
            if failed is not None:
                with contextlib.suppress(sqlite3.Error):
                    failed.execute("ROLLBACK")
                failed.close()
            return f"{type(exc).__name__}: {exc}", []
        self.batches += 1
        if self.batches % PRUNE_EVERY == 0:
            with contextlib.suppress(sqlite3.Error):  # the batch is committed all the same; pruned next time
                prune_cleared(con)
        if (self.keep_days is not None or self.keep_turns is not None) and (
            time.monotonic() - self.last_compaction > COMPACT_EVERY
        ):
            self.last_compaction = time.monotonic()
            with contextlib.suppress(sqlite3.Error):  # retried at the next interval
                compact(con, self.keep_days, self.keep_turns)
        return None, conflicts


def missing(con: sqlite3.Connection, seqs: list[int]) -> list[int]:
    """The indexes of ``seqs`` that have no ``turns`` row (JOURNAL-APPEND: an accept row that inserted
    nothing, here and in ``Journal._landed``)."""
    present: set[int] = set()
    for k in range(0, len(seqs), 500):
        chunk = seqs[k : k + 500]
        marks = ",".join("?" * len(chunk))
        present.update(r[0] for r in con.execute(f"SELECT seq FROM turns WHERE seq IN ({marks})", chunk))
    return [i for i, seq in enumerate(seqs) if seq not in present]


PRUNE_EVERY = 256
"""Batches between two prunings of the ``cleared`` runs whose turns have all ended."""


def prune_cleared(con: sqlite3.Connection) -> None:
    """JOURNAL-APPEND: forget the cleared runs (JOURNAL-GATE) that hold no open turn: every turn in them has
    ended, so they no longer tell anything (and the state of a turn is looked up in what is left). A long turn
    still open keeps its own run only, not every run after it."""
    con.execute(
        "DELETE FROM cleared WHERE NOT EXISTS"
        " (SELECT 1 FROM open_turns o WHERE o.seq BETWEEN cleared.lo AND cleared.hi)"
    )


# JOURNAL-RETENTION: retention in chunks, so it never blocks serving.
COMPACT_EVERY = 60.0  # seconds between the writer's retention passes


def compact(con: sqlite3.Connection, keep_days: float | None, keep_turns: int | None = None) -> int:
    """Delete ended turns older than ``keep_days``, and (JOURNAL-KEEP-NEWEST) all but the ``keep_turns``
    newest ended turns, in chunks of 500 (each its own transaction, so a reader never waits long); returns how
    many."""
    removed = 0
    if keep_days is not None:
        removed += _delete_ended(con, "ended_at < ?", time.time() - keep_days * 86400)
    if keep_turns is not None:
        row = con.execute(
            "SELECT seq FROM ends ORDER BY seq DESC LIMIT 1 OFFSET ?", (max(0, keep_turns),)
        ).fetchone()
        if row is not None:  # the newest ended turn past the limit: it and every older one go
            removed += _delete_ended(con, "seq <= ?", row[0])
    con.execute("DELETE FROM events WHERE turn_id NOT IN (SELECT turn_id FROM turns)")
    prune_cleared(con)
    return removed


def _delete_ended(con: sqlite3.Connection, where: str, arg: float) -> int:
    removed = 0
    while True:
        seqs = [r[0] for r in con.execute(f"SELECT seq FROM ends WHERE {where} LIMIT 500", (arg,))]
        if seqs:
            marks = ",".join("?" * len(seqs))
            con.execute("BEGIN")
            try:
                con.execute(f"DELETE FROM turns WHERE seq IN ({marks})", seqs)
                con.execute(f"DELETE FROM ends WHERE seq IN ({marks})", seqs)
                con.execute("COMMIT")
            except sqlite3.Error:
                con.execute("ROLLBACK")
                raise
        removed += len(seqs)
        if len(seqs) < 500:
            break
    return removed


def main() -> int:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the daemon, which closes us
    sock = socket.socket(fileno=int(sys.argv[1]))
    init = recv(sock)
    if init is None:
        return 0
    # SEC-JOURNAL: private from the first byte.
    os.umask(0o077)  # SQLite makes -wal and -shm with the umask: private from the start
    writer = Writer(init)
    try:
        # JOURNAL-APPEND: an upgrade takes time in proportion to the file (≈ 260,000 turns a second
        # here): the daemon is told how many turns, and waits for them instead of its usual bound.
        writer.con = writer.connect(init, lambda turns: send(sock, ("upgrading", turns)))
    except (sqlite3.Error, OSError) as exc:
        send(sock, (f"{type(exc).__name__}: {exc}", None))
        return 1
    send(sock, (None, None))
    while True:
        rows = recv(sock)
        if rows is None:
            break
        send(sock, writer.commit(rows))
    if writer.con is not None:
        writer.con.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
