"""The batch engine: feeds validated jobs to a backend, records one line per job as it ends.

A *backend* is anything with the submit/cancel/status methods of ``Supervisor`` (the embedded
pool) or ``Client`` (a daemon): the engine never knows which. It keeps at most
``concurrency`` turns submitted at a time, so stopping only ever has that many to cancel.

Rules the engine keeps (see ``docs/batch.md``):

* one line per job and run, written when the job ends, in the same event-loop iteration
  (``out.ResultLog.add``: the lines of jobs that ended together share one ``write(2)``);
* turn ids are ``turn_id_for(batch, job, attempt)``: resubmitting an attempt finds its turn;
* ``interrupt()`` stops submitting, cancels the running turns with cause ``user`` and records
  each as ``aborted``/``user``/``final: false``; ``abandon()`` stops waiting at once (the same
  records, written without waiting for the turns to end);
* a retry happens only for an outcome in ``retry_on``, never for a turn someone cancelled
  (cause ``user``), never once the batch is stopping.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import random
import secrets
import signal
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from os import PathLike
from typing import Any

import anyio

from wire import OUTCOMES, TurnError, TurnResult

from .._errors import InvalidAgent, QueueFull, TurnpoolError
from .._exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from .jobs import InvalidLine, Job, load_jobs, turn_id_for
from .out import Previous, ResultLog, read_previous

log = logging.getLogger("turnpool.batch")

RETRYABLE = frozenset({"failed", "aborted", "killed", "crashed"})
DEFAULT_RETRY_ON = frozenset({"crashed", "killed"})
STOP_INTERRUPTED = "interrupted"
# BATCH-FULL: a submit refused with QueueFull is retried after a wait growing from the first to the max.
QUEUE_FULL_FIRST_WAIT = 0.05
QUEUE_FULL_MAX_WAIT = 2.0
STOP_ABANDONED = "abandoned"
STOP_FAIL_FAST = "fail-fast"


class BatchError(TurnpoolError):
    """Base of the batch runner's errors."""


class BatchInputError(BatchError, ValueError):
    """Raised by ``prepare_batch``/``run_batch`` when job lines are invalid and ``skip_invalid`` is off.

    ``invalid`` lists every bad line (number and reason), in file order.
    """

    def __init__(self, invalid: list[InvalidLine]) -> None:
        self.invalid = invalid
        more = f"; and {len(invalid) - 5} more" if len(invalid) > 5 else ""
        shown = "; ".join(map(str, invalid[:5])) + more
        super().__init__(f"{len(invalid)} invalid job line(s): {shown}")


class OutputNotEmpty(BatchError):
    """Raised by ``prepare_batch``/``run_batch`` when the output file already holds results and
    ``resume`` is off: appending would record jobs twice."""


class OutputIsInput(OutputNotEmpty):
    """Raised by ``prepare_batch``/``run_batch`` when the output file is the jobs file (through a
    symlink or a hard link too): ``resume`` would not help, results would go into the jobs."""


# ---- the plan: what this run will do, decided before anything runs ------------------------


@dataclass(slots=True)
class BatchPlan:
    """Validated jobs, what the output already holds, and the batch key of the turn ids."""

    output: str
    jobs: list[Job]
    pending: list[Job]
    invalid: list[InvalidLine]
    record_invalid: list[InvalidLine]  # invalid lines to record now (not recorded by an earlier run)
    previous: Previous
    batch: str


