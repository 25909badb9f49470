"""``turnpool history`` and ``turnpool result``: past turns read from a daemon's journal.

They read the journal file directly (read-only; SQLite's WAL lets a live daemon keep
writing), so they work whether or not the daemon is running. Which file (CLI-HISTORY): ``--journal
PATH`` when given; else the running daemon at ``--endpoint`` is asked where its journal is (it
may have been started with ``--journal PATH``, or ``--no-journal``: then there is none, and
that is said); with no daemon running, the default journal of that endpoint.

Output (CLI-PLAIN, CLI-TIMES): ``--json`` prints one object per line with epoch-second timestamps and the
cause written ``{"kind": K}`` as in results; a table on a terminal; tab-separated text with a
header row when stdout is not a terminal (every value whole). Times in text are ISO 8601 UTC.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

import msgspec

from wire import OUTCOMES

from .._checks import check_known_id
from .._errors import UnknownTurn, shown_id
from .._paths import check_endpoint, default_endpoint
from . import options
from .steps import summary as steps_summary
from .steps import turn_steps


def _since(value: str) -> float:
    """``--since``: epoch seconds, an ISO date/time, or a relative age like 30m, 2h, 7d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if value[-1:] in units and value[:-1].replace(".", "", 1).isdigit():
            return dt.datetime.now().timestamp() - float(value[:-1]) * units[value[-1]]
        return float(value)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            "--since takes epoch seconds, an ISO time (2026-11-30T08:00) or an age (30m, 2h, 7d), "
            f"not {value!r}"
        ) from None


def iso_utc(ts: float | None) -> str:
    """An epoch time as ISO 8601 UTC to the second (``2026-12-01T01:40:52Z``), for text output (CLI-TIMES)."""
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def register(sub: Any) -> None:
    h = sub.add_parser("history", help="list past turns from the daemon's journal")
    h.add_argument("--journal", default=None, help="journal file (default: the daemon's at --endpoint)")
    h.add_argument("--session")
    h.add_argument("--outcome", choices=OUTCOMES)
    h.add_argument("--since", type=_since, help="epoch seconds, ISO time, or an age like 2h")
    h.add_argument(
        "--limit", type=options.positive_int, default=100, help="at most this many turns (default 100)"
    )
    h.add_argument("--steps", action="store_true", help="add each turn's steps and its calls' states")
    options.add_json(h, help="one JSON object per line")
    options.add_endpoint(
        h,
        help="the daemon whose journal to read (default: TURNPOOL_ENDPOINT or the default endpoint)",
        timeout=False,
    )
    h.set_defaults(func=history)

    r = sub.add_parser("result", help="print one past turn's result as JSON")
    r.add_argument("turn_id")
    r.add_argument("--journal", default=None, help="journal file (default: the daemon's at --endpoint)")
    r.add_argument(
        "--steps",
        action="store_true",
        help="print {turn_id, result, steps}: its model steps and each tool call's state (running turns too)",
    )
    options.add_json(r, help="print the result as JSON (the default output already is)")
    options.add_endpoint(r, help="the daemon whose journal to read", timeout=False)
    r.set_defaults(func=result)


def _path(args: argparse.Namespace) -> str:
    """``--journal``, else the journal of the daemon at ``--endpoint`` (CLI-HISTORY): asked of the
    daemon when it runs, else that endpoint's default path. Raises ``JournalError`` when the
    running daemon keeps no journal."""
    from ..journal import JournalError, default_journal_path  # here: only these commands read a journal

    if args.journal:
        return str(args.journal)
    endpoint = check_endpoint(args.endpoint or default_endpoint())
    running, journal = _daemon_journal(endpoint)
    if running and journal is None:
        raise JournalError(
            f"the daemon at {endpoint} runs without a journal (serve --no-journal): it keeps no past turns"
        )
    if journal is not None:
        return journal
    path = default_journal_path(endpoint)
    if not running and not path.exists():
        raise JournalError(
            f"no daemon is running at {endpoint} and it has no journal at {path}; a daemon started "
            "with --journal PATH: pass --journal PATH"
        )
    return str(path)


DAEMON_ASK_TIMEOUT = 5.0  # seconds to ask a running daemon where its journal is


