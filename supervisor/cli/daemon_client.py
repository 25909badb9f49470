"""The commands that talk to a running daemon through a ``Client``: ``submit``, ``cancel``,
``status``, ``reload``.

Exit codes: 0 done (``submit --wait``/``--follow``: the turn ``completed``), 1 failed (the daemon
is unreachable or refused, or the waited-for turn did not complete), 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

import wire

from .._errors import InvalidAgent, TurnpoolError
from .._exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, innermost
from .._tracing import CALLER_TRACE, valid_traceparent
from . import options


def register(subparsers: Any) -> None:
    submit = subparsers.add_parser("submit", help="submit a turn to the daemon")
    submit.add_argument("agent", help="the agent, written package.module:attr")
    submit.add_argument("--input", default=None, help="the turn's input as JSON (default: null)")
    submit.add_argument("--session", default=None)
    submit.add_argument("--timeout", type=float, default=None, help="seconds the turn may run")
    submit.add_argument("--turn-id", default=None, help="idempotency key: an existing id is not run again")
    waiting = submit.add_mutually_exclusive_group()
    waiting.add_argument(
        "--wait",
        action="store_true",
        help="wait and print the result as JSON (the turn id goes to stderr first; Ctrl-C cancels the turn)",
    )
    waiting.add_argument(
        "--follow",
        action="store_true",
        help="print events as JSON lines, then the result (Ctrl-C cancels the turn, as with --wait)",
    )
    options.add_json(
        submit, help='print {"turn_id": ...} instead of the bare id (--wait/--follow print JSON anyway)'
    )
    options.add_endpoint(submit)
    submit.set_defaults(func=cmd_submit)

    cancel = subparsers.add_parser("cancel", help="cancel a turn or a session (cause user)")
    cancel.add_argument("turn_id", nargs="?", default=None)
    cancel.add_argument("--session", default=None, help="cancel the session's running and queued turns")
    options.add_json(cancel, help="print what was cancelled as JSON (the default output already is)")
    options.add_endpoint(cancel)
    cancel.set_defaults(func=cmd_cancel)

    status = subparsers.add_parser("status", help="workers, queue and outcome counts of the daemon")
    options.add_json(status, help="print the raw status as JSON")
    options.add_endpoint(status)
    status.set_defaults(func=cmd_status)

    reload = subparsers.add_parser(
        "reload",
        help="recycle the daemon's workers so new turns run edited agent code",
        description=(
            "Replace every worker of the daemon gracefully: a worker running a turn finishes it on the "
            "code it had imported, then is replaced; idle workers are replaced at once; every turn that "
            "starts after the reload runs on a fresh worker, which imports agent modules anew. Workers "
            "cache what they imported (modules, their globals, clients they built) for their whole "
            "life: without a reload, edited agent code reaches only workers started after the edit."
        ),
    )
    options.add_json(reload, help='print {"workers": N, "busy": B} as JSON')
    options.add_endpoint(reload)
    reload.set_defaults(func=cmd_reload)


def _fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"turnpool: {message}", file=sys.stderr, flush=True)
    return code


def _client(args: argparse.Namespace) -> Any:
    from ..client.client import Client

    return Client.connect(args.endpoint, timeout=args.connect_timeout)


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _run(fn: Callable[[], Any]) -> int:
    """Run an async command; map turnpool's errors to messages and exit codes."""
    try:
        return int(anyio.run(fn, backend="asyncio"))
    except BaseException as exc:  # CLI-ONE-LINE: the same one line whether or not a task group wrapped it
        if innermost(exc, (BrokenPipeError, KeyboardInterrupt)) is not None:
            raise  # ``main`` ends those (quietly, 141; 130)
        usage = innermost(exc, (InvalidAgent, TypeError, ValueError))
        if usage is not None:
            return _fail(str(usage), EXIT_USAGE)
        refused = innermost(exc, TurnpoolError)
        if refused is not None:
            return _fail(str(refused))
        raise


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        data = json.loads(args.input) if args.input is not None else None
    except json.JSONDecodeError as exc:
        return _fail(f"--input is not valid JSON: {exc}", EXIT_USAGE)
    except RecursionError:  # LINK-DEPTH
        return _fail(f"--input {wire.TOO_DEEP}", EXIT_USAGE)

    async def main() -> int:
        async with _client(args) as client:
            if not (args.wait or args.follow):
                handle = await client.submit(
                    args.agent, data, session=args.session, timeout=args.timeout, turn_id=args.turn_id
                )
                print(_json({"turn_id": handle.turn_id}) if args.json else handle.turn_id, flush=True)
                return EXIT_OK
            return await _submit_and_wait(client, args, data)

    # OBS-TRACE: a trace context handed down the environment (W3C's TRACEPARENT; an invalid one is ignored).
    CALLER_TRACE.set(valid_traceparent(os.environ.get("TRACEPARENT")))
    return _run(main)