def prepare_batch(
    jobs: str | PathLike[str] | Iterable[Mapping[str, Any]],
    output: str | PathLike[str],
    *,
    agent: str | None = None,
    resume: bool = False,
    skip_invalid: bool = False,
) -> BatchPlan:
    """Validate every job and read the output file; nothing runs.

    Raises ``BatchInputError`` (invalid lines, unless ``skip_invalid``), ``OutputNotEmpty``
    (results already there and not ``resume``), ``OSError`` (a file cannot be read).
    """
    output = os.fspath(output)
    check_output(jobs, output, resume=resume)
    valid, invalid = load_jobs(jobs, agent)
    if invalid and not skip_invalid:
        raise BatchInputError(invalid)
    previous = read_previous(output, repair=False) if output != STDOUT else Previous()
    if not resume and (previous.lines or previous.torn_bytes):
        raise OutputNotEmpty(
            f"{output} already holds {previous.lines} result line(s): "
            "pass --resume (resume=True) to continue that batch, or choose another output"
        )
    if resume and previous.torn_bytes:
        previous = read_previous(output, repair=True)
    pending = [job for job in valid if job.key not in previous.final]
    record_invalid = [bad for bad in invalid if (bad.line, _key(bad.id)) not in previous.invalid]
    return BatchPlan(
        output, valid, pending, invalid, record_invalid, previous, previous.batch or secrets.token_hex(4)
    )


STDOUT = "-"  # ``-o -``: results go to standard output, one line each (nothing to resume from)


def check_output(jobs: object, output: str, *, resume: bool) -> None:
    """Refuse an output that cannot work, before anything runs (BATCH-OUTPUT).

    ``OutputIsInput`` when it is the jobs file itself (a symlink or hard link to it included:
    results would be appended into the jobs); ``OSError`` naming the directory when it does not
    exist or cannot be written (the pool would start, run a job and then fail to record it)."""
    if output == STDOUT:
        if resume:
            raise OutputNotEmpty("--resume needs a results file to resume from, not -o - (standard output)")
        return
    if isinstance(jobs, (str, PathLike)):
        try:
            same = os.path.samefile(jobs, output)
        except OSError:  # one of them does not exist (yet): they cannot be one file
            same = False
        if same:
            raise OutputIsInput(
                f"-o {output} is the jobs file {os.fspath(jobs)}: results would be appended into the "
                "jobs; write them to another file"
            )
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"-o {output}: no directory {folder} to write the results in; create it first"
        )
    if os.path.isdir(output):
        raise IsADirectoryError(
            f"-o {output} is a directory: name a file (for example {output}/results.jsonl)"
        )
    if not os.access(folder, os.W_OK) or (os.path.exists(output) and not os.access(output, os.W_OK)):
        raise PermissionError(f"-o {output}: this user may not write there; choose another file")


def _key(value: str | int | None) -> str | None:
    return None if value is None else (value if isinstance(value, str) else str(value))


# ---- progress and summary ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchProgress:
    """A snapshot handed to the progress callback after each job ends (and once at the start).

    ``total`` counts the jobs this run has to run (a resume leaves out the finished ones);
    ``counts`` holds final outcomes; ``interrupted`` the jobs recorded not final.
    """

    total: int
    done: int
    running: int
    counts: Mapping[str, int]
    interrupted: int
    retries: int
    elapsed: float
    stopping: str | None
    last: Mapping[str, Any] | None = None

    @property
    def rate(self) -> float:
        """Jobs ended per second so far."""
        return self.done / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds until every job has ended at the current rate (``None`` before the first)."""
        rate = self.rate
        return (self.total - self.done) / rate if rate > 0 else None


@dataclass(slots=True)
class BatchSummary:
    """What a run did. ``exit_code`` follows the CLI's contract (0/1/130)."""

    batch: str
    output: str
    jobs: int  # valid jobs in the input
    skipped: int  # finished by an earlier run (resume)
    earlier: dict[str, int]  # their final outcomes
    counts: dict[str, int] = field(default_factory=dict)  # final outcomes of this run
    by_cause: dict[tuple[str, str | None], int] = field(default_factory=dict)  # (outcome, cause kind) → jobs
    interrupted: int = 0  # jobs recorded not final this run
    not_run: int = 0  # jobs this run never submitted (stopped first)
    invalid: int = 0  # invalid lines in the input
    retries: int = 0  # extra attempts made this run
    elapsed: float = 0.0
    slowest: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None  # None, "interrupted", "abandoned" or "fail-fast"

    @property
    def ran(self) -> int:
        return sum(self.counts.values()) + self.interrupted

    @property
    def all_completed(self) -> bool:
        """Every valid job has a final ``completed`` line and no line was invalid."""
        return (
            not self.invalid
            and not self.interrupted
            and not self.not_run
            and self.stopped is None
            and all(k == "completed" for k, v in self.counts.items() if v)
            and all(k == "completed" for k, v in self.earlier.items() if v)
        )

    @property
    def exit_code(self) -> int:
        if self.stopped in (STOP_INTERRUPTED, STOP_ABANDONED):
            return EXIT_INTERRUPTED
        return EXIT_OK if self.all_completed else EXIT_FAILED


