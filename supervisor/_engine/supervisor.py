"""The embedded supervisor: owns the pool, the turn table, the queue and every turn's cancellation.

One anyio event loop owns all state; nothing here blocks on another thread. The pieces:

* the worker link: a ROUTER on a private ipc endpoint; workers connect DEALERs;
* the pool: ``workers`` slots running turns plus ``spares`` warm workers; exits are pidfd events;
* the turn table (``TurnRecord`` per turn: the one cancellation holder) and the ``TurnQueue``;
* the escalation ladder: ``Abort`` → ``grace`` → SIGTERM to the tree → ``kill_after`` → SIGKILL
  → reaped with every descendant → ``killed``; driven by one ``Timers`` task.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import secrets
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import msgspec

import wire
from wire import DISPOSED, PARENT, Cause, TurnError, TurnResult, validate_cause
from worker import lowlevel

from .._errors import QueueFull, SupervisorClosed, WorkerStartError
from .._handle import TurnHandle
from .._paths import private_dir
from . import output as _output
from . import procs as _procs
from . import turninfo as _turninfo
from .dispatch import Dispatcher
from .link import WorkerLink
from .options import (
    AGENT_RE,
    MAX_GRACE,
    MAX_TURN_ID,
    check_agent,
    check_count,
    check_optional_str,
    check_seconds,
    require_seconds,
)
from .pool import WorkerPool, WorkerSlot
from .timers import Timers
from .turns import TurnQueue, TurnRecord, TurnTable

__all__ = ["AGENT_RE", "MAX_GRACE", "MAX_HANDOVERS", "MAX_TURN_ID", "Supervisor", "check_agent"]

log = logging.getLogger("turnpool.supervisor")

# A turn handed to workers that all died before reporting it started is re-queued at most this
# many times in all, then ends ``crashed`` (no poison turn loops through the pool forever).
MAX_HANDOVERS = 3

# Hooks a front end registers (``Supervisor.add_hooks``); each is called on the event loop.
AcceptHook = Callable[[TurnRecord], None]
StartHook = Callable[[TurnRecord, int], None]
EventHook = Callable[[TurnRecord, msgspec.Raw], None]
ResultHook = Callable[[TurnRecord, TurnResult], None]
DispatchGate = Callable[[list[TurnRecord]], None]


class Supervisor:
    """Runs agent turns in a pool of worker processes and owns their cancellation.

    Use as ``async with Supervisor(...) as sup:``; leaving the block disposes: every turn is
    cancelled with cause ``disposed``, escalated as needed, and every worker reaped.

    Speed knobs (keyword-only): ``prefetch`` caps the turns a worker holds at once (running +
    handed ahead; 1 turns it off) and ``prefetch_window`` is how much work, at the recent mean
    turn time, may wait handed ahead behind a running turn (2 ms: trivial turns are prefetched
    deeply, long agent turns not at all); a handed-ahead turn still counts as queued until it
    starts. ``zygote`` forks workers from a preloaded process (a few ms instead of a fresh
    interpreter; workers inherit the environment as it was when the supervisor started) and
    ``preload`` names agent modules that process imports once for every worker.

    ``cgroups`` (default True) puts each worker in a cgroup v2 of its own where the unified
    hierarchy is writable (root, or a delegated subtree), so a worker's tree is killed at once
    with ``cgroup.kill`` and nothing escapes it; ``False`` forces the fallback (subreaper,
    freeze-and-signal, tree markers), which is also what runs where cgroups cannot be used.
    ``max_rss_mb`` is compared with the tree's proportional set size (PSS, shared pages split
    between the processes mapping them).
    Isolation (keyword-only): ``agent_path`` is where workers import agents from (R-PATH): a
    sequence of directories, searched first and exactly, then the interpreter's own path
    (installed packages); the default ``None`` mirrors this process's ``sys.path``, the embedding
    program's choice. Workers run in ``python -P`` safe-path mode, from this supervisor's private
    runtime directory, so a module planted in a working directory never runs.
    ``worker_output`` is where workers' stdout and stderr go (R-OUT), never shared with this
    process's stderr: ``"stderr"`` (default) forwards each line, prefixed ``w<n>[pid]``, to this
    process's stderr through a thread, so a stalled stderr never blocks the supervisor; a file
    path writes them to that log, rotated by size (``worker_output_max_mb``, default 16, per file;
    four files at most: ``PATH``, ``PATH.1`` … ``PATH.3``); ``None`` discards
    them; ``"inherit"`` shares this process's fd 2 with the workers as before (a stalled stderr
    then stalls workers and this process alike).
    """

    def __init__(
        self,
        workers: int = 4,
        grace: float = 5.0,
        kill_after: float = 2.0,
        spares: int = 1,
        max_turns_per_worker: int | None = None,
        max_rss_mb: float | None = None,
        *,
        timeout: float | None = None,
        max_queue: int = 100_000,
        max_events: int = 10_000,
        keep_results: int = 10_000,
        heartbeat: float = 1.0,
        start_timeout: float = 30.0,
        rss_interval: float = 0.25,
        stop_timeout: float = 5.0,
        python: str | None = None,
        worker_args: tuple[str, ...] = (),
        prefetch: int = 64,
        prefetch_window: float = 0.002,
        zygote: bool = True,
        preload: tuple[str, ...] = (),
        cgroups: bool = True,
        agent_path: Any = None,
        worker_output: Any = _output.STDERR,
        worker_output_max_mb: float = _output.MAX_BYTES / 2**20,
        max_grace: float = MAX_GRACE,
    ) -> None:
        if not isinstance(cgroups, bool):
            raise TypeError(f"cgroups must be True or False, got {cgroups!r}")
        for name, value, low in (
            ("workers", workers, 1),
            ("spares", spares, 0),
            ("max_queue", max_queue, 1),
            ("max_events", max_events, 1),
            ("keep_results", keep_results, 1),
            ("prefetch", prefetch, 1),
        ):
            check_count(name, value, low)
        if max_turns_per_worker is not None and (
            isinstance(max_turns_per_worker, bool)
            or not isinstance(max_turns_per_worker, int)
            or max_turns_per_worker < 1
        ):
            raise ValueError(
                f"max_turns_per_worker must be a positive int or None, got {max_turns_per_worker!r}"
            )
        self.workers = workers
        # R-GRACE: the cap on every turn's grace and kill_after (a submit above it is refused): a
        # turn's ladder, and so a disposal, is bounded whatever a client asks for.
        self.max_grace = require_seconds("max_grace", max_grace, positive=True)
        self.grace = require_seconds("grace", grace)
        self._check_grace("grace", self.grace)
        self.kill_after = require_seconds("kill_after", kill_after)
        self._check_grace("kill_after", self.kill_after)
        self.spares = spares
        self.max_turns_per_worker = max_turns_per_worker
        self.max_rss_mb = check_seconds("max_rss_mb", max_rss_mb, positive=True)
        self.timeout = check_seconds("timeout", timeout, positive=True)
        self.max_queue = max_queue
        self.max_events = max_events
        self.keep_results = keep_results
        self.heartbeat = require_seconds("heartbeat", heartbeat)
        self.start_timeout = require_seconds("start_timeout", start_timeout, positive=True)
        self.rss_interval = require_seconds("rss_interval", rss_interval, positive=True)
        self.stop_timeout = require_seconds("stop_timeout", stop_timeout)
        self.python = python
        self.worker_args = tuple(worker_args)
        # Turns a worker may hold at once (running + handed ahead): hides the round trip between
        # one turn's end and the next one's start. 1 turns prefetching off.
        self.prefetch = prefetch
        # How much work (seconds, at the recent mean turn time) a worker may hold beyond its current
        # turn: trivial turns are handed up to ``prefetch`` at a time, turns longer than the window
        # are not handed ahead at all, so a long agent turn never holds others behind it.
        self.prefetch_window = require_seconds("prefetch_window", prefetch_window)
        # Fork workers from a preloaded zygote (a few ms) instead of starting interpreters (≈50 ms+);
        # ``preload`` names agent modules the zygote imports once for every worker.
        # A custom interpreter or interpreter flags are honoured per worker: fresh interpreters then.
        self.use_zygote = bool(zygote) and python is None and not worker_args
        self.preload = tuple(preload)
        self.cgroups = cgroups
        self.agent_path = _procs.check_agent_path(agent_path)
        self.worker_output = _output.check_worker_output(worker_output)
        if (
            isinstance(worker_output_max_mb, bool)
            or not isinstance(worker_output_max_mb, (int, float))
            or not 0 < worker_output_max_mb < float("inf")
        ):
            raise ValueError(
                f"worker_output_max_mb must be a number of MiB > 0, got {worker_output_max_mb!r}"
            )
        self.worker_output_max_mb = float(worker_output_max_mb)

        # The event loop's clock once started (asyncio's loop.time() is time.monotonic()).
        self._clock: Callable[[], float] = time.monotonic
        self._timers = Timers(self._clock)
        self._prefix = secrets.token_hex(4)
        # The composed parts: the turn table, the queue, the worker link and the worker pool.
        self.table = TurnTable(keep=keep_results, max_events=max_events)
        self._turns = self.table.records  # the same dict: read on every message
        self.queue = TurnQueue()
        self._queue = self.queue
        self.link = WorkerLink(
            on_message=self._on_message,
            on_batch_start=self._batch_started,
            on_batch_end=self._batch_ended,
            on_bad_frame=self._bad_frame,
        )
        self._send = self.link.send
        self.pool = WorkerPool(
            link=self.link,
            timers=self._timers,
            prefix=self._prefix,
            heartbeat=self.heartbeat,
            start_timeout=self.start_timeout,
            stop_timeout=self.stop_timeout,
            python=python,
            worker_args=self.worker_args,
            use_zygote=self.use_zygote,
            preload=self.preload,
            on_message=self._on_message,
            on_exit=self._on_exit,
            changed=self._notify_change,
            refill=self._fill_pool,
        )
        self._slots = self.pool.slots  # the same dict
        # One handler per message type a worker sends (``_on_message``).
        self._handlers: dict[type, Callable[[WorkerSlot, Any], None]] = {
            wire.Event: self._on_event,
            wire.Started: self._on_started,
            wire.End: self._on_end,
            wire.Ready: self._on_ready,
            wire.Spawn: self._on_spawn,
            wire.SpawnCancel: self._on_spawn_cancel,
            wire.Revoked: self._on_revoked,
            wire.Heartbeat: self._on_heartbeat,
            wire.BadFrame: self._on_bad_frame,
        }
        # Dispatch: which worker gets which turn when (prefetch, the J6 gate, S1 start notes).
        self._dispatch = dispatch = Dispatcher(self)
        self._pump = dispatch.pump
        self._note_marked_start = dispatch.note_marked_start
        self._start_turn = dispatch.start_turn
        self._unhand = dispatch.unhand
        self._after_turn = dispatch.after_turn
        self._note_turn_time = dispatch.note_turn_time
        self._ids = itertools.count(1)
        self._running = 0  # turns a worker reported Started for and not yet ended
        self._active = 0  # turns accepted and not yet ended
        self._lent = 0  # slots lent by parents waiting on a spawned child
        self._idle_waiters: list[anyio.Event] = []
        self._outcomes: collections.Counter[str] = collections.Counter()
        self._causes: collections.Counter[str] = collections.Counter()
        self._escalations: collections.Counter[str] = collections.Counter()
        self.worker_restarts = 0
        self.bad_frames = 0  # frames from workers refused: unknown sender, undecodable, out of order
        self._slots_changed = anyio.Event()
        self._result_hooks: list[ResultHook] = []
        self._event_hooks: list[EventHook] = []
        self._start_hooks: list[StartHook] = []
        self._accept_hooks: list[AcceptHook] = []
        # J6, the dispatch gate. When set (a journal sets it, ``set_dispatch_gate``), a new turn is
        # handed to a worker only once (1) ``mark_recorded(turn)`` says its accept row is committed
        # and (2) the gate, called with a batch of recorded turns from the head of the queue, has
        # answered ``clear_for_dispatch``: a row saying they may run is committed. Intent before
        # effect, in batches (group commit).
        self._dispatch_gate: DispatchGate | None = None

        self._state = "new"  # new → running → closing → closed
        self._disposing = False
        self._kill_at_once = False  # kill_now(): every cancel goes straight to SIGKILL
        self._tg: anyio.abc.TaskGroup | None = None
        self._wall_offset = 0.0

    # ---- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Supervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Bind the worker link, start the pool and wait until ``workers`` workers are ready."""
        if self._state != "new":
            raise RuntimeError("a Supervisor can be started once")
        pool = self.pool
        output = _output.WorkerOutput(
            self.worker_output, max_bytes=max(int(self.worker_output_max_mb * 2**20), 4096)
        )
        output.start()  # a log that cannot be written fails here, before anything exists (R-OUT)
        pool.output = output
        try:
            pool.runtime_dir = private_dir()
        except BaseException:
            output.close()
            raise
        self._state = "running"
        lowlevel.set_child_subreaper()
        pool.pythonpath = _procs.import_path(self.agent_path)
        self.link.bind(f"ipc://{pool.runtime_dir}/workers.sock")
        # The loop's clock (what anyio.current_time() returns on asyncio) without anyio's
        # per-call backend lookup: it is read several times per turn.
        self._clock = asyncio.get_running_loop().time
        self._timers.clock = self._clock
        self._wall_offset = time.time() - self._clock()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._timers.run)
        self._tg.start_soon(self.link.run)
        await pool.start(tg=self._tg, use_cgroups=self.cgroups)
        if self.max_rss_mb is not None:
            self._tg.start_soon(self._memory_loop)
        try:
            self._fill_pool()
            assert pool.ready_event is not None
            with anyio.fail_after(self.start_timeout):
                await pool.ready_event.wait()
            if pool.ready_count() == 0:
                raise WorkerStartError(f"workers could not be started: {pool.last_start_error}")
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, TimeoutError):
                raise WorkerStartError(
                    f"workers were not ready within {self.start_timeout}s"
                    + (f": {pool.last_start_error}" if pool.last_start_error else "")
                ) from None
            raise

    async def aclose(self) -> None:
        """Dispose: cancel every turn with cause ``disposed``, escalate, reap, release everything.

        Returns only when every worker and every descendant of one has been reaped.
        """
        if self._state in ("closing", "closed"):
            while self._state != "closed":
                await self._wait_change()
            return
        if self._state == "new":
            self._state = "closed"
            return
        self._state = "closing"
        pool = self.pool
        pool.closing = True
        with anyio.CancelScope(shield=True):
            self._disposing = True
            for turn in list(self._turns.values()):
                if turn.state in ("queued", "handed", "running"):
                    self._cancel(turn, DISPOSED)
            while self._active:
                ev = anyio.Event()
                self._idle_waiters.append(ev)
                await ev.wait()
            for slot in list(self._slots.values()):
                if slot.state in ("starting", "idle", "busy"):
                    pool.retire(slot)
            while self._slots:
                await self._wait_change()
            await pool.close()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(None, None, None)
        finally:
            self.link.close()
            pool.close_pipe()
            if pool.runtime_dir is not None:
                shutil.rmtree(pool.runtime_dir, ignore_errors=True)
            if pool.output is not None:
                # Every worker is reaped: drain what they left and stop the pump, off the event loop.
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(pool.output.close)
            self._state = "closed"
            self._notify_change()

    def kill_now(self, turn_ids: Iterable[str] | None = None) -> None:
        """Skip the rest of every ladder: each live turn already being cancelled gets SIGKILL to
        its worker's tree now (it ends ``killed``), and from now on every cancel (disposal's
        included) does so at once, without grace or kill_after. Turns not cancelled run on.

        With ``turn_ids``, only those turns get SIGKILL now, cancelled or not, and later cancels
        keep their ladder. For a second SIGTERM/SIGINT (``turnpool serve``; a batch's second
        Ctrl-C): shutdown then waits for no client-chosen grace. Synchronous; call it on the
        supervisor's event loop. Unknown or ended ids are skipped.
        """
        if turn_ids is None:
            self._kill_at_once = True
            targets = [t for t in self._turns.values() if t.cause is not None]
        else:
            targets = [t for t in map(self._turns.get, turn_ids) if t is not None]
        for turn in targets:
            if turn.state not in ("handed", "running") or turn.worker is None:
                continue
            slot = turn.worker
            if turn.state == "handed":
                self._note_marked_start(slot)
            if turn.state == "running" and slot.turn is turn and turn.escalation < 2:
                if turn.esc_timer is not None:
                    turn.esc_timer.cancel()
                self._escalate(turn, slot, 2)

    def _check_grace(self, name: str, value: float | None) -> float | None:
        if value is not None and value > self.max_grace:
            raise ValueError(
                f"{name} must be at most this supervisor's max_grace ({self.max_grace:g} s), got {value:g}"
            )
        return value

    async def _wait_change(self) -> None:
        await self._slots_changed.wait()

    def _notify_change(self) -> None:
        self._slots_changed.set()
        self._slots_changed = anyio.Event()

    @property
    def closed(self) -> bool:
        return self._state in ("closing", "closed")

    # ---- public API --------------------------------------------------------------------

    async def submit(
        self,
        agent: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the turn's timeout, not this call's
        grace: float | None = None,
        kill_after: float | None = None,
        turn_id: str | None = None,
        retry: bool = False,
    ) -> TurnHandle:
        """Accept a turn and queue it; returns its handle at once.

        Raises ``InvalidAgent`` (agent syntax), ``TypeError`` (input not encodable, bad
        argument types), ``ValueError`` (negative times), ``QueueFull``, ``SupervisorClosed``.
        A ``turn_id`` that already exists returns the existing turn's handle (never runs twice).
        ``retry=True`` lets a daemon with a journal run the turn again after a restart that
        interrupted it (``attempts`` counts the runs); otherwise such a turn ends ``crashed``.
        """
        raw = wire.encode_payload(input, what="turn input")  # TypeError, or PayloadTooLarge (ValueError)
        turn = self._accept(
            agent,
            raw,
            session=session,
            timeout=timeout,
            grace=grace,
            kill_after=kill_after,
            turn_id=turn_id,
            parent=None,
            retry=retry,
        )
        return TurnHandle(self, turn.id)

    async def run(self, agent: str, input: Any = None, **kwargs: Any) -> TurnResult:
        """``submit`` then ``result``."""
        handle = await self.submit(agent, input, **kwargs)
        return await self.result(handle.turn_id)

    def handle(self, turn_id: str) -> TurnHandle:
        """A handle on an existing turn; raises ``UnknownTurn``."""
        self.table.get(turn_id)
        return TurnHandle(self, turn_id)

    async def cancel(self, turn_id: str, cause: Any = None) -> Cause | None:
        """Cancel a turn (default cause ``{"kind": "user"}``); returns the winning cause.

        On a turn that already ended nothing changes and the winning cause (or ``None``) is
        returned. Raises ``UnknownTurn``, ``TypeError``/``ValueError`` for a bad cause.
        """
        accepted = validate_cause(cause)
        turn = self.table.get(turn_id)
        return self._cancel(turn, accepted)

    async def cancel_session(self, session: str, cause: Any = None) -> list[str]:
        """Cancel the running turn of ``session`` and clear its turns queued now.

        Turns submitted afterwards run normally. Returns the ids of the turns cancelled.
        """
        accepted = validate_cause(cause)
        if not isinstance(session, str) or not session:
            raise TypeError(f"session must be a non-empty string, got {session!r}")
        return self._cancel_session(session, accepted)

    async def when_idle(self) -> None:
        """Return once no turn is queued or running, and every interrupted worker is reaped."""
        while self._active:
            ev = anyio.Event()
            self._idle_waiters.append(ev)
            await ev.wait()

    def status(self) -> dict[str, Any]:
        """Workers (id, pid, state, turn_id, turns_run, rss in bytes and rss_mb: resident memory of
        the worker's whole tree summed per process, so shared pages count once per process; pss and
        pss_mb: its proportional set size, shared pages split between the processes mapping them,
        which is what ``max_rss_mb`` is compared with; cgroup: the worker's own cgroup or None),
        the queue and counters."""
        workers = []
        for slot in self._slots.values():
            live = slot.state != "dead" and slot.pid
            rss = _procs.rss_of_tree(slot.pid) if live else 0
            pss = _procs.memory_of_tree(slot.pid) if live else 0
            workers.append(
                {
                    "id": slot.id,
                    "pid": slot.pid,
                    "state": slot.state,
                    "turn_id": slot.turn.id if slot.turn else None,
                    "turns_run": slot.turns_run,
                    "rss": rss,
                    "rss_mb": round(rss / 2**20, 1),
                    "pss": pss,
                    "pss_mb": round(pss / 2**20, 1),
                    "cgroup": slot.cgroup,
                }
            )
        return {
            "pid": os.getpid(),
            "state": self._state,
            "workers": workers,
            "queue": len(self._queue) + self._dispatch.handed,
            "running": self._running,
            "outcomes": dict(self._outcomes),
            "causes": dict(self._causes),
            "escalations": dict(self._escalations),
            "bad_frames": self.bad_frames,
            "worker_restarts": self.worker_restarts,
            "last_start_error": self.pool.last_start_error,
            "worker_output": self.describe_output(),
            "worker_output_dropped": self.pool.output.dropped if self.pool.output is not None else 0,
        }

    def describe_output(self) -> str:
        """Where workers' stdout and stderr go: a log file path, ``stderr``, ``inherit`` or ``discarded``."""
        return "discarded" if self.worker_output is None else str(self.worker_output)

    def turn_info(self, turn_id: str) -> dict[str, Any]:
        """One turn's live facts for front ends (state, agent, session, cause, escalation step and
        when the next signal is due, event count; its input while retained). Raises ``UnknownTurn``."""
        return _turninfo.info(self, self.table.get(turn_id), with_input=True)

    def turns(self, state: str | tuple[str, ...] = "running", *, limit: int = 100) -> list[dict[str, Any]]:
        """Turns in ``state`` (``queued``, ``running``, ``ended`` newest first; or a tuple of them) as
        ``turn_info`` dicts without input, at most ``limit``. Raises ``ValueError`` for another state."""
        return _turninfo.listing(self, (state,) if isinstance(state, str) else state, limit)

    # ---- the Backend contract: results and events --------------------------------------

    def record(self, turn_id: str) -> TurnRecord:
        """The live record of a turn (for front ends and tests: read it, never change it);
        raises ``UnknownTurn``."""
        return self.table.get(turn_id)

    def find(self, turn_id: str) -> TurnRecord | None:
        """The record of ``turn_id``, or ``None`` if this supervisor does not know it."""
        return self._turns.get(turn_id)

    def records(self) -> list[TurnRecord]:
        """Every record this supervisor holds now: live turns and retained ended ones."""
        return list(self._turns.values())

    async def result(self, turn_id: str) -> TurnResult:
        """Wait for the turn's one outcome (``TurnHandle.result``); raises ``UnknownTurn``."""
        turn = self.table.get(turn_id)
        if turn.result is None:
            if turn.done is None:
                turn.done = anyio.Event()
            await turn.done.wait()
        assert turn.result is not None
        return turn.result

    def follow_raw(self, turn_id: str) -> AsyncIterator[tuple[int, msgspec.Raw]]:
        """The turn's events as ``(seq, raw)`` from the oldest retained; ends when the turn ends.

        At most ``max_events`` events are retained per turn: a follower that starts late or
        falls further behind than that skips the dropped ones (``seq`` shows the gap).
        Raises ``UnknownTurn`` at once.
        """
        self.table.get(turn_id)
        return self.table.follow(turn_id)

    async def events(self, turn_id: str) -> AsyncIterator[Any]:
        """The turn's events, decoded (``TurnHandle.events``)."""
        async for _, raw in self.follow_raw(turn_id):
            yield wire.decode_payload(raw)

    # ---- for front ends: named engine entry points -------------------------------------

    @property
    def active(self) -> int:
        """Turns accepted and not yet ended."""
        return self._active

    @property
    def running(self) -> int:
        """Turns a worker reported started and that have not ended."""
        return self._running

    @property
    def queued(self) -> int:
        """Turns waiting for a worker (handed ahead but not started included)."""
        return len(self._queue) + self._dispatch.handed

    @property
    def escalations(self) -> dict[str, int]:
        """How many times each escalation step (``sigterm``, ``sigkill``) was taken."""
        return dict(self._escalations)

    @property
    def wall_offset(self) -> float:
        """Add to the loop clock's readings (``TurnRecord`` times) to get epoch seconds."""
        return self._wall_offset

    @property
    def prefetch_depth(self) -> int:
        """How many turns a worker may hold at once now (adapted to recent turn times)."""
        return self._dispatch.depth

    def add_hooks(
        self,
        *,
        on_accept: AcceptHook | None = None,
        on_start: StartHook | None = None,
        on_event: EventHook | None = None,
        on_result: ResultHook | None = None,
    ) -> None:
        """Register callbacks, called on the event loop, in registration order: a turn accepted
        (children spawned by agents included), started (with its worker's pid), an event (raw),
        and its result delivered (once, when it is quiescent). A hook must not block."""
        if on_accept is not None:
            self._accept_hooks.append(on_accept)
        if on_start is not None:
            self._start_hooks.append(on_start)
        if on_event is not None:
            self._event_hooks.append(on_event)
        if on_result is not None:
            self._result_hooks.append(on_result)

    def accept_encoded(
        self,
        agent: str,
        raw: msgspec.Raw,
        *,
        session: str | None = None,
        timeout: float | None = None,
        grace: float | None = None,
        kill_after: float | None = None,
        turn_id: str | None = None,
        retry: bool = False,
    ) -> TurnRecord:
        """``submit`` for an input already encoded (a daemon passes its client's bytes through):
        validates like ``submit`` and returns the turn's record. A known ``turn_id`` returns the
        existing record (never runs twice)."""
        return self._accept(
            agent,
            raw,
            session=session,
            timeout=timeout,
            grace=grace,
            kill_after=kill_after,
            turn_id=turn_id,
            parent=None,
            retry=retry,
        )

    def readmit(
        self,
        agent: str,
        raw: msgspec.Raw,
        *,
        session: str | None,
        timeout: float | None,
        grace: float | None,
        kill_after: float | None,
        turn_id: str,
        retry: bool,
        attempts: int,
    ) -> TurnRecord:
        """Accept again a turn the journal already acknowledged (restart recovery, J3): the
        ``max_queue`` limit does not apply, since refusing would lose a turn a client was promised.
        For recovery only; new submits go through ``accept_encoded``."""
        return self._accept(
            agent,
            raw,
            session=session,
            timeout=timeout,
            grace=grace,
            kill_after=kill_after,
            turn_id=turn_id,
            parent=None,
            retry=retry,
            attempts=attempts,
            readmit=True,
        )

    def restore_result(self, result: TurnResult) -> None:
        """Register a turn that ended before this supervisor started (a daemon's journal), so
        ``handle(id).result()`` and ``cancel(id)`` answer for it as for any ended turn."""
        self.table.restore(result, self._clock())

    def cancel_record(self, turn: TurnRecord, cause: Cause) -> Cause | None:
        """``cancel`` for a record already looked up and a cause already validated (synchronous)."""
        return self._cancel(turn, cause)

    def cancel_session_now(self, session: str, cause: Cause) -> list[str]:
        """``cancel_session`` with a validated cause, synchronous: the ids cancelled."""
        return self._cancel_session(session, cause)

    def set_dispatch_gate(self, gate: DispatchGate) -> None:
        """J6: from now on a new turn is handed to a worker only once ``mark_recorded`` said its
        accept row is committed and ``gate`` (called with a batch of recorded turns from the head
        of the queue) answered ``clear_for_dispatch`` for it. Set before the first submit."""
        self._dispatch_gate = gate

    def mark_recorded(self, turn: TurnRecord) -> None:
        """J6: the journal committed ``turn``'s accept row: it may now pass the dispatch gate."""
        turn.recorded = True
        self._pump()

    def clear_for_dispatch(self, turns: list[TurnRecord]) -> None:
        """J6: the gate committed the "may run" row of ``turns``: hand them to workers."""
        for turn in turns:
            turn.clearing = False
            turn.dispatchable = True
        self._pump()

    def withdraw(self, turn: TurnRecord, why: str) -> None:
        """J6: a turn whose accept row could not be committed: it was never acknowledged and never
        ran (the gate held it); it ends ``failed`` (``JournalUnavailable``) and its id is forgotten."""
        if turn.state == "queued" and not turn.dispatchable:
            self._queue.discard(turn)
            self._finish(turn, "failed", error=TurnError("JournalUnavailable", why))
        if turn.parent is None and turn.state == "ended":
            self._turns.pop(turn.id, None)

    # ---- accepting and cancelling ------------------------------------------------------

    def _accept(
        self,
        agent: str,
        raw: msgspec.Raw,
        *,
        session: str | None,
        timeout: float | None,
        grace: float | None,
        kill_after: float | None,
        turn_id: str | None,
        parent: str | None,
        retry: bool = False,
        attempts: int = 1,
        readmit: bool = False,
    ) -> TurnRecord:
        if not isinstance(retry, bool):
            raise TypeError(f"retry must be True or False, got {retry!r}")
        check_agent(agent)
        session = check_optional_str("session", session)
        turn_id = check_optional_str("turn_id", turn_id)
        timeout = check_seconds("timeout", timeout, positive=True)
        grace = self._check_grace("grace", check_seconds("grace", grace))
        kill_after = self._check_grace("kill_after", check_seconds("kill_after", kill_after))
        if self._state != "running":
            raise SupervisorClosed(
                "the supervisor is shutting down"
                if self._state == "closing"
                else "the supervisor is not running"
            )
        if turn_id is not None and turn_id in self._turns:
            return self._turns[turn_id]
        if not readmit and len(self._queue) + self._dispatch.handed >= self.max_queue:
            raise QueueFull(f"the queue already holds {self.max_queue} turns")
        if turn_id is None:
            turn_id = f"{self._prefix}-{next(self._ids)}"
        turn = TurnRecord(
            turn_id=turn_id,
            agent=agent,
            input=raw,
            session=session,
            parent=parent,
            timeout=timeout if timeout is not None else self.timeout,
            grace=grace if grace is not None else self.grace,
            kill_after=kill_after if kill_after is not None else self.kill_after,
            now=self._clock(),
        )
        turn.retry = retry
        turn.attempts = attempts
        if self._dispatch_gate is not None:
            turn.recorded = readmit  # a readmitted turn's row is already in the journal
            turn.dispatchable = False
        self._turns[turn_id] = turn
        self._active += 1
        for accept_hook in self._accept_hooks:
            accept_hook(turn)
        self._queue.push(turn)
        self._pump()
        return turn

    def _cancel(self, turn: TurnRecord, cause: Cause) -> Cause | None:
        state = turn.state
        if state == "ended" or state == "ending":
            return turn.cause
        first = turn.cause is None
        if first:
            turn.cause = cause
        for child_id in list(turn.children):
            child = self._turns.get(child_id)
            if child is not None:
                self._cancel(child, PARENT)
        if state == "queued":
            self._queue.discard(turn)
            self._finish(turn, "aborted")
        elif state == "handed" and first:
            # Handed ahead: the worker drops it unstarted (End aborted, never Started), or, if it
            # started meanwhile, honours the Abort. Its start marker tells whether it started (S1):
            # the ladder is armed now either way, and looks again if it had not.
            slot = turn.worker
            assert slot is not None
            self._send(slot, wire.Abort(turn.id, turn.cause))  # type: ignore[arg-type]
            self._note_marked_start(slot)
            if turn.esc_timer is None:  # (armed already if the marker showed it running)
                self._arm_escalation(turn, slot)
        elif state == "running" and first:
            slot = turn.worker
            assert slot is not None
            self._send(slot, wire.Abort(turn.id, turn.cause))  # type: ignore[arg-type]
            self._arm_escalation(turn, slot)
        return turn.cause

    def _arm_escalation(self, turn: TurnRecord, slot: WorkerSlot) -> None:
        if self._kill_at_once:
            turn.esc_timer = self._timers.call_later(0, self._escalate, turn, slot, 2)
        else:
            turn.esc_timer = self._timers.call_later(turn.grace, self._escalate, turn, slot, 1)

    def _cancel_session(self, session: str, cause: Cause) -> list[str]:
        cancelled = []
        for turn in self._queue.queued_of_session(session):
            self._cancel(turn, cause)
            cancelled.append(turn.id)
        for slot in list(self._slots.values()):
            for turn in list(slot.ahead):
                if turn.session == session and turn.state == "handed":
                    self._cancel(turn, cause)
                    cancelled.append(turn.id)
            running = slot.turn
            if running is not None and running.session == session and running.state == "running":
                self._cancel(running, cause)
                cancelled.append(running.id)
        return cancelled

    def _deadline(self, turn: TurnRecord) -> None:
        self._cancel(turn, wire.DEADLINE)

    def _escalate(self, turn: TurnRecord, slot: WorkerSlot, step: int) -> None:
        if turn.state == "handed" and turn.worker is slot and slot.state != "dead":
            # Cancelled while handed ahead and no Started yet: the start marker may say it runs (S1).
            self._note_marked_start(slot)
            if turn.state == "handed":  # not reached yet: look again later (its Started re-arms too)
                again = max(turn.grace, 0.05)
                turn.esc_timer = self._timers.call_later(again, self._escalate, turn, slot, step)
                return
        # Keyed by turn: act only if this worker is still on this very turn.
        if slot.turn is not turn or slot.state == "dead":
            return
        slot.doomed = True
        if step == 1:
            turn.escalation = 1
            self._escalations["sigterm"] += 1
            log.warning(
                "escalate turn=%s pid=%s step=SIGTERM after grace %.3gs", turn.id, slot.pid, turn.grace
            )
            _procs.signal_tree(slot.pid, signal.SIGTERM, known=slot.known)
            turn.esc_timer = self._timers.call_later(turn.kill_after, self._escalate, turn, slot, 2)
        else:
            turn.escalation = 2
            self._escalations["sigkill"] += 1
            log.warning(
                "escalate turn=%s pid=%s step=SIGKILL after kill_after %.3gs",
                turn.id,
                slot.pid,
                turn.kill_after,
            )
            _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)

    # ---- ending ------------------------------------------------------------------------

    def _finish(
        self,
        turn: TurnRecord,
        outcome: str,
        output: Any = None,
        error: TurnError | None = None,
        exit_code: int | None = None,
        worker_pid: int | None = None,
    ) -> None:
        now = self._clock()
        cause = turn.cause
        if self._disposing and outcome in ("aborted", "killed"):
            cause = DISPOSED  # disposal wins over an earlier user or parent cause
        started_at = turn.started_at
        result = TurnResult(
            turn_id=turn.id,
            outcome=outcome,  # type: ignore[arg-type]  # one of wire's outcomes, checked by callers
            output=output,
            error=error,
            cause=cause,
            started=turn.started,
            worker_pid=worker_pid,
            exit_code=exit_code,
            queued_s=(started_at if started_at is not None else now) - turn.submitted_at,
            run_s=(now - started_at) if started_at is not None else 0.0,
            session=turn.session,
            parent=turn.parent,
            agent=turn.agent,
            attempts=turn.attempts,
            submitted_at=turn.submitted_at + self._wall_offset,
            started_at=started_at + self._wall_offset if started_at is not None else None,
            ended_at=now + self._wall_offset,
        )
        if turn.timer is not None:
            turn.timer.cancel()
        if turn.esc_timer is not None:
            turn.esc_timer.cancel()
        if turn.state == "running":
            self._running -= 1
        live_children = [c for c in turn.children if c in self._turns and self._turns[c].state != "ended"]
        if live_children:
            # A child never outlives its parent: hold the parent's result until they end.
            turn.state = "ending"
            turn.pending_result = result
            turn.wake_followers()
            for child_id in live_children:
                self._cancel(self._turns[child_id], PARENT)
            return
        self._deliver(turn, result)

    def _deliver(self, turn: TurnRecord, result: TurnResult) -> None:
        turn.result = result
        turn.pending_result = None
        turn.state = "ended"
        turn.ended_at = self._clock()
        turn.input = None  # type: ignore[assignment]  # no longer needed: free it
        self._outcomes[result.outcome] += 1
        if result.cause is not None:
            self._causes[result.cause.kind] += 1
        self._active -= 1
        if turn.done is not None:
            turn.done.set()
        turn.wake_followers()
        for hook in self._result_hooks:
            hook(turn, result)
        if turn.session is not None:
            self._queue.session_quiescent(turn)
        lent_changed = turn.spawn_origin is not None
        if lent_changed:
            slot, req = turn.spawn_origin  # type: ignore[misc]
            turn.spawn_origin = None
            self._lent -= 1
            slot.spawns.pop(req, None)
            if slot.state == "busy" and slot.turn is not None and slot.turn.id == turn.parent:
                self._send(slot, wire.SpawnReply(req, result=result))
        if turn.parent is not None:
            parent = self._turns.get(turn.parent)
            if parent is not None:
                parent.children.discard(turn.id)
                if parent.pending_result is not None and not any(
                    self._turns.get(c) is not None and self._turns[c].state != "ended"
                    for c in parent.children
                ):
                    # Delivered now, after its last child: that is when it became quiescent.
                    held = msgspec.structs.replace(
                        parent.pending_result, ended_at=self._clock() + self._wall_offset
                    )
                    self._deliver(parent, held)
        self.table.note_ended(turn.id)
        if self._active == 0 and self._idle_waiters:
            waiters, self._idle_waiters = self._idle_waiters, []
            for ev in waiters:
                ev.set()
        self._pump()
        if lent_changed:
            self._fill_pool()

    # ---- the pool ----------------------------------------------------------------------

    def _fill_pool(self) -> None:
        """Keep ``workers + spares`` workers live, plus one per slot lent to a waiting parent."""
        if self._state != "running":
            return
        self.pool.fill(self.workers + self.spares + self._lent)

    async def _on_exit(self, slot: WorkerSlot) -> None:
        """A worker's pid exited (called by the pool): settle its turns."""
        # Frames the worker sent before it died (its Started, its End) may still sit in the
        # socket: handle them first, so a turn that started is not mistaken for one that did not.
        was = slot.state
        slot.state = "dead"  # first: an End drained here must not hand the slot a new turn
        self.link.drain()
        # R13, quiescence: every descendant is killed and reaped before the turn's result is out.
        code = await self.pool.reap_exit(slot)
        self._dispatch.busy.pop(slot, None)
        # Turns handed ahead never started: back to the front of the queue, unharmed, in order
        # (or aborted, never started, if they were cancelled meanwhile).
        turn = slot.turn
        slot.turn = None
        noted = self.pool.take_noted(slot)
        # E1: first the ends the worker logged but whose frames died with it: those turns ran,
        # and end with their own outcome.
        turn = self._apply_end_log(slot, turn, noted)
        handed_turns = list(slot.ahead)
        if noted is not None:
            started_id = noted[0]
            index = next((i for i, t in enumerate(handed_turns) if t.id == started_id), -1)
            if turn is None and index >= 0:
                # S1: the worker noted it started this turn, but its Started died with it: the turn
                # ran (and crashed), it must not be handed to another worker. (Turns before it
                # that ran in the same unreported burst ended per the End log, above; one still
                # here was revoked or dropped unstarted.)
                first = handed_turns.pop(index)
                slot.ahead.remove(first)
                self._dispatch.handed -= 1
                first.revoking = False
                first.state = "running"
                first.started = True
                first.started_at = self._clock()
                self._running += 1
                turn = first
        for index in reversed(range(len(handed_turns))):
            handed = handed_turns[index]
            self._unhand(slot, handed)
            if handed.started:
                # A turn the worker went past (S1) whose Started came but whose End died with it.
                self._finish(handed, "crashed", exit_code=code, worker_pid=slot.pid)
            elif handed.cause is not None:
                self._finish(handed, "aborted")
            elif index == 0 and turn is None and was != "starting" and noted is None:
                # The worker was about to start this one, and may have: its Started can die with
                # it (an agent that kills its worker at once), and no start marker says otherwise
                # (one naming another turn proves this one never started). Re-queue it, but not forever.
                if handed.attempts >= MAX_HANDOVERS:
                    log.warning(
                        "turn %s: %d workers died before it was seen to start; crashed",
                        handed.id,
                        handed.attempts,
                    )
                    self._finish(handed, "crashed", exit_code=code, worker_pid=slot.pid)
                else:
                    handed.attempts += 1
                    self._queue.push(handed, front=True)
            else:
                self._queue.push(handed, front=True)
        if was == "starting":
            # Keep the specific reason (no Ready in time, wrong protocol) over the bare exit code.
            self.pool.start_failed(
                slot.failure or f"worker {slot.id} (pid {slot.pid}) exited with {code} before it was ready"
            )
        elif was != "stopping" or turn is not None:
            self.worker_restarts += 1
        if turn is not None and turn.state == "running":
            if turn.escalation:
                self._finish(turn, "killed", exit_code=code, worker_pid=slot.pid)
            else:
                log.warning(
                    "worker %s (pid %s) died running turn %s: exit %s", slot.id, slot.pid, turn.id, code
                )
                self._finish(turn, "crashed", exit_code=code, worker_pid=slot.pid)
        self._notify_change()
        self._fill_pool()
        self._pump()

    def _apply_end_log(
        self, slot: WorkerSlot, turn: TurnRecord | None, noted: tuple[str, float] | None
    ) -> TurnRecord | None:
        """E1: apply the ends a dead worker logged (``worker/_endlog.py``) whose frames never came.

        Only turns the worker provably reached are considered: the turn it reported running, the
        handed turns up to the one its start marker names (it runs them in the order handed), and
        the turns it went past before a marked turn that an earlier read made the running one,
        so a record naming a turn handed behind that - which the worker never started - changes
        nothing (S3). A turn already ended is not there to match (the log keeps stale records). A
        record for the marked turn counts only if it carries the marker's start time (a record
        left by an earlier turn under the same id does not). A turn whose escalation began ends
        ``killed`` whatever the worker logged (R7). Returns the running turn, or None if it ended."""
        records = self.pool.take_end_log(slot)
        if not records:
            return turn
        ends = {end.turn_id: (at, end) for at, end in records}  # a turn's last record is its latest
        marked_id, marked_at = noted if noted is not None else (None, None)
        reached: list[TurnRecord] = [turn] if turn is not None else []
        ahead = list(slot.ahead)
        index = next((i for i, t in enumerate(ahead) if t.id == marked_id), -1)
        # The handed turns up to the marked one, and those the worker went past (S1) before a
        # marked turn that already runs here: a read of the marker made it ``turn``, so it is no
        # longer in ``ahead``, but the quick turns before it ran and their ends are in the log.
        reached += [t for i, t in enumerate(ahead) if i <= index or t.id in slot.passed]
        now = self._clock()
        for t in reached:
            logged = ends.get(t.id)
            if logged is None:
                continue
            at, end = logged
            if (t.id == marked_id and at != marked_at) or t.escalation:
                continue
            if t is turn:
                turn = None
                if t.state != "running":
                    continue
            else:
                self._start_turn(slot, t, min(max(at, t.submitted_at), now))
                slot.turn = None
            try:
                output = wire.decode_payload(end.output)
            except msgspec.DecodeError:
                output = None
            log.info(
                "turn %s: ended %s per worker %s's End log (its frame died with the worker)",
                t.id,
                end.outcome,
                slot.id,
            )
            self._finish(t, end.outcome, output=output, error=end.error, worker_pid=slot.pid)
            slot.turns_run += 1
        return turn

    # ---- messages from workers: one method per message type -----------------------------

    def _bad_frame(self) -> None:
        self.bad_frames += 1

    def _batch_started(self) -> None:
        # Inside a receive batch dispatch runs once, at the end of the batch (not once per message).
        self._dispatch.defer = True

    def _batch_ended(self) -> None:
        self._dispatch.end_deferral()  # its sends still go out as one frame per worker

    def _on_message(self, slot: WorkerSlot, msg: Any) -> None:
        handler = self._handlers.get(type(msg))
        if handler is not None:
            handler(slot, msg)

    def _on_event(self, slot: WorkerSlot, msg: wire.Event) -> None:
        turn = slot.turn
        if turn is None or turn.id != msg.turn_id:
            self.bad_frames += 1  # not the turn this worker runs: out of order, ignored
            return
        data = msg.data
        self.table.add_event(turn, data)
        for hook in self._event_hooks:
            hook(turn, data)

    def _on_started(self, slot: WorkerSlot, msg: wire.Started) -> None:
        turn_id = msg.turn_id
        ahead = slot.ahead
        if slot.turn is not None:
            if slot.turn.id != turn_id:
                if turn_id in slot.passed:
                    # S1: a turn the worker went past before the one its marker named.
                    passed = next((t for t in ahead if t.id == turn_id), None)
                    if passed is not None and not passed.started:
                        passed.started = True
                        passed.started_at = self._clock()
                    return
                self.bad_frames += 1  # one turn at a time: another turn's Started is out of order
            return  # (a repeat of the running turn's Started is harmless)
        if not ahead:
            self.bad_frames += 1
            return
        turn: TurnRecord | None = ahead[0]
        if turn is not None and turn.id != turn_id:
            turn = next((t for t in ahead if t.id == turn_id), None)
            if turn is None:
                self.bad_frames += 1
                return
        assert turn is not None
        self._start_turn(slot, turn, self._clock())

    def _on_end(self, slot: WorkerSlot, msg: wire.End) -> None:
        turn = slot.turn
        turn_id = msg.turn_id
        if msg.ack:
            # The worker holds back its next handed turn until this End is known here.
            self._send(slot, wire.EndAck(turn_id))
        if turn is None or turn.id != turn_id:
            handed = next((t for t in slot.ahead if t.id == turn_id), None)
            if handed is not None and handed.id in slot.passed and handed.started:
                # S1: the end of a turn the worker went past; its own outcome stands.
                self._unhand(slot, handed)
                self._finish(
                    handed, msg.outcome, output=_output_of(msg), error=msg.error, worker_pid=slot.pid
                )
                slot.turns_run += 1
                self._after_turn(slot)
                return
            if handed is None or handed.cause is None:
                # S3: an End for a turn this worker does not run is taken only as the answer
                # to an Abort the supervisor sent for a handed turn. Anything else (an agent
                # forging another turn's end over its worker's connection) changes nothing.
                self.bad_frames += 1
                return
            # A handed turn the worker dropped unstarted on Abort.
            self._unhand(slot, handed)
            self._finish(handed, "aborted")
            self._after_turn(slot)
            return
        if turn.escalation:
            return  # once SIGTERM went out the outcome is "killed", whatever the worker says
        # (A slot doomed only because a send to it failed still reports truthfully: a turn
        # that ended before the worker died keeps its real outcome.)
        slot.turn = None
        slot.turns_run += 1
        if turn.started_at is not None:
            self._note_turn_time(self._clock() - turn.started_at)
        self._finish(turn, msg.outcome, output=_output_of(msg), error=msg.error, worker_pid=slot.pid)
        self._after_turn(slot)

    def _on_ready(self, slot: WorkerSlot, msg: wire.Ready) -> None:
        pool = self.pool
        if not slot.pid:
            pool.zygote_pids()
            if not slot.pid and slot.state == "starting" and msg.token == slot.token:
                # An embryo woken by the zygote can say Ready before the zygote's report
                # of its pid reaches us: hold the Ready until that report is read.
                slot.deferred_ready = msg
                return
        if slot.state != "starting" or msg.token != slot.token or msg.pid != slot.pid:
            self.bad_frames += 1
            return
        if msg.version != wire.PROTOCOL_VERSION:
            self.bad_frames += 1
            slot.failure = (
                f"worker {slot.id} (pid {slot.pid}) speaks protocol {msg.version}, "
                f"expected {wire.PROTOCOL_VERSION}"
            )
            pool.last_start_error = slot.failure
            _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)
            return
        if slot.timer is not None:
            slot.timer.cancel()
        slot.state = "idle"
        slot.ready_at = self._clock()
        pool.start_failures = 0
        self._dispatch.idle.append(slot)
        if pool.ready_event is not None and pool.ready_count() >= self.workers:
            pool.ready_event.set()
        self._pump()

    def _on_spawn_cancel(self, slot: WorkerSlot, msg: wire.SpawnCancel) -> None:
        child_id = slot.spawns.get(msg.req)
        child = self._turns.get(child_id) if child_id else None
        if child is not None:
            self._cancel(child, PARENT)

    def _on_revoked(self, slot: WorkerSlot, msg: wire.Revoked) -> None:
        handed = next((t for t in slot.ahead if t.id == msg.turn_id), None)
        if handed is None:
            self.bad_frames += 1
            return
        self._unhand(slot, handed)
        if handed.cause is not None:
            self._finish(handed, "aborted")
        else:
            self._queue.push(handed, front=True)
        self._after_turn(slot)

    def _on_heartbeat(self, slot: WorkerSlot, msg: wire.Heartbeat) -> None:
        pass

    def _on_bad_frame(self, slot: WorkerSlot, msg: wire.BadFrame) -> None:
        log.warning("worker %s could not decode a frame: %s", slot.id, msg.reason)

    def _on_spawn(self, slot: WorkerSlot, msg: wire.Spawn) -> None:
        parent = slot.turn
        if parent is None or parent.id != msg.parent or parent.state != "running":
            self._send(
                slot,
                wire.SpawnReply(msg.req, error=TurnError("SpawnError", "the parent turn is not running")),
            )
            return
        if parent.cause is not None:
            self._send(
                slot, wire.SpawnReply(msg.req, error=TurnError("SpawnError", "the parent turn was cancelled"))
            )
            return
        try:
            child = self._accept(
                msg.agent,
                msg.input,
                session=msg.session,
                timeout=msg.timeout,
                grace=msg.grace,
                kill_after=msg.kill_after,
                turn_id=None,
                parent=parent.id,
            )
        except (TypeError, ValueError, QueueFull, SupervisorClosed) as exc:
            self._send(slot, wire.SpawnReply(msg.req, error=TurnError(type(exc).__name__, str(exc))))
            return
        parent.children.add(child.id)
        child.spawn_origin = (slot, msg.req)
        slot.spawns[msg.req] = child.id
        # The parent waits on its child: it lends its slot, so the pool can never deadlock.
        self._lent += 1
        for handed in slot.ahead:  # they would wait behind the parent: give them back
            if not handed.revoking and handed.cause is None:
                handed.revoking = True
                self._send(slot, wire.Revoke(handed.id))
        self._fill_pool()
        self._pump()

    async def _memory_loop(self) -> None:
        assert self.max_rss_mb is not None
        limit = self.max_rss_mb * 2**20
        while True:
            await anyio.sleep(self.rss_interval)
            for slot in list(self._slots.values()):
                turn = slot.turn
                if turn is None and slot.state == "busy":
                    turn = self._note_marked_start(slot)  # S1: running, though its Started is stuck
                if (
                    slot.state == "busy"
                    and turn is not None
                    and turn.state == "running"
                    and turn.cause is None
                ):
                    # PSS, not summed RSS: N forked children of a worker share its pages. Read in a
                    # thread: smaps_rollup walks page tables (≈ 0.1 ms per process, more when large).
                    used = await anyio.to_thread.run_sync(_procs.memory_of_tree, slot.pid)
                    if slot.turn is not turn or turn.cause is not None or turn.state != "running":
                        continue  # it moved on while we measured
                    if used > limit:
                        log.warning(
                            "turn %s: worker tree of pid %s passed %s MiB", turn.id, slot.pid, self.max_rss_mb
                        )
                        self._cancel(turn, wire.MEMORY)


def _output_of(msg: wire.End) -> Any:
    """An End's output, decoded; ``None`` if it cannot be (the turn's outcome still stands)."""
    try:
        return wire.decode_payload(msg.output)
    except msgspec.DecodeError:
        return None
