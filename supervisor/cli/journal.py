"""``turnpool history`` and ``turnpool result``: past turns read from a daemon's journal.

They read the journal file directly (read-only; SQLite's WAL lets a live daemon keep
writing), so they work whether or not the daemon is running.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

import msgspec

from wire import OUTCOMES

from .._errors import UnknownTurn
from ..daemon.journal import JournalError, default_journal_path, read_history, read_result
from . import options


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


def register(sub: Any) -> None:
    h = sub.add_parser("history", help="list past turns from the daemon's journal")
    h.add_argument("--journal", default=None, help="journal file (default: the daemon's at --endpoint)")
    h.add_argument("--session")
    h.add_argument("--outcome", choices=OUTCOMES)
    h.add_argument("--since", type=_since, help="epoch seconds, ISO time, or an age like 2h")
    h.add_argument("--limit", type=int, default=100)
    h.add_argument("--json", action="store_true", help="one JSON object per line")
    options.add_endpoint(
        h,
        help="the daemon whose journal to read (default: TURNPOOL_ENDPOINT or the default endpoint)",
        timeout=False,
    )
    h.set_defaults(func=history)

    r = sub.add_parser("result", help="print one past turn's result as JSON")
    r.add_argument("turn_id")
    r.add_argument("--journal", default=None, help="journal file (default: the daemon's at --endpoint)")
    options.add_endpoint(r, help="the daemon whose journal to read", timeout=False)
    r.set_defaults(func=result)


def _path(args: argparse.Namespace) -> str:
    """``--journal``, else the journal of the daemon at ``--endpoint`` (or the default endpoint)."""
    return args.journal or str(default_journal_path(args.endpoint))


def history(args: argparse.Namespace) -> int:
    try:
        rows = read_history(
            _path(args), session=args.session, outcome=args.outcome, since=args.since, limit=args.limit
        )
    except JournalError as exc:
        print(f"turnpool history: {exc}", file=sys.stderr)
        return 2
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"turns in {_path(args)}")
    for col in ("turn_id", "agent", "session", "state", "outcome", "cause", "attempts", "accepted", "took"):
        table.add_column(col)
    for row in rows:
        took = ""
        if row["ended_at"] and row["started_at"]:
            took = f"{(row['ended_at'] - row['started_at']) * 1000:.0f} ms"
        table.add_row(
            row["turn_id"],
            row["agent"],
            row["session"] or "",
            row["state"],
            row["outcome"] or "",
            row["cause"] or "",
            str(row["attempts"]),
            dt.datetime.fromtimestamp(row["accepted_at"]).isoformat(timespec="seconds"),
            took,
        )
    Console().print(table)
    return 0


def result(args: argparse.Namespace) -> int:
    try:
        res = read_result(_path(args), args.turn_id)
    except JournalError as exc:
        print(f"turnpool result: {exc}", file=sys.stderr)
        return 2
    except UnknownTurn as exc:
        print(f"turnpool result: {exc}", file=sys.stderr)
        return 1
    if res is None:
        print(f"turnpool result: turn {args.turn_id!r} has not ended yet", file=sys.stderr)
        return 1
    print(msgspec.json.encode(res).decode())
    return 0
