"""``turnpool acp --agent A [--workers N | --connect E]``: the command of the ACP front end.

Declares the command's options (the shared ones from ``options.py``), checks them, claims the
stdio channel and runs ``supervisor.acp.stdio.serve``; returns one of the exit codes named in
``supervisor/_exitcodes.py``. The ``agent-client-protocol`` package (the ``acp`` extra) is imported
only when the command runs, so the rest of the CLI works without it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import anyio

from .._checks import check_agent
from .._errors import InvalidAgent, TurnpoolError
from .._exitcodes import EXIT_FAILED, EXIT_USAGE
from ..acp.stdio import claim_stdio, serve
from . import options


def register(subparsers: Any) -> None:
    """Add ``turnpool acp`` to the console script."""
    parser = subparsers.add_parser(
        "acp",
        help="an Agent Client Protocol agent over stdio, for editors",
        description="Serve AGENT to an editor over the Agent Client Protocol (stdio). Each prompt runs "
        "as a turnpool turn; session/cancel cancels it (cause user), and a turn that ignores "
        "the cancel is killed after its grace. What the embedded pool's workers print goes to "
        "stderr, each line prefixed w<n>[<pid>]; stdout carries the protocol alone.",
    )
    parser.add_argument("--agent", required=True, metavar="A", help="the agent, 'package.module:attr'")
    options.add_pool_or_daemon(
        parser,
        workers_default=2,
        workers_help="embedded pool size (default 2)",
        connect_help="run turns on the serve daemon at endpoint E instead of an embedded pool",
    )
    options.add_ladder(
        parser,
        grace_help="seconds a cancelled turn has to stop before its worker is killed "
        "(default: the pool's, 5 when embedded)",
        kill_after_help="seconds between SIGTERM and SIGKILL (default: the pool's, 2 when embedded)",
    )
    parser.add_argument(
        "--spares", type=options.spares, default=1, metavar="K", help="warm spare workers (default 1)"
    )
    options.add_path(parser)
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level of the messages written to stderr (default WARNING)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The ``acp`` command: returns the exit code."""
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, args.log_level),
        format="turnpool acp: %(levelname)s %(name)s: %(message)s",
    )
    try:
        check_agent(args.agent)
    except InvalidAgent as exc:
        print(f"turnpool acp: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        import acp  # noqa: F401
    except ImportError:
        print(
            "turnpool acp: needs the agent-client-protocol package: pip install 'turnpool[acp]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.connect is None and (args.workers < 1 or args.spares < 0):
        print("turnpool acp: --workers must be >= 1 and --spares >= 0", file=sys.stderr)
        return EXIT_USAGE
    if args.path and args.connect is not None:
        print(
            "turnpool acp: --path is for the embedded pool; with --connect the daemon's own --path decides",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        proto_in, proto_out = claim_stdio()
        return anyio.run(serve, args, proto_in, proto_out, backend="asyncio")
    except InvalidAgent as exc:  # ADAPT-PROBE: what the agent name points at, no worker can run
        print(f"turnpool acp: InvalidAgent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (TurnpoolError, OSError, ValueError, TypeError) as exc:
        print(f"turnpool acp: {exc}", file=sys.stderr)
        return EXIT_FAILED
