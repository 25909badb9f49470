"""Batch input: read a jobs file (or job mappings), validate every line before anything runs.

A job line is a JSON object with ``id`` (a non-empty string or an integer, unique across the
file) and ``input`` (any JSON, default ``null``), optionally ``agent``, ``timeout`` and
``session``. Any other key is an error, so a typo such as ``"timout"`` is caught instead of
silently ignored. Blank lines are skipped. Ids are compared by their text: ``1`` and ``"1"``
are the same id (both would be written ``1`` in a turn id).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from os import PathLike
from typing import Any

import msgspec

import wire

from .._checks import AGENT_RE, id_problem

JOB_KEYS = frozenset({"id", "input", "agent", "timeout", "session"})
MAX_SESSION = 256
_decode = msgspec.json.Decoder().decode
_encode_msgpack = msgspec.msgpack.Encoder().encode
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:@+=-]{1,128}$")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Job:
    """One valid job: ``id`` as written in the file, ``key`` its text (for matching and turn ids)."""

    line: int
    id: str | int
    key: str
    input: Any
    agent: str
    timeout: float | None
    session: str | None


@dataclass(frozen=True, slots=True)
class InvalidLine:
    """A line that cannot run, with its 1-based line number and why (``id`` when one was readable)."""

    line: int
    message: str
    id: str | int | None = None

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def id_key(value: str | int) -> str:
    """The text an id is matched by (``1`` and ``"1"`` are the same id)."""
    return value if isinstance(value, str) else str(value)


def turn_id_for(batch: str, key: str, attempt: int) -> str:
    """Deterministic turn id of ``attempt`` of job ``key`` in batch ``batch``.

    The same batch, job and attempt always give the same id, so resubmitting (a resume after
    the runner died between a turn's end and its line being written, or a reconnect to a
    daemon) finds the existing turn instead of running the job again. Ids with characters
    outside a safe set, or long ones, are replaced by a digest.
    """
    part = key if _SAFE_ID.match(key) else "h" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"batch-{batch}-{part}-a{attempt}"


_GOOD_AGENTS: set[str] = set()  # agent strings already checked (a batch names a few, many times)


def _good_agent(agent: str) -> bool:
    if AGENT_RE.match(agent) is None:
        return False
    if len(_GOOD_AGENTS) < 1024:
        _GOOD_AGENTS.add(agent)
    return True


def _check_job(obj: Any, line: int, default_agent: str | None) -> Job | InvalidLine:
    if not isinstance(obj, dict):
        return InvalidLine(line, f"a job must be a JSON object, got {type(obj).__name__}")
    raw_id = obj.get("id")
    if "id" not in obj:
        return InvalidLine(line, "no 'id'")
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or raw_id == "":
        return InvalidLine(line, f"'id' must be a non-empty string or an integer, got {raw_id!r}")
    # BATCH-CHECK: what would stop the run later is found here, before anything runs.
    if isinstance(raw_id, str) and not raw_id.isascii() and _SURROGATE.search(raw_id):
        # (no UTF-8 results file, and no turn id, can carry a lone surrogate)
        return InvalidLine(line, f"'id' must be text, got {raw_id!r} (it holds a lone surrogate)")
    if isinstance(raw_id, int) and raw_id.bit_length() > 4096:  # str() of it would raise
        return InvalidLine(line, f"'id' is an integer of {raw_id.bit_length()} bits: write it as a string")
    unknown = None if JOB_KEYS.issuperset(obj) else sorted(set(obj) - JOB_KEYS)
    if unknown:
        return InvalidLine(
            line,
            f"unknown key(s) {', '.join(map(repr, unknown))} (a job has {', '.join(sorted(JOB_KEYS))})",
            raw_id,
        )
    agent = obj.get("agent", default_agent)
    if agent is None:
        return InvalidLine(line, "no agent: give --agent or an 'agent' key", raw_id)
    if agent not in _GOOD_AGENTS and (not isinstance(agent, str) or not _good_agent(agent)):
        return InvalidLine(line, f"bad agent {agent!r}: write it 'package.module:attr'", raw_id)
    timeout = obj.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        return InvalidLine(line, f"'timeout' must be a number of seconds > 0, got {timeout!r}", raw_id)
    session = obj.get("session")
    if session is not None and (not isinstance(session, str) or not session or len(session) > MAX_SESSION):
        return InvalidLine(
            line,
            f"'session' must be a non-empty string of at most {MAX_SESSION} characters, got {session!r}",
            raw_id,
        )
    problem = id_problem("'session'", session) if session is not None else None
    if problem is not None:
        return InvalidLine(line, problem, raw_id)
    problem = _input_problem(obj.get("input"))  # not encodable, too large, too deep
    if problem is not None:
        return InvalidLine(line, problem, raw_id)
    return Job(
        line,
        raw_id,
        id_key(raw_id),
        obj.get("input"),
        agent,
        float(timeout) if timeout is not None else None,
        session,
    )


def _input_problem(value: Any) -> str | None:
    """Why ``value`` could not be a turn's input (as ``wire.encode_payload`` would say), or ``None``;
    the encoder's call alone (≈ 1 µs a job), since most inputs are fine."""
    try:
        size = len(_encode_msgpack(value))
    except RecursionError:
        return f"'input' {wire.TOO_DEEP}"
    except (TypeError, ValueError, OverflowError) as exc:
        return f"'input' is not encodable with msgspec: {exc}"
    if size > wire.MAX_PAYLOAD_SIZE:
        return f"'input' is {size} bytes encoded; the limit is {wire.MAX_PAYLOAD_SIZE}"
    return None


