"""The ``turnpool`` console script.

Each command lives in its own module and registers itself here: a module in
``COMMAND_MODULES`` exposes ``register(subparsers)``, which adds its parser and sets
``func=callable(args) -> int`` (the exit code) on it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence

from .._exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_PIPE, EXIT_USAGE, innermost

# Modules that add commands; one job each.
COMMAND_MODULES: tuple[str, ...] = (
    "supervisor.cli.serve",  # serve: the daemon itself
    "supervisor.cli.daemon_client",  # submit, cancel, status, reload: talk to a running daemon
    "supervisor.cli.journal",  # history, result
    "supervisor.cli.batch",  # batch
    "supervisor.cli.acp",  # acp
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnpool",
        description="Process-isolated worker pool for agent turns, with hard termination.",
    )
    parser.add_argument("--version", action=_VersionAction)
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


class _VersionAction(argparse.Action):
    """``--version``: argparse's own action, except that the version is read when asked for, not
    each time the parser is built (reading it imports ``importlib.metadata``)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(
            option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help="show the version and exit"
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        with contextlib.suppress(OSError):  # as argparse's own: what cannot be written is dropped
            sys.stdout.write(f"turnpool {_version()}\n")
        parser.exit()


def _version() -> str:
    """The package's version (``turnpool --version``): ``supervisor.__version__``, the one source."""
    from supervisor import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)  # ``--help`` and ``--version`` print here
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return int(args.func(args) or 0)
    except BaseException as exc:  # noqa: BLE001 - CLI-ONE-LINE: every command, every path: one line, a documented code
        return _exit_for(exc)


def _exit_for(exc: BaseException) -> int:
    """What an error that reached the top of a command prints and exits with: a closed stdout
    (``turnpool history | head -1``) ends quietly with ``EXIT_PIPE``; Ctrl-C with 130; a
    ``SystemExit`` keeps its code; anything else is one line naming it, exit 1 (the traceback
    only with ``TURNPOOL_TRACEBACK=1``)."""
    if innermost(exc, BrokenPipeError) is not None:
        _silence_stdout()
        return EXIT_PIPE
    if innermost(exc, KeyboardInterrupt) is not None:
        return EXIT_INTERRUPTED
    if isinstance(exc, SystemExit):
        raise exc
    if os.environ.get("TURNPOOL_TRACEBACK") == "1":
        raise exc
    inner = innermost(exc, Exception) or exc
    text = " ".join(str(inner).split())[:500]
    print(f"turnpool: unexpected error: {type(inner).__name__}: {text}", file=sys.stderr, flush=True)
    return EXIT_FAILED


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of what could not be
    written raises nothing more (Python's documented way out of a ``BrokenPipeError``)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def entry() -> None:
    sys.exit(main())
