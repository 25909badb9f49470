"""The batch runner: ``turnpool batch JOBS.jsonl --agent A -o OUT.jsonl``, and ``run_batch`` for Python.

Every job of a JSONL file runs as one turn (retried as asked) and ends with one JSON line in
the output, appended and flushed as it ends. The pool is embedded (``--workers N``) or a
running daemon (``--connect E``); the two paths differ only in how the backend is opened
(``open_backend``). Layers: ``jobs.py`` (input and validation), ``out.py`` (the results
file), ``runner.py`` (the engine), ``view.py`` (progress and summary), this module (the public API);
the command itself is ``supervisor/cli/batch.py``. See ``docs/batch.md``.

Exit codes of ``turnpool batch``:

* ``0`` (``EXIT_OK``) — every job ended ``completed``;
* ``1`` (``EXIT_FAILED``) — some job did not (failed, aborted, killed, crashed, invalid, or
  stopped by ``--fail-fast``), or the backend broke;
* ``2`` (``EXIT_USAGE``) — bad usage or bad input: nothing ran;
* ``130`` (``EXIT_INTERRUPTED``) — interrupted (Ctrl-C / SIGINT, or SIGTERM); ``--resume`` continues.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from os import PathLike
from typing import Any

from .._backend import open_backend
from .._exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from .jobs import InvalidLine, Job, load_jobs, turn_id_for
from .out import ResultLog, read_previous
from .runner import (
    DEFAULT_RETRY_ON,
    BatchError,
    BatchInputError,
    BatchPlan,
    BatchProgress,
    BatchRun,
    BatchSummary,
    OutputIsInput,
    OutputNotEmpty,
    ProgressCallback,
    backend_workers,
    prepare_batch,
)

__all__ = [
    "DEFAULT_RETRY_ON",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "BatchError",
    "BatchInputError",
    "BatchPlan",
    "BatchProgress",
    "BatchRun",
    "BatchSummary",
    "InvalidLine",
    "Job",
    "OutputIsInput",
    "OutputNotEmpty",
    "ResultLog",
    "load_jobs",
    "open_backend",
    "prepare_batch",
    "read_previous",
    "run_batch",
    "turn_id_for",
]


# Turns submitted at a time per worker by default (BATCH-WINDOW): as deep as the pool's own prefetch
# would hand trivial turns ahead, so a worker never waits for the batch's next submit. With 4 per
# worker (the old default) a 2-worker pool ran trivial jobs at ≈ 7k/s; with 64, ≈ 12-16k/s.
PER_WORKER = 64


async def default_concurrency(backend: Any) -> int:
    """``PER_WORKER`` times the backend's workers, at least 16: enough queued that a worker never
    waits for the next submit (a daemon adds a round trip per submit), few enough that stopping
    only has that many turns to cancel (queued ones end at once, never started)."""
    n = await backend_workers(backend)
    return max(PER_WORKER * n, 16) if n else 16


async def run_batch(
    jobs: str | PathLike[str] | Iterable[Mapping[str, Any]],
    output: str | PathLike[str],
    *,
    backend: Any = None,
    workers: int | None = None,
    agent: str | None = None,
    concurrency: int | None = None,
    timeout: float | None = None,  # noqa: ASYNC109 — each job's turn timeout, not this call's
    grace: float | None = None,
    kill_after: float | None = None,
    retries: int = 0,
    retry_on: Collection[str] = DEFAULT_RETRY_ON,
    resume: bool = False,
    skip_invalid: bool = False,
    fail_fast: bool = False,
    progress: ProgressCallback | None = None,
    fsync: bool = False,
) -> BatchSummary:
    """Run every job of ``jobs`` (a JSONL path, or mappings) and append one line per job to ``output``.

    ``backend`` is a running ``Supervisor`` or ``Client``; without one an embedded supervisor
    with ``workers`` workers is opened for the batch and disposed after it. ``progress`` is
    called (on the event loop; keep it quick) with a ``BatchProgress`` after each job ends.
    Cancelling the call records the running jobs as interrupted (not final) and cancels their
    turns. Raises ``BatchInputError``, ``OutputNotEmpty``, ``OSError`` before anything runs.
    """
    plan = prepare_batch(jobs, output, agent=agent, resume=resume, skip_invalid=skip_invalid)

    async def go(be: Any) -> BatchSummary:
        run = BatchRun(
            plan,
            be,
            concurrency=concurrency or await default_concurrency(be),
            timeout=timeout,
            grace=grace,
            kill_after=kill_after,
            retries=retries,
            retry_on=retry_on,
            fail_fast=fail_fast,
            progress=progress,
            fsync=fsync,
        )
        return await run.run()

    if backend is not None:
        return await go(backend)
    async with open_backend(workers=workers, grace=grace, kill_after=kill_after) as be:
        return await go(be)