def _daemon_journal(endpoint: str) -> tuple[bool, str | None]:
    """``(running, journal path or None)`` from the daemon at ``endpoint``; ``(False, None)`` when
    no daemon answers. A daemon too old to say where its journal is: ``(True, default path)``."""
    import anyio

    from .._errors import DaemonUnavailable
    from ..client.client import Client
    from ..journal import default_journal_path  # here: only these commands read a journal

    async def ask() -> dict[str, Any]:
        async with Client.connect(endpoint, timeout=DAEMON_ASK_TIMEOUT) as client:
            return dict((await client.status()).get("daemon", {}))

    try:
        daemon = anyio.run(ask, backend="asyncio")
    except DaemonUnavailable:
        return False, None
    if "journal" not in daemon:
        return True, str(default_journal_path(endpoint))
    journal = daemon["journal"]
    return True, (str(journal) if journal else None)


def history_json(row: dict[str, Any]) -> dict[str, Any]:
    """A journal row as ``history --json`` prints it: the cause as in results (CLI-CAUSE)."""
    out = dict(row)
    out["cause"] = {"kind": row["cause"]} if row.get("cause") else None
    return out


HISTORY_COLUMNS = ("turn_id", "agent", "session", "state", "outcome", "cause", "attempts", "accepted", "took")


def _cells(row: dict[str, Any]) -> tuple[str, ...]:
    took = ""
    if row["ended_at"] and row["started_at"]:
        took = f"{(row['ended_at'] - row['started_at']) * 1000:.0f} ms"
    return (
        row["turn_id"],
        row["agent"],
        row["session"] or "",
        row["state"],
        row["outcome"] or "",
        row["cause"] or "",
        str(row["attempts"]),
        iso_utc(row["accepted_at"]),
        took,
    ) + ((row["steps"],) if "steps" in row else ())


def history(args: argparse.Namespace) -> int:
    from ..journal import JournalError, read_history  # here: only these commands read a journal

    try:
        path = _path(args)
        rows = read_history(
            path, session=args.session, outcome=args.outcome, since=args.since, limit=args.limit
        )
    except (JournalError, ValueError) as exc:
        print(f"turnpool history: {exc}", file=sys.stderr)
        return 2
    if args.steps:  # LOOP-STEP-INSPECT
        for row in rows:
            row["steps"] = steps_summary(turn_steps(path, row["turn_id"]))
    if args.json:
        for row in rows:
            print(json.dumps(history_json(row)))
        return 0
    if not sys.stdout.isatty():  # CLI-PLAIN: plain, whole values, one header row
        print("\t".join(HISTORY_COLUMNS + (("steps",) if args.steps else ())))
        for row in rows:
            print("\t".join(" ".join(c.split()) if c else "" for c in _cells(row)))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"turns in {path}")
    for col in HISTORY_COLUMNS + (("steps",) if args.steps else ()):
        table.add_column(col)
    for row in rows:
        table.add_row(*_cells(row))
    Console().print(table)
    return 0


def result(args: argparse.Namespace) -> int:
    from ..journal import JournalError, read_result  # here: only these commands read a journal

    try:
        check_known_id("TURN_ID", args.turn_id)
        path = _path(args)
        if args.steps:  # LOOP-STEP-INSPECT: a turn still running (or crashed, before it resumed) too
            return _print_steps(path, args.turn_id)
        res = read_result(path, args.turn_id)
    except (JournalError, ValueError) as exc:
        print(f"turnpool result: {exc}", file=sys.stderr)
        return 2
    except UnknownTurn as exc:
        print(f"turnpool result: {exc}", file=sys.stderr)
        return 1
    if res is None:
        print(f"turnpool result: turn {shown_id(args.turn_id)} has not ended yet", file=sys.stderr)
        return 1
    print(msgspec.json.encode(res).decode())
    return 0


def _print_steps(path: str, turn_id: str) -> int:
    from ..journal import read_result  # here: only these commands read a journal

    try:
        res = read_result(path, turn_id)
    except UnknownTurn as exc:
        print(f"turnpool result: {exc}", file=sys.stderr)
        return 1
    steps = turn_steps(path, turn_id)
    out = {
        "turn_id": turn_id,
        "result": msgspec.to_builtins(res) if res is not None else None,
        "steps": steps,
    }
    print(msgspec.json.encode(out).decode())
    return 0