ProgressCallback = Callable[[BatchProgress], Any]


# ---- the engine ----------------------------------------------------------------------------


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _error_of(result: TurnResult) -> dict[str, str] | None:
    if result.error is not None:
        return {"type": result.error.type, "message": result.error.message}
    code = result.exit_code
    if result.outcome == "crashed":
        how = f"killed by {_signal_name(code)}" if code is not None and code < 0 else f"exit code {code}"
        return {"type": "WorkerCrashed", "message": f"the worker died running the turn ({how})"}
    if result.outcome == "killed":
        how = _signal_name(code) if code is not None and code < 0 else f"exit code {code}"
        kind = result.cause.kind if result.cause else "?"
        return {
            "type": "Killed",
            "message": f"cancelled ({kind}), grace ran out: worker tree terminated ({how})",
        }
    return None


async def backend_workers(backend: Any) -> int | None:
    """How many workers the backend runs (for the default concurrency), if it says."""
    try:
        status = await backend.status()  # async on every backend (one contract, issue 15 item 16)
        workers = status.get("workers") if isinstance(status, Mapping) else None
        if isinstance(workers, list) and workers:
            return len(workers)
    except Exception as exc:  # noqa: BLE001 — a default, never a reason to fail
        log.debug("status() failed: %s", exc)
    n = getattr(backend, "workers", None)
    return n if isinstance(n, int) and n > 0 else None


def _kill_now(backend: Any, turn_ids: Iterable[str]) -> None:
    """Second Ctrl-C on an embedded pool: SIGKILL the trees of these turns now instead of
    waiting out their grace, through ``Supervisor.kill_now`` (keyed by turn: it acts only if
    that worker still runs that turn - a turn stuck before its first await included; the turn
    ends ``killed`` and its worker is replaced as usual). A daemon client has no such step: its
    daemon escalates the turns we already cancelled."""
    kill_now = getattr(backend, "kill_now", None)
    if kill_now is None:  # a Client: the daemon's ladder applies
        return
    try:
        kill_now(turn_ids=list(turn_ids))
    except Exception as exc:  # noqa: BLE001 - best effort: disposal (grace, then kill) still ends every turn
        log.debug("could not hurry %s: %s", turn_ids, exc)


