"""Options shared by several ``turnpool`` commands, declared and validated once: the endpoint, the
embedded pool's size, the escalation ladder's times (grace, kill-after), the agent path. A command
adds them with these functions, so ``--grace -1`` or ``--workers 0`` is refused the same way (exit
2, the same message) by every command. The pool's size and the ladder's times are checked by the
engine's own rules (``workers``, ``grace``, ``kill_after`` below), the ones a ``Supervisor`` and a
``turnpool serve`` TOML config are held to: one rule, one message, wherever the value comes from."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .._checks import check_count, check_seconds


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


positive_int = int_at_least(1)
count = int_at_least(0)


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0 (one message for every value out of bounds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


def _engine_rule(name: str, parse: Callable[[str], Any], check: Callable[[Any], Any]) -> Callable[[str], Any]:
    """An argparse type for the engine's option ``name``: parsed, then checked by the engine's rule."""

    def checked(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        try:
            return check(value)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    checked.__name__ = name  # argparse names the type in its messages
    return checked


workers = _engine_rule("workers", int, lambda v: check_count("workers", v, 1))
spares = _engine_rule("spares", int, lambda v: check_count("spares", v, 0))
grace = _engine_rule("grace", float, lambda v: check_seconds("grace", v))
kill_after = _engine_rule("kill_after", float, lambda v: check_seconds("kill_after", v))


ENDPOINT_HELP = "daemon endpoint (default: TURNPOOL_ENDPOINT or the per-user runtime dir)"


def add_endpoint(parser: argparse.ArgumentParser, *, help: str = ENDPOINT_HELP, timeout: bool = True) -> None:
    """``--endpoint E`` of a command that talks to (or reads the journal of) a daemon."""
    parser.add_argument("--endpoint", default=None, help=help)
    if timeout:
        parser.add_argument("--connect-timeout", type=positive_seconds, default=5.0, help=argparse.SUPPRESS)


def add_json(parser: argparse.ArgumentParser, *, help: str = "print JSON instead of text") -> None:
    """``--json``: every command that prints data takes it (machine-readable output, one JSON object
    or one per line)."""
    parser.add_argument("--json", action="store_true", help=help)


def add_pool_or_daemon(
    parser: argparse.ArgumentParser,
    *,
    workers_default: int | None,
    workers_help: str,
    connect_help: str,
    connect_default_endpoint: bool = False,
) -> None:
    """``--workers N`` (an embedded pool) or ``--connect E`` / ``--endpoint E`` (a daemon), not both.
    With ``connect_default_endpoint``, ``--connect`` without a value means the default endpoint."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--workers", type=workers, default=workers_default, metavar="N", help=workers_help)
    extra: dict[str, Any] = {"nargs": "?", "const": ""} if connect_default_endpoint else {}
    where.add_argument("--connect", "--endpoint", dest="connect", metavar="E", help=connect_help, **extra)


def add_ladder(parser: argparse.ArgumentParser, *, grace_help: str, kill_after_help: str) -> None:
    """``--grace S`` and ``--kill-after S``: the escalation ladder's times (default: the pool's)."""
    parser.add_argument("--grace", type=grace, default=None, metavar="S", help=grace_help)
    parser.add_argument("--kill-after", type=kill_after, default=None, metavar="S", help=kill_after_help)


PATH_HELP = (
    "a directory the embedded pool's workers import agents from (repeatable; the working "
    "directory is not searched: `--path .` to use it)"
)


def add_path(parser: argparse.ArgumentParser, *, help: str = PATH_HELP) -> None:
    """``--path DIR`` (repeatable): where workers import agents from (WORKER-PATH)."""
    parser.add_argument("--path", dest="path", action="append", default=None, metavar="DIR", help=help)