def check_jobs(
    rows: Iterable[tuple[int, Any]], default_agent: str | None
) -> tuple[list[Job], list[InvalidLine]]:
    """Validate ``(line, parsed object or InvalidLine)`` rows; duplicates name the first line."""
    jobs: list[Job] = []
    invalid: list[InvalidLine] = []
    seen: dict[str, int] = {}
    for line, obj in rows:
        if isinstance(obj, InvalidLine):
            invalid.append(obj)
            continue
        checked = _check_job(obj, line, default_agent)
        if isinstance(checked, InvalidLine):
            invalid.append(checked)
            continue
        first = seen.get(checked.key)
        if first is not None:
            invalid.append(InvalidLine(line, f"id {checked.id!r} repeats line {first}", checked.id))
            continue
        seen[checked.key] = line
        jobs.append(checked)
    return jobs, invalid


def _parse_lines(path: str | PathLike[str]) -> Iterable[tuple[int, Any]]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            text = raw.strip()
            if not text:
                continue
            try:
                # BATCH-PARSE: msgspec's decoder first (several times faster); whatever it refuses
                # (NaN, huge integers, bad UTF-8, bad JSON) goes through ``json`` as before, which
                # accepts what it always accepted and words the error the same way.
                yield number, _decode(text)
                continue
            except (msgspec.DecodeError, ValueError, TypeError):
                pass
            except RecursionError:  # LINK-DEPTH (``json`` would recurse as deep)
                yield number, InvalidLine(number, f"the line {wire.TOO_DEEP}")
                continue
            try:
                yield number, json.loads(text)
            except RecursionError:
                yield number, InvalidLine(number, f"the line {wire.TOO_DEEP}")
            except UnicodeDecodeError as exc:
                yield number, InvalidLine(number, f"not UTF-8: {exc.reason} at byte {exc.start}")
            except json.JSONDecodeError as exc:
                yield number, InvalidLine(number, f"not JSON: {exc.msg} (column {exc.colno})")
            except ValueError as exc:  # e.g. an integer of more than 4300 digits
                yield number, InvalidLine(number, f"not usable JSON: {exc}")


def load_jobs(
    source: str | PathLike[str] | Iterable[Mapping[str, Any]], default_agent: str | None = None
) -> tuple[list[Job], list[InvalidLine]]:
    """Read and validate every job of a JSONL file (or an iterable of mappings, numbered from 1).

    Raises ``OSError`` if the file cannot be read; everything wrong with a line is returned
    as an ``InvalidLine``, all of them, so the user sees the whole list at once.
    """
    if isinstance(source, (str, PathLike)):
        return check_jobs(_parse_lines(source), default_agent)
    rows = ((i, dict(obj) if isinstance(obj, Mapping) else obj) for i, obj in enumerate(source, 1))
    return check_jobs(rows, default_agent)
