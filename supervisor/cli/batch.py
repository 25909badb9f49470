"""``turnpool batch JOBS.jsonl --agent A -o OUT.jsonl``: the command of the batch runner.

The runner itself (``run_batch``, the jobs, the results file, the engine, the views) is
``supervisor.batch``; this module declares the command's options (the shared ones from
``options.py``), validates its input, shows progress, handles Ctrl-C / SIGTERM and returns one of
the exit codes named in ``exits.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any

import anyio

from .._backend import open_backend
from .._errors import TurnpoolError
from .._exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE
from ..batch import default_concurrency
from ..batch.runner import (
    DEFAULT_RETRY_ON,
    RETRYABLE,
    BatchInputError,
    BatchPlan,
    BatchRun,
    BatchSummary,
    OutputNotEmpty,
    prepare_batch,
)
from . import cluster, options

if TYPE_CHECKING:
    from rich.console import Console

    from ..batch.view import PlainProgress, RichProgress

EPILOG = """\
job line:  {"id": "j1", "input": {...}, "agent": "pkg.mod:fn", "timeout": 30, "session": "s"}
           (id and input; agent, timeout and session optional)
result:    {"id", "turn_id", "outcome", "final", "output", "error", "cause", "attempts",
            "submitted_at", "ended_at", "duration_s", ...}, one line per job as it ends
Ctrl-C:    the first stops submitting, cancels the running turns (cause user) and records
           them aborted, not final; a second stops waiting at once. --resume reruns them.
exit codes: 0 every job completed · 1 some did not · 2 bad usage or input (nothing ran)
            · 130 interrupted
