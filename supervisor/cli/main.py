"""The ``turnpool`` console script.

Each command lives in its own module and registers itself here: a module in
``COMMAND_MODULES`` exposes ``register(subparsers)``, which adds its parser and sets
``func=callable(args) -> int`` (the exit code) on it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .exits import EXIT_INTERRUPTED, EXIT_USAGE

# Modules that add commands; one job each.
COMMAND_MODULES: tuple[str, ...] = (
    "supervisor.cli.daemon",  # serve, submit, cancel, status, reload
    "supervisor.cli.journal",  # history, result
    "supervisor.cli.batch",  # batch
    "supervisor.cli.acp",  # acp
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnpool",
        description="Process-isolated worker pool for agent turns, with hard termination.",
    )
    parser.add_argument("--version", action="version", version=f"turnpool {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def _version() -> str:
    """The installed distribution's version (``turnpool --version``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("turnpool")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def entry() -> None:
    sys.exit(main())