class BatchRun:
    """One run of a batch plan against a backend. ``await run()`` returns a ``BatchSummary``."""

    def __init__(
        self,
        plan: BatchPlan,
        backend: Any,
        *,
        concurrency: int,
        timeout: float | None = None,
        grace: float | None = None,
        kill_after: float | None = None,
        retries: int = 0,
        retry_on: Collection[str] = DEFAULT_RETRY_ON,
        fail_fast: bool = False,
        progress: ProgressCallback | None = None,
        fsync: bool = False,
        keep_slowest: int = 10,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive int, got {concurrency!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        bad = set(retry_on) - RETRYABLE
        if bad:
            raise ValueError(f"retry_on takes {', '.join(sorted(RETRYABLE))}; not {', '.join(sorted(bad))}")
        self.plan = plan
        self.backend = backend
        self.concurrency = concurrency
        self.timeout = timeout
        self.grace = grace
        self.kill_after = kill_after
        self.retries = retries
        self.retry_on = frozenset(retry_on)
        self.fail_fast = fail_fast
        self.progress = progress
        self.keep_slowest = keep_slowest
        self._log = ResultLog(plan.output, fsync=fsync)
        self._stopping: str | None = None
        self._running: dict[str, Any] = {}  # turn id → handle, for the turns submitted and not ended
        self._ours: set[str] = set()  # turn ids this run cancelled
        self._counts: Counter[str] = Counter()
        self._by_cause: Counter[tuple[str, str | None]] = Counter()
        self._interrupted = 0
        self._retries = 0
        self._full_waits = 0  # submits that met QueueFull and waited (BATCH-FULL)
        self._done = 0
        self._slowest: list[tuple[float, int, dict[str, Any]]] = []
        self._seq = itertools.count()
        self._t0 = 0.0
        self._scope: anyio.CancelScope | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    # ---- control -------------------------------------------------------------------------

    @property
    def stopping(self) -> str | None:
        return self._stopping

    def interrupt(self, reason: str = STOP_INTERRUPTED) -> None:
        """Stop submitting and cancel the running turns (cause ``user``); they are recorded not final.

        Safe to call from any task of the run's event loop, at any time, more than once.
        """
        if self._stopping is not None:
            return
        self._stopping = reason
        if self._tg is not None and self._running:
            self._tg.start_soon(self._cancel_running)

    def abandon(self) -> None:
        """Stop at once: record every running job as interrupted without waiting for its turn,
        and (embedded pool) take the running turns straight to the last step of the ladder."""
        running = list(self._running)
        self.interrupt()
        self._stopping = STOP_ABANDONED if self._stopping == STOP_INTERRUPTED else self._stopping
        if self._scope is not None:
            self._scope.cancel()
        _kill_now(self.backend, running)

    async def _cancel_running(self) -> None:
        for turn_id, handle in list(self._running.items()):
            await self._cancel_turn(turn_id, handle)

    async def _cancel_turn(self, turn_id: str, handle: Any) -> None:
        self._ours.add(turn_id)
        try:
            await handle.cancel()
        except Exception as exc:  # noqa: BLE001 — the turn may be gone already; its result settles it
            log.debug("cancel %s: %s", turn_id, exc)

    # ---- running -------------------------------------------------------------------------

    def snapshot(self, last: Mapping[str, Any] | None = None) -> BatchProgress:
        """The progress now (what the callback gets)."""
        return BatchProgress(
            total=len(self.plan.pending),
            done=self._done,
            running=len(self._running),
            counts=dict(self._counts),
            interrupted=self._interrupted,
            retries=self._retries,
            elapsed=time.monotonic() - self._t0,
            stopping=self._stopping,
            last=last,
        )

    def _notify(self, last: Mapping[str, Any] | None) -> None:
        if self.progress is not None:
            self.progress(self.snapshot(last))

    async def run(self) -> BatchSummary:
        """Run every pending job; returns when each has a line (or the run was stopped)."""
        self._t0 = time.monotonic()
        plan = self.plan
        with self._log:
            for bad in plan.record_invalid:
                self._log.write(
                    {
                        "id": bad.id,
                        "line": bad.line,
                        "outcome": "invalid",
                        "final": True,
                        "error": {"type": "InvalidJob", "message": bad.message},
                        "attempts": 0,
                        "batch": plan.batch,
                    }
                )
            self._notify(None)
            # ``concurrency`` lanes share one iterator: each job is taken by exactly one lane, in
            # file order, and at most ``concurrency`` turns are ever submitted and not ended.
            # (Lanes rather than a task per job: spawning a task per job cost the host more CPU
            # than the rest of the engine.)
            jobs = iter(plan.pending)
            with anyio.CancelScope() as self._scope:
                try:
                    async with anyio.create_task_group() as tg:
                        self._tg = tg
                        for _ in range(min(self.concurrency, len(plan.pending))):
                            tg.start_soon(self._lane, jobs)
                finally:
                    self._tg = None
        return self._summary()

    async def _lane(self, jobs: Iterator[Job]) -> None:
        for job in jobs:
            if self._stopping is not None:
                return
            await self._run_job(job)

    async def _run_job(self, job: Job) -> None:
        attempt = first = self.plan.previous.attempts.get(job.key, 0) + 1
        submitted_wall, submitted = time.time(), time.monotonic()
        earlier: list[dict[str, Any]] = []
        turn_id = turn_id_for(self.plan.batch, job.key, attempt)
        handle: Any = None
        try:
            while True:
                try:
                    handle = await self._submit_call(job, turn_id)
                except QueueFull:
                    handle = await self._submit_when_room(job, turn_id)  # BATCH-FULL
                except InvalidAgent as exc:  # ADAPT-PROBE: no worker can run what the name points at
                    refused = TurnResult(
                        turn_id=turn_id,
                        outcome="failed",
                        error=TurnError("InvalidAgent", str(exc)),
                        agent=job.agent,
                        session=job.session,
                    )
                    self._write(
                        job, refused, turn_id, attempt, earlier, submitted_wall, submitted, final=True
                    )
                    return
                if handle is None:  # stopped while the backend was full: this attempt never ran
                    if earlier:
                        self._write(
                            job, None, turn_id, attempt, earlier, submitted_wall, submitted, final=False
                        )
                    return
                self._running[turn_id] = handle
                try:
                    if self._stopping is not None:  # stopped while this submit was on its way
                        await self._cancel_turn(turn_id, handle)
                    result = await handle.result()
                finally:
                    self._running.pop(turn_id, None)
                # Interrupted: we cancelled it and it did not finish first (a turn that completed
                # while the abort was on its way keeps its result).
                cancelled_by_us = (
                    turn_id in self._ours
                    and result.outcome != "completed"
                    and result.cause is not None
                    and result.cause.kind == "user"
                )
                retryable = (
                    result.outcome in self.retry_on
                    and attempt - first < self.retries
                    and not (result.cause is not None and result.cause.kind == "user")
                )
                if retryable and self._stopping is None:
                    earlier.append(
                        {
                            "turn_id": turn_id,
                            "outcome": result.outcome,
                            "error": _error_of(result),
                            "cause": result.cause.to_dict() if result.cause else None,
                            "exit_code": result.exit_code,
                        }
                    )
                    attempt += 1
                    turn_id = turn_id_for(self.plan.batch, job.key, attempt)
                    self._retries += 1
                    continue
                self._write(
                    job,
                    result,
                    turn_id,
                    attempt,
                    earlier,
                    submitted_wall,
                    submitted,
                    final=not cancelled_by_us and not retryable,
                )
                return
        except anyio.get_cancelled_exc_class():
            # Abandoned (or the caller cancelled us): the job is recorded, not final, at once.
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(2.0):
                    if handle is not None:
                        await self._cancel_turn(turn_id, handle)
                self._write(job, None, turn_id, attempt, earlier, submitted_wall, submitted, final=False)
            raise

    def _submit_call(self, job: Job, turn_id: str) -> Any:
        """The backend's submit of one attempt, not yet awaited (BATCH-DIRECT: the caller awaits it
        itself, so a job's submit costs no coroutine of the engine's own)."""
        return self.backend.submit(
            job.agent,
            job.input,
            session=job.session,
            timeout=job.timeout if job.timeout is not None else self.timeout,
            grace=self.grace,
            kill_after=self.kill_after,
            turn_id=turn_id,
        )

    async def _submit_when_room(self, job: Job, turn_id: str) -> Any:
        """The submit was refused because the backend is full (``QueueFull``: a daemon's
        ``--max-queue`` shared with other clients): wait and try again, backing off from 50 ms to
        2 s, for as long as it takes (BATCH-FULL). ``None`` when the run was stopped while waiting."""
        delay = QUEUE_FULL_FIRST_WAIT
        while True:
            if self._stopping is not None:
                return None
            self._full_waits += 1
            if self._full_waits == 1:
                log.warning("the pool's queue is full: waiting and retrying (the batch goes on)")
            await anyio.sleep(delay * (0.5 + random.random()))  # jitter: lanes do not retry in step
            delay = min(delay * 2, QUEUE_FULL_MAX_WAIT)
            if self._stopping is not None:
                return None
            try:
                return await self._submit_call(job, turn_id)
            except QueueFull:
                continue

    def _write(
        self,
        job: Job,
        result: TurnResult | None,
        turn_id: str,
        attempt: int,
        earlier: list[dict[str, Any]],
        submitted_wall: float,
        submitted: float,
        *,
        final: bool,
    ) -> None:
        duration = time.monotonic() - submitted
        by_user = result is not None and result.cause is not None and result.cause.kind == "user"
        interrupted = not final and (result is None or by_user)
        cause: dict[str, str] | None
        if result is None or interrupted:
            outcome, cause = "aborted", {"kind": "user"}
        else:
            outcome, cause = result.outcome, (result.cause.to_dict() if result.cause else None)
        record: dict[str, Any] = {
            "id": job.id,
            "turn_id": turn_id,
            "outcome": outcome,
            "final": final,
            "output": result.output if result is not None and result.outcome == "completed" else None,
            "error": _error_of(result) if result is not None else None,
            "cause": cause,
            "attempts": attempt,
            "agent": job.agent,
            "session": job.session,
            "worker_pid": result.worker_pid if result is not None else None,
            "exit_code": result.exit_code if result is not None else None,
            "submitted_at": round(submitted_wall, 6),  # epoch seconds, as in every JSON output (CLI-TIMES)
            "ended_at": round(time.time(), 6),
            "duration_s": round(duration, 6),
            "queued_s": round(result.queued_s, 6) if result is not None else None,
            "run_s": round(result.run_s, 6) if result is not None else None,
            "line": job.line,
            "batch": self.plan.batch,
        }
        if result is not None and outcome != result.outcome:
            record["turn_outcome"] = result.outcome  # e.g. interrupted, but the turn ended killed
        if earlier:
            record["previous_attempts"] = earlier
        self._log.add(record)
        self._done += 1
        if final:
            self._counts[outcome] += 1
            self._by_cause[(outcome, cause["kind"] if cause else None)] += 1
        else:
            self._interrupted += 1
        # Slowest by the turn's own run time (queueing behind other jobs is not the job's slowness).
        # The entry is built only for a job that makes the list (most do not).
        ran = result.run_s if result is not None else None
        key = ran if ran is not None else duration
        slowest = self._slowest
        if len(slowest) < self.keep_slowest or (self.keep_slowest and key >= slowest[0][0]):
            entry = (
                key,
                next(self._seq),
                {
                    "id": job.id,
                    "outcome": outcome,
                    "run_s": ran,
                    "duration_s": round(duration, 3),
                    "attempts": attempt,
                    "turn_id": turn_id,
                },
            )
            if len(slowest) < self.keep_slowest:
                heapq.heappush(slowest, entry)
            else:
                heapq.heappushpop(slowest, entry)
        self._notify(record)
        if final and outcome != "completed" and self.fail_fast:
            self.interrupt(STOP_FAIL_FAST)

    def _summary(self) -> BatchSummary:
        plan = self.plan
        keys = {job.key for job in plan.jobs}
        earlier = Counter(rec.get("outcome") for key, rec in plan.previous.final.items() if key in keys)
        return BatchSummary(
            batch=plan.batch,
            output=plan.output,
            jobs=len(plan.jobs),
            skipped=len(plan.jobs) - len(plan.pending),
            earlier={k: v for k, v in earlier.items() if isinstance(k, str)},
            counts={k: self._counts[k] for k in OUTCOMES if self._counts[k]},
            by_cause=dict(self._by_cause),
            interrupted=self._interrupted,
            not_run=len(plan.pending) - self._done,
            invalid=len(plan.invalid),
            retries=self._retries,
            elapsed=time.monotonic() - self._t0,
            slowest=[e[2] for e in sorted(self._slowest, key=lambda e: (-e[0], e[1]))],
            stopped=self._stopping,
        )