"""


_positive_int = options.positive_int
_count = options.count
_seconds = options.seconds
_positive_seconds = options.positive_seconds


def _outcomes(text: str) -> frozenset[str]:
    names = frozenset(part.strip() for part in text.split(",") if part.strip())
    bad = names - RETRYABLE
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"takes a comma list of {', '.join(sorted(RETRYABLE))}; got {text!r}"
        )
    return names


def register(subparsers: Any) -> None:
    """Add ``turnpool batch`` to the console script."""
    p = subparsers.add_parser(
        "batch",
        help="run every job of a JSONL file, one result line per job",
        description="Run every job of JOBS.jsonl as a turn; "
        "append one JSON result line per job to OUT.jsonl. What the embedded pool's workers "
        "print goes to stderr, each line prefixed w<n>[<pid>] (forwarded by a thread: it never "
        "blocks the pool).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("jobs", metavar="JOBS.jsonl", help="one JSON job per line")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT.jsonl",
        help="results, appended (never the jobs file); '-': standard output, the summary then goes to stderr",
    )
    p.add_argument("--agent", metavar="A", help="'package.module:attr' for jobs without an 'agent' key")
    options.add_pool_or_daemon(
        p,
        workers_default=None,
        workers_help="embedded pool size (default: one per core)",
        connect_help="run on the daemon at E (no value: the default endpoint)",
        connect_default_endpoint=True,
    )
    options.add_path(p)
    cluster.add_ray_options(p)
    p.add_argument(
        "--concurrency",
        type=_positive_int,
        metavar="N",
        help="turns submitted at a time (default: 64 per worker, at least 16)",
    )
    p.add_argument(
        "--timeout", type=_positive_seconds, metavar="S", help="per-job timeout unless the job sets one"
    )
    options.add_ladder(
        p,
        grace_help="seconds a cancelled turn has to stop",
        kill_after_help="seconds from SIGTERM to SIGKILL",
    )
    p.add_argument(
        "--retries", type=_count, default=0, metavar="K", help="extra attempts per job (default 0)"
    )
    p.add_argument(
        "--retry-on",
        type=_outcomes,
        default=DEFAULT_RETRY_ON,
        metavar="OUTCOMES",
        help="outcomes retried (default crashed,killed)",
    )
    p.add_argument("--resume", action="store_true", help="skip jobs with a final line in OUT; run the rest")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first job that does not complete")
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="run the valid jobs and record invalid lines (outcome invalid)",
    )
    p.add_argument("--fsync", action="store_true", help="fsync after each line (survives power loss)")
    p.add_argument(
        "--progress-interval",
        type=_positive_seconds,
        default=5.0,
        metavar="S",
        help="seconds between plain progress lines when stderr is not a terminal (default 5)",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="show the pool's warnings (escalations, crashes)"
    )
    options.add_json(p, help="print the summary as one JSON object (on stderr with -o -)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """``turnpool batch``: validate, then run; returns the exit code."""
    from rich.console import Console  # here, not at the top: every other command would pay for it

    err = Console(stderr=True, highlight=False)
    conflict = cluster.ray_conflict(args)
    if conflict is not None:
        print(f"turnpool batch: {conflict}", file=sys.stderr)
        return EXIT_USAGE
    if args.path and args.connect is not None:
        print(
            "turnpool batch: --path is for the embedded pool; with --connect the daemon's own --path "
            "decides where agents are imported from",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        from .._engine import check_agent_path

        check_agent_path(args.path or ())
    except (TypeError, ValueError) as exc:
        print(f"turnpool batch: --path: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        plan = prepare_batch(
            args.jobs, args.output, agent=args.agent, resume=args.resume, skip_invalid=args.skip_invalid
        )
    except BatchInputError as exc:
        for bad in exc.invalid[:50]:
            print(f"{args.jobs}:{bad.line}: {bad.message}", file=sys.stderr)
        if len(exc.invalid) > 50:
            print(f"... and {len(exc.invalid) - 50} more invalid line(s)", file=sys.stderr)
        print(
            f"turnpool batch: {len(exc.invalid)} invalid line(s): nothing ran "
            "(fix them, or pass --skip-invalid to run the others)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except (OutputNotEmpty, OSError) as exc:
        print(f"turnpool batch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for bad in plan.record_invalid:
        print(f"{args.jobs}:{bad.line}: {bad.message} (recorded invalid)", file=sys.stderr)
    if plan.previous.torn_bytes:
        print(f"turnpool batch: dropped an incomplete last line of {args.output}", file=sys.stderr)
    _setup_logging(err, args.verbose)
    try:
        return anyio.run(_run_command, args, plan, err)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseException as exc:
        broke = _turnpool_error(exc)
        if broke is None:
            raise
        print(
            f"turnpool batch: {type(broke).__name__}: {broke} (finished jobs are recorded; "
            "--resume continues)",
            file=sys.stderr,
        )
        return EXIT_FAILED


def _turnpool_error(exc: BaseException) -> TurnpoolError | None:
    """The backend error inside ``exc`` (task groups wrap it in exception groups), if any."""
    if isinstance(exc, TurnpoolError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _turnpool_error(inner)
            if found is not None:
                return found
    return None


def _setup_logging(console: Console, verbose: bool) -> None:
    """The pool logs each escalation and crash as a warning; the results file already holds them,
    so the command shows them only with ``--verbose`` (errors always), above the progress bar."""
    from rich.logging import RichHandler

    logger = logging.getLogger("turnpool")
    if not any(isinstance(h, RichHandler) for h in logger.handlers):
        logger.addHandler(RichHandler(console=console, show_path=False, show_time=False))
    logger.setLevel(logging.WARNING if verbose else logging.ERROR)


async def _run_command(args: argparse.Namespace, plan: BatchPlan, err: Console) -> int:
    from rich.console import Console

    from ..batch.view import PlainProgress, RichProgress, print_summary, summary_json

    view: PlainProgress | RichProgress
    view = RichProgress(err) if err.is_terminal else PlainProgress(sys.stderr, args.progress_interval)
    state: dict[str, Any] = {"run": None, "signals": 0}
    if args.resume and plan.previous.lines:
        done = len(plan.jobs) - len(plan.pending)
        print(
            f"turnpool batch: resuming batch {plan.batch}: {done} job(s) done earlier, "
            f"{len(plan.pending)} to run",
            file=sys.stderr,
        )

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            opening = anyio.CancelScope()

            async def watch_signals() -> None:
                async for signum in signals:
                    state["signals"] += 1
                    run: BatchRun | None = state["run"]
                    name = signal.Signals(signum).name
                    if run is None:
                        opening.cancel()  # not running yet: stop starting the pool
                    elif state["signals"] == 1:
                        running = run.snapshot().running
                        print(
                            f"\nturnpool batch: {name}: stopping — cancelling {running} running job(s); "
                            "again to stop at once",
                            file=sys.stderr,
                            flush=True,
                        )
                        run.interrupt()
                    elif state["signals"] == 2:
                        print(f"turnpool batch: {name}: stopping at once", file=sys.stderr, flush=True)
                        run.abandon()

            ticking = anyio.CancelScope()

            async def tick(run: BatchRun) -> None:
                with ticking:  # until the run returns (not through the pool's disposal)
                    while True:
                        await anyio.sleep(min(1.0, args.progress_interval))
                        view.tick(run.snapshot())

            tg.start_soon(watch_signals)
            summary: BatchSummary | None = None
            try:
                with opening:
                    async with open_backend(
                        workers=args.workers,
                        connect=args.connect,
                        grace=args.grace,
                        kill_after=args.kill_after,
                        agent_path=tuple(args.path or ()),
                        ray=args.ray,
                        workers_per_node=args.workers_per_node,
                    ) as backend:
                        concurrency = args.concurrency or await default_concurrency(backend)
                        run = BatchRun(
                            plan,
                            backend,
                            concurrency=concurrency,
                            timeout=args.timeout,
                            grace=args.grace,
                            kill_after=args.kill_after,
                            retries=args.retries,
                            retry_on=args.retry_on,
                            fail_fast=args.fail_fast,
                            progress=view.update,
                            fsync=args.fsync,
                        )
                        state["run"] = run
                        if state["signals"]:
                            run.interrupt()
                        if isinstance(view, RichProgress):
                            view.start()
                        tg.start_soon(tick, run)
                        try:
                            summary = await run.run()
                        finally:
                            ticking.cancel()
                            view.close()
            finally:
                tg.cancel_scope.cancel()
    if summary is None:
        print("turnpool batch: interrupted before any job ran", file=sys.stderr)
        return EXIT_INTERRUPTED
    to_stdout = args.output != "-"  # ``-o -``: stdout holds the results, the summary goes to stderr
    if args.json:
        print(json.dumps(summary_json(summary)), file=sys.stdout if to_stdout else sys.stderr, flush=True)
    else:
        print_summary(Console(highlight=False, stderr=not to_stdout), summary)
    return summary.exit_code
