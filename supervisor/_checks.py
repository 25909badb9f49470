"""Argument validation shared by the engine and the client: one place says what a valid agent,
number of seconds or id is, so an embedded ``Supervisor`` and a daemon ``Client`` refuse the same
things with the same message."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import wire

from ._errors import InvalidAgent, shown_id

AGENT_RE = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
)
MAX_TURN_ID = 256
# Default cap on a turn's grace and kill_after (``max_grace``): a client-chosen grace can never
# hold shutdown for longer than this (issue 13, item 11).
MAX_GRACE = 300.0

_CHECKED_AGENTS: set[str] = set()


# API-NO-MAIN: said at the call, since the worker could only fail with a puzzling AttributeError.
MAIN_AGENT = (
    "agent {agent!r} names the __main__ module: agents run in worker processes, which import them "
    "by module name, and a worker's __main__ is the worker itself, not your script. Put {attr} in "
    "an importable module (e.g. my_agents.py next to your script, named 'my_agents:{attr}'), and "
    'keep the code that starts the supervisor under `if __name__ == "__main__":`'
)


def check_agent(agent: Any) -> str:
    """``agent`` as ``package.module:attr``, or ``InvalidAgent``. Never imports it."""
    if type(agent) is str and agent in _CHECKED_AGENTS:
        return agent
    # LINK-RESULT-FITS: a result always fits a message
    if isinstance(agent, str) and len(agent) > wire.MAX_AGENT_CHARS:
        raise InvalidAgent(f"agent must be at most {wire.MAX_AGENT_CHARS} characters, got {len(agent)}")
    if not isinstance(agent, str) or not AGENT_RE.match(agent):
        raise InvalidAgent(f"agent must be written 'package.module:attr', got {agent!r}")
    if agent.partition(":")[0] == "__main__":
        raise InvalidAgent(MAIN_AGENT.format(agent=agent, attr=agent.partition(":")[2]))
    if len(_CHECKED_AGENTS) < 4096:
        _CHECKED_AGENTS.add(agent)
    return agent


def check_seconds(name: str, value: Any, *, allow_none: bool = True, positive: bool = False) -> float | None:
    """A finite number of seconds (>= 0, or > 0 with ``positive``), or ``None`` if allowed."""
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{name} is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if (
        seconds != seconds
        or seconds in (float("inf"), float("-inf"))
        or seconds < 0
        or (positive and seconds == 0)
    ):
        raise ValueError(f"{name} must be a finite number {'>' if positive else '>='} 0, got {seconds}")
    return seconds


def require_seconds(name: str, value: Any, *, positive: bool = False) -> float:
    """``check_seconds`` for a value that may not be ``None``."""
    checked = check_seconds(name, value, allow_none=False, positive=positive)
    assert checked is not None
    return checked


# LINK-TURN-ID: what a turn id or a session name may hold, the same at every front end (the Python API,
# the daemon's clients, HTTP, the CLI, batch): 1 to ``MAX_TURN_ID`` characters of text, without
# control characters (C0, DEL, C1: a NUL or a newline cannot travel in a header, a log line or a
# terminal), line or paragraph separators, or surrogate code points (a lone surrogate is not text:
# it cannot be written as UTF-8, so no journal, JSON body or URL could carry it). Anything else -
# spaces, ``/``, ``%``, any script, emoji - is accepted, and HTTP addresses it percent-encoded.
_SURROGATE = re.compile("[\ud800-\udfff]")
_NOT_IN_IDS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def id_problem(name: str, value: str) -> str | None:
    """Why ``value`` cannot be a turn id (or session, ``name``) under LINK-TURN-ID, or ``None``."""
    if not value or len(value) > MAX_TURN_ID:
        return f"{name} must be a non-empty string of at most {MAX_TURN_ID} characters, got {shown_id(value)}"
    bad = _NOT_IN_IDS.search(value)
    if bad is None:
        return None
    char = bad.group()
    kind = "a surrogate code point" if "\ud800" <= char <= "\udfff" else "a control character"
    if char in "\u2028\u2029":
        kind = "a line separator"
    return (
        f"{name} must be printable text: it holds {kind} (U+{ord(char):04X}) at position {bad.start()}, "
        f"got {shown_id(value)}"
    )


def check_known_id(name: str, value: str) -> None:
    """LINK-TURN-ID for a look-up (result, cancel, follow): an id holding a surrogate can never have been
    accepted, nor be sent or stored, so it is bad input (``ValueError``), said as the rule says
    it. Other ids are looked up as given (a journal may hold ids accepted under an older rule)."""
    if not value.isascii() and _SURROGATE.search(value) is not None:
        raise ValueError(id_problem(name, value))


def check_optional_str(name: str, value: Any) -> str | None:
    """A turn id or session name (LINK-TURN-ID), or ``None``: ``TypeError`` for a non-string, an empty or
    a too long one, ``ValueError`` for a string holding a character ids may not hold."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_TURN_ID:
        raise TypeError(
            f"{name} must be a non-empty string of at most {MAX_TURN_ID} characters, got {shown_id(value)}"
        )
    problem = id_problem(name, value)
    if problem is not None:
        raise ValueError(problem)
    return value


def check_count(name: str, value: Any, low: int) -> int:
    """An int >= ``low`` (``bool`` refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def check_sizes(*, cgroups: Any, max_turns_per_worker: Any, **counts: Any) -> None:
    """``Supervisor``'s sizes: ``spares`` an int >= 0, each other count an int >= 1,
    ``max_turns_per_worker`` a positive int or ``None``, ``cgroups`` a bool."""
    if not isinstance(cgroups, bool):
        raise TypeError(f"cgroups must be True or False, got {cgroups!r}")
    for name, value in counts.items():
        check_count(name, value, 0 if name == "spares" else 1)
    if max_turns_per_worker is not None and (
        isinstance(max_turns_per_worker, bool)
        or not isinstance(max_turns_per_worker, int)
        or max_turns_per_worker < 1
    ):
        raise ValueError(f"max_turns_per_worker must be a positive int or None, got {max_turns_per_worker!r}")


_Grace = TypeVar("_Grace", bound=float | None)


# MEM-INPUTS: the inputs held by turns not ended yet (queued or running), in bytes; a submit past it gets
# ``QueueFull``. ``max_queue`` alone let 100,000 queued turns hold up to 32 MiB of input each.
MAX_INPUT_BYTES = 2048 * 2**20


def check_grace(name: str, value: _Grace, max_grace: float) -> _Grace:
    """R-GRACE: ``value`` (a grace or kill_after) within the supervisor's ``max_grace``."""
    if value is not None and value > max_grace:
        raise ValueError(
            f"{name} must be at most this supervisor's max_grace ({max_grace:g} s), got {value:g}"
        )
    return value


def check_mib(name: str, value: Any) -> float:
    """A finite number of MiB > 0 (``bool`` refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a number of MiB > 0, got {value!r}")
    return float(value)


def mib_bytes(name: str, value: Any) -> int:
    """``check_mib``'s number of MiB, in bytes."""
    return int(check_mib(name, value) * 2**20)


def check_nice(value: Any) -> int | None:
    """``worker_nice`` (WORKER-NICE): ``None`` (workers keep this process's niceness) or an int from 0
    to 19 - only ever lower than the supervisor's priority, which needs no privilege."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"worker_nice must be an int from 0 to 19 or None, got {value!r}")
    if not 0 <= value <= 19:
        raise ValueError(f"worker_nice must be an int from 0 to 19 or None, got {value!r}")
    return value
