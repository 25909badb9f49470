"""Batch output: the append-only results file, and what an earlier run already recorded.

Each result is one JSON line written with a single ``write(2)`` on a file opened with
``O_APPEND``: the kernel appends it whole, so a runner that dies (even by SIGKILL) leaves
either the whole line or nothing, and every line written before is already in the file.
A line is *final* when ``final`` is true and ``outcome`` is a turn outcome: ``--resume``
skips exactly those ids. Interrupted jobs (``final: false``) and ``invalid`` records never
count as done.
"""

from __future__ import annotations

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
    """The output file, appended one whole line per job."""

    def __init__(self, path: str | PathLike[str], *, fsync: bool = False) -> None:
        self.path = os.fspath(path)
        self.fsync = fsync
        self._fd = -1
        self.written = 0

    def open(self) -> None:
        if self.path == "-":  # ``-o -``: standard output (a copy of fd 1, closed with the log)
            self._fd = os.dup(1)
            return
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record. The line is built first and handed to the kernel in one call."""
        data = encode_record(record)
        view = memoryview(data)
        while view:  # a regular file takes it all at once; the loop only guards a short write
            n = os.write(self._fd, view)
            view = view[n:]
        if self.fsync and self.path != "-":
            os.fsync(self._fd)
        self.written += 1

    def close(self) -> None:
        if self._fd >= 0:
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
    write cut short by a crash outside our control, e.g. a full disk) is truncated away so the
    next append starts on a fresh line; its job has no final line and runs again."""
    prev = Previous()
    try:
        f = open(path, "rb+" if repair else "rb")
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