async def _submit_and_wait(client: Any, args: argparse.Namespace, data: Any) -> int:
    """``submit --wait``/``--follow`` (CLI-INTERRUPT): the turn id goes to stderr before any waiting, so it is
    never lost. The first Ctrl-C (SIGINT) cancels the turn (cause user) and waits for its end; a
    second stops waiting at once and leaves the turn to its escalation ladder, naming the commands
    that follow it up. Exit 130 either way."""
    interrupts = 0
    handle: Any = None
    second = anyio.CancelScope()

    async def on_sigint(signals: Any) -> None:
        nonlocal interrupts
        async for _ in signals:
            interrupts += 1
            if handle is None:
                continue  # the submit is on its way: cancelled as soon as it is acknowledged
            if interrupts == 1:
                _say(
                    f"Ctrl-C: cancelling turn {handle.turn_id} (cause user) and waiting for it to stop; "
                    "Ctrl-C again to stop waiting"
                )
                await handle.cancel()
            else:
                second.cancel()
                return

    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        async with anyio.create_task_group() as tg:
            tg.start_soon(on_sigint, signals)
            handle = await client.submit(
                args.agent, data, session=args.session, timeout=args.timeout, turn_id=args.turn_id
            )
            _say(f"turn {handle.turn_id} submitted; waiting for its end (Ctrl-C cancels it)")
            if interrupts:
                _say(f"Ctrl-C: cancelling turn {handle.turn_id} (cause user)")
                await handle.cancel()
            result = None
            with second:
                if args.follow:
                    async for event in handle.events():
                        print(_json(event), flush=True)
                result = await handle.result()
                print(_json(result), flush=True)
            tg.cancel_scope.cancel()
    if result is None:
        _say(
            f"stopped waiting; turn {handle.turn_id} was asked to stop and ends on its own (grace, then "
            f"SIGTERM/SIGKILL): `turnpool result {handle.turn_id}` shows its end"
        )
        return EXIT_INTERRUPTED
    if interrupts:
        _say(f"turn {handle.turn_id} cancelled: it ended {result.outcome}")
        return EXIT_INTERRUPTED
    return EXIT_OK if result.outcome == "completed" else EXIT_FAILED


def _say(message: str) -> None:
    print(f"turnpool: {message}", file=sys.stderr, flush=True)


def cmd_cancel(args: argparse.Namespace) -> int:
    if (args.turn_id is None) == (args.session is None):
        return _fail("cancel: give either TURN_ID or --session S", EXIT_USAGE)
    if args.turn_id is not None and not args.turn_id.strip():
        return _fail("cancel: TURN_ID must not be empty", EXIT_USAGE)
    if args.session is not None and not args.session:
        return _fail("cancel: --session must not be empty", EXIT_USAGE)

    async def main() -> int:
        async with _client(args) as client:
            if args.session is not None:
                ids = await client.cancel_session(args.session)
                print(_json({"session": args.session, "cancelled": ids}), flush=True)
            else:
                cause = await client.cancel(args.turn_id)
                print(_json({"turn_id": args.turn_id, "cause": cause}), flush=True)
        return EXIT_OK

    return _run(main)


def cmd_status(args: argparse.Namespace) -> int:
    async def main() -> int:
        async with _client(args) as client:
            st = await client.status()
        if args.json:
            print(_json(st), flush=True)
        elif sys.stdout.isatty():
            render_status(st)
        else:
            print_status_plain(st)
        return EXIT_OK

    return _run(main)


