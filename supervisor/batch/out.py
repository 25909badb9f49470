"""Batch output: the append-only results file, and what an earlier run already recorded.

Each result is one JSON line written with a single ``write(2)`` on a file opened with
``O_APPEND``: the kernel appends it whole, so a runner that dies (even by SIGKILL) leaves
either the whole line or nothing, and every line written before is already in the file.
A line is *final* when ``final`` is true and ``outcome`` is a turn outcome: ``--resume``
skips exactly those ids. Interrupted jobs (``final: false``) and ``invalid`` records never
count as done.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass, field
from os import PathLike
from typing import Any

import msgspec

from wire import OUTCOMES

log = logging.getLogger("turnpool.batch")

_encoder = msgspec.json.Encoder(enc_hook=repr)  # an odd output value is written as its repr, never lost


def encode_record(record: dict[str, Any]) -> bytes:
    """One result as a complete JSON line (newline included)."""
    return _encoder.encode(record) + b"\n"


def is_final(record: Any) -> bool:
    return isinstance(record, dict) and record.get("final") is True and record.get("outcome") in OUTCOMES


class ResultLog:
    """The output file, appended whole lines only.

    ``write`` appends one line now. ``add`` (what the batch engine uses) appends it in the same
    event-loop iteration: the lines of every job that ended in that iteration go to the kernel in
    one ``write(2)`` (BATCH-LINES). Still whole lines only, in the order the jobs ended, so a runner
    killed at any instant leaves whole lines, but for one case: Linux stops a write to a regular
    file between pages when its writer gets SIGKILL, so the last write can be cut and its last line
    torn (``read_previous`` truncates it on ``--resume``). What it loses is at most the lines of
    jobs that ended in the iteration it died in, whose jobs then have no final line and run again
    on ``--resume`` - as a job that ended an instant before its line was written always did."""

    def __init__(self, path: str | PathLike[str], *, fsync: bool = False) -> None:
        self.path = os.fspath(path)
        self.fsync = fsync
        self._fd = -1
        self.written = 0
        self._pending: list[bytes] = []
        self._scheduled = False

    def open(self) -> None:
        if self.path == "-":  # ``-o -``: standard output (a copy of fd 1, closed with the log)
            self._fd = os.dup(1)
            return
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record now (after any added before it). The line is built first and handed
        to the kernel in one call."""
        self._pending.append(encode_record(record))
        self.flush()

    def add(self, record: dict[str, Any]) -> None:
        """Append one record at the end of this event-loop iteration (BATCH-LINES); at once when no
        event loop runs here."""
        self._pending.append(encode_record(record))
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._scheduled = True
        loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self._scheduled = False
        if self._fd >= 0:
            self.flush()

    def flush(self) -> None:
        """Hand every pending line to the kernel in one ``write(2)``."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        view = memoryview(data)
        while view:  # a regular file takes it all at once; the loop only guards a short write
            n = os.write(self._fd, view)
            view = view[n:]
        if self.fsync and self.path != "-":
            os.fsync(self._fd)
        self.written += len(pending)

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self.flush()
            finally:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> ResultLog:
        self.open()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


@dataclass(slots=True)
class Previous:
    """What the output file already holds."""

    batch: str | None = None
    lines: int = 0
    final: dict[str, dict[str, Any]] = field(default_factory=dict)  # id key → its final record
    attempts: dict[str, int] = field(default_factory=dict)  # id key → attempts recorded so far
    invalid: set[tuple[int, str | None]] = field(default_factory=set)  # (line, id key) recorded invalid
    torn_bytes: int = 0  # bytes of an incomplete last line dropped by ``repair``
    unreadable: int = 0  # complete lines that are not a JSON object (left as they are)


def read_previous(path: str | PathLike[str], *, repair: bool) -> Previous:
    """Scan an existing output file. With ``repair``, an incomplete last line (no newline: a
    write cut short by a crash outside our control, e.g. a full disk, or by the kernel when the
    runner got SIGKILL in the middle of a write spanning pages) is truncated away so the
    next append starts on a fresh line; its job has no final line and runs again."""
    prev = Previous()
    try:
        f = open(path, "rb+" if repair else "rb")  # noqa: SIM115 - closed by the ``with f`` below
    except FileNotFoundError:
        return prev
    with f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            prev.torn_bytes = len(data) - end
            if repair:
                log.warning("%s: dropping an incomplete last line (%d bytes)", path, prev.torn_bytes)
                f.truncate(end)
    for raw in data[:end].splitlines():
        if not raw.strip():
            continue
        prev.lines += 1
        try:
            rec = json.loads(raw)
        except ValueError:
            prev.unreadable += 1
            continue
        if not isinstance(rec, dict):
            prev.unreadable += 1
            continue
        if prev.batch is None and isinstance(rec.get("batch"), str):
            prev.batch = rec["batch"]
        rid = rec.get("id")
        key = None if rid is None or isinstance(rid, bool) else (rid if isinstance(rid, str) else str(rid))
        if rec.get("outcome") == "invalid":
            if isinstance(rec.get("line"), int):
                prev.invalid.add((rec["line"], key))
            continue
        if key is None:
            continue
        attempts = rec.get("attempts")
        if isinstance(attempts, int) and attempts > prev.attempts.get(key, 0):
            prev.attempts[key] = attempts
        if is_final(rec):
            prev.final.setdefault(key, rec)
    return prev