def print_status_plain(st: dict[str, Any]) -> None:
    """``status`` when stdout is not a terminal (CLI-PLAIN): tab-separated plain text, every value whole.

    One ``key<TAB>value`` line per daemon fact, then a ``worker`` header line and one ``worker`` row
    per worker (``grep ^worker``, ``cut -f``): nothing is cut to a terminal's width."""
    daemon = st.get("daemon", {})
    esc = st.get("escalations", {})
    outcomes = st.get("outcomes", {})
    facts: list[tuple[str, Any]] = [
        ("pid", daemon.get("pid", st.get("pid"))),
        ("endpoint", daemon.get("endpoint", "")),
        ("state", st.get("state")),
        ("accepting", "yes" if daemon.get("accepting", True) else "no"),
    ]
    if "journal" in daemon:
        facts.append(("journal", daemon["journal"] or "none"))
    if daemon.get("journal_error"):
        facts.append(("journal_error", daemon["journal_error"]))
    facts += [("queue", st.get("queue", 0)), ("running", st.get("running", 0))]
    facts += [
        (name, outcomes.get(name, 0)) for name in ("completed", "failed", "aborted", "killed", "crashed")
    ]
    facts += [
        ("sigterm", esc.get("sigterm", 0)),
        ("sigkill", esc.get("sigkill", 0)),
        ("worker_restarts", st.get("worker_restarts", 0)),
        ("malformed_frames", daemon.get("malformed_frames", 0)),
    ]
    if st.get("worker_output"):
        facts.append(("worker_output", st["worker_output"]))
    lines = [f"{key}\t{_plain(value)}" for key, value in facts]
    lines.append("\t".join(("worker", "id", "pid", "state", "turn", "turns_run", "rss_mb")))
    for w in st.get("workers", []):
        cells = (w["id"], w["pid"], w["state"], w["turn_id"] or "-", w["turns_run"], f"{w['rss_mb']:.1f}")
        lines.append("\t".join(("worker", *map(_plain, cells))))
    print("\n".join(lines), flush=True)


def _plain(value: Any) -> str:
    """A value for a tab-separated cell: tabs and newlines inside it become spaces."""
    return " ".join(str(value).split("\t")).replace("\n", " ")


def cmd_reload(args: argparse.Namespace) -> int:
    async def main() -> int:
        async with _client(args) as client:
            done = await client.reload()
        if args.json:
            print(_json(done), flush=True)
        else:
            print(
                f"reloading: {done['workers']} worker(s) replaced, {done['busy']} of them after their "
                "running turn; new turns run on fresh workers",
                flush=True,
            )
        return EXIT_OK

    return _run(main)


def render_status(st: dict[str, Any]) -> None:
    """A readable status: the workers table, then the queue and the counts per outcome."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout, width=max(100, Console().width))
    daemon = st.get("daemon", {})
    console.print(
        f"turnpool daemon pid {daemon.get('pid', st.get('pid'))} at {daemon.get('endpoint', '?')} "
        f"({st.get('state')}{'' if daemon.get('accepting', True) else ', not accepting'})"
    )
    if daemon.get("journal_error"):  # JOURNAL-UNAVAILABLE: why submits are refused
        console.print(f"journal unavailable: {daemon['journal_error']}", markup=False)
    table = Table(title="workers")
    for col in ("id", "pid", "state", "turn", "turns run", "RSS MiB"):
        table.add_column(col, justify="right" if col in ("pid", "turns run", "RSS MiB") else "left")
    for w in st.get("workers", []):
        table.add_row(
            str(w["id"]),
            str(w["pid"]),
            str(w["state"]),
            w["turn_id"] or "-",
            str(w["turns_run"]),
            f"{w['rss_mb']:.1f}",
        )
    console.print(table)
    console.print(f"queue depth: {st.get('queue', 0)}   running: {st.get('running', 0)}")
    if st.get("worker_output"):
        console.print(f"workers' output: {st['worker_output']}")
    outcomes = st.get("outcomes", {})
    counts = Table(title="turns by outcome")
    counts.add_column("outcome")
    counts.add_column("turns", justify="right")
    for name in ("completed", "failed", "aborted", "killed", "crashed"):
        counts.add_row(name, str(outcomes.get(name, 0)))
    console.print(counts)
    esc = st.get("escalations", {})
    console.print(
        f"escalations: sigterm {esc.get('sigterm', 0)}, sigkill {esc.get('sigkill', 0)}   "
        f"worker restarts: {st.get('worker_restarts', 0)}   "
        f"malformed frames: {daemon.get('malformed_frames', 0)}"
    )
