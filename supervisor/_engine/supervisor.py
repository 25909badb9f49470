"""The embedded supervisor: owns the pool, the turn table, the queue and every turn's cancellation.

One anyio event loop owns all state; nothing here blocks on another thread. ``Supervisor`` keeps
the public API and one handler per message a worker sends, and wires the parts (as pebble's
``PoolManager`` composes its managers). Each part is given what it reads and writes, never the
``Supervisor`` (``tests/test_layout.py`` checks):

* the ``EngineOptions`` (``settings.py``): the arguments, checked once, frozen;
* the ``TurnBook`` (``book.py``): the turn table and the ``TurnQueue`` (``turns.py``) with their
  counters; a turn's state changes only through ``states.move`` (``states.py``, TURN-STATES);
* the worker link (``link.py``: a ROUTER on a private ipc endpoint; ``link.send`` is every part's
  send callback), the pool (``pool.py``: ``workers`` slots plus ``spares`` warm workers), the
  ``Timers`` (``timers.py``: every deadline, and the clock) and the ``Hooks`` (``hooks.py``);
* ``Admission`` (``admission.py``: the one way in), ``ChildTurns`` (``children.py``), the
  ``Dispatcher`` (``dispatch.py``: prefetch, JOURNAL-GATE, LADDER-EARLY), the ``Escalation``
  (``escalation.py``: ``Abort`` → ``grace`` → SIGTERM to the tree → ``kill_after`` → SIGKILL → reaped →
  ``killed``), the ``Finisher`` (``ending.py``: one result, delivered once, after quiescence), the
  ``ExitHandler`` (``exits.py``: a worker's death), the ``MemoryWatchdog`` (``memory.py``) and the
  ``Lifecycle`` (``lifecycle.py``: starting, disposing; DAEMON-KEEP-QUEUED's queued turns set aside at a
  daemon's stop).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import msgspec

import wire
from wire import USER, Cause, TurnError, TurnResult, validate_cause, worker_link

from .._checks import (
    AGENT_RE,
    MAX_GRACE,
    MAX_INPUT_BYTES,
    MAX_TURN_ID,
    check_agent,
)
from .._errors import SupervisorClosed, shown_id
from .._handle import TurnHandle
from .._host import refuse_inside_worker
from .._stream import OwnedStreams
from .._tracing import TurnSpans
from . import output as _output
from . import procs as _procs
from .admission import AcceptMany, Admission
from .allowlist import AgentAllowlist
from .book import TurnBook
from .children import ChildTurns
from .dispatch import Dispatcher, DispatchGate
from .ending import Finisher, output_of
from .escalation import Escalation
from .exits import MAX_HANDOVERS, ExitHandler
from .hooks import AcceptHook, EventHook, Hooks, ResultHook, StartHook
from .lifecycle import Changes, Lifecycle
from .link import WorkerLink
from .pool import WorkerPool, WorkerSlot
from .settings import EngineOptions
from .states import gate_cleared, gate_recorded
from .steps import StepRecords
from .timers import Timers
from .turninfo import Views
from .turns import TurnQueue, TurnRecord, TurnTable, input_known, request_differs, wait_done

__all__ = ["AGENT_RE", "MAX_GRACE", "MAX_HANDOVERS", "MAX_TURN_ID", "Supervisor", "check_agent"]

log = logging.getLogger("turnpool.supervisor")


class Supervisor(AcceptMany, OwnedStreams, Views):
    """Runs agent turns in a pool of worker processes and owns their cancellation.

    Use as ``async with Supervisor(...) as sup:``; leaving the block disposes: every turn is cancelled with
    cause ``disposed``, escalated as needed, and every worker reaped.

    Speed knobs (keyword-only): ``prefetch`` caps the turns a worker holds at once (running + handed ahead; 1
    turns it off) and ``prefetch_window`` is how much work, at the recent mean turn time, may wait handed
    ahead behind a running turn (2 ms: trivial turns are prefetched deeply, long agent turns not at all); a
    handed-ahead turn still counts as queued until it starts. ``zygote`` forks workers from a preloaded
    process (a few ms instead of a fresh interpreter; workers inherit the environment as it was when the
    supervisor started); ``preload`` names modules it imports for every worker.

    ``cgroups`` (default True): each worker in a cgroup v2 of its own where the hierarchy is writable (root,
    or a delegated subtree), its tree killed at once with ``cgroup.kill``; ``False`` forces the fallback
    (subreaper, freeze-and-signal, tree markers), used where cgroups cannot be. ``max_rss_mb`` is compared
    with the tree's PSS (shared pages split between the processes mapping them). Memory bounds in bytes beside
    the counts (MiB, keyword-only): ``max_input_mb``, the inputs of turns not ended (``QueueFull`` past it);
    ``keep_events_mb``, ended turns' events; ``keep_results_mb``, the outputs of the ended turns kept (the
    oldest forgotten first). Isolation (keyword-only): ``agent_path`` is where workers import agents from
    (WORKER-PATH): directories searched first and exactly, then installed packages; ``None`` (default) mirrors
    this process's ``sys.path``. Workers run in ``python -P`` safe-path mode from this supervisor's private
    runtime directory: a module planted in a working directory never runs. ``worker_output`` is where workers'
    stdout and stderr go (WORKER-OUTPUT), never shared with this process's stderr: ``"stderr"`` (default)
    forwards each line, prefixed ``w<n>[pid]``, to this process's stderr through a thread, so a stalled stderr
    never blocks the supervisor; a file path writes them to that log, rotated by size
    (``worker_output_max_mb``, default 16, per file; four files at most: ``PATH``, ``PATH.1`` … ``PATH.3``);
    ``None`` discards them; ``"inherit"`` shares this process's fd 2 with the workers (a stalled stderr then
    stalls workers and this process alike). ``worker_nice`` (0-19): workers below this process (WORKER-NICE).
    ``allow_agents``: agent globs turns and their children may name (SEC-ALLOW). ``tracing``: a span per turn
    (OBS-TRACE).
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
        max_input_mb: float = MAX_INPUT_BYTES / 2**20,
        max_events: int = 10_000,
        keep_results: int = 10_000,
        keep_events_mb: float = 256.0,  # turns.KEEP_EVENT_BYTES (tests/test_memory_budgets.py checks)
        keep_results_mb: float = 1024.0,  # turns.KEEP_RESULT_BYTES
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
        worker_nice: int | None = None,
        tracing: bool = False,
        allow_agents: Any = None,
    ) -> None:
        refuse_inside_worker()  # API-NO-NESTING: no pool of pools from an agent module imported by a worker
        self.options = options = EngineOptions.checked(
            workers=workers,
            grace=grace,
            kill_after=kill_after,
            spares=spares,
            max_turns_per_worker=max_turns_per_worker,
            max_rss_mb=max_rss_mb,
            timeout=timeout,
            max_queue=max_queue,
            max_input_mb=max_input_mb,
            max_events=max_events,
            keep_results=keep_results,
            keep_events_mb=keep_events_mb,
            keep_results_mb=keep_results_mb,
            heartbeat=heartbeat,
            start_timeout=start_timeout,
            rss_interval=rss_interval,
            stop_timeout=stop_timeout,
            python=python,
            worker_args=worker_args,
            prefetch=prefetch,
            prefetch_window=prefetch_window,
            zygote=zygote,
            preload=preload,
            cgroups=cgroups,
            agent_path=agent_path,
            worker_output=worker_output,
            worker_output_max_mb=worker_output_max_mb,
            max_grace=max_grace,
            worker_nice=worker_nice,
            allow_agents=allow_agents,
        )
        # The timers hold the clock: the event loop's once started (asyncio's loop.time(): monotonic).
        self.timers = timers = Timers(time.monotonic)
        table = TurnTable(keep_results, max_events, options.keep_event_bytes, options.keep_result_bytes)
        self.book = book = TurnBook(table, TurnQueue())  # MEM-EVENTS, MEM-OUTPUTS
        self.bad_frames = 0  # frames from workers refused: unknown sender, undecodable, out of order
        self._hooks = hooks = Hooks()
        if tracing:
            TurnSpans().install(hooks)  # ValueError without OpenTelemetry (the otel extra)
        self._changes = changes = Changes()  # a slot left the pool; the engine closed
        self.link = link = WorkerLink(
            on_message=self._on_message,
            on_batch_start=self._batch_started,
            on_batch_end=self._batch_ended,
            on_bad_frame=self._bad_frame,
        )
        prefix = secrets.token_hex(4)
        self.pool = pool = WorkerPool(
            link=link,
            timers=timers,
            prefix=prefix,
            heartbeat=options.heartbeat,
            start_timeout=options.start_timeout,
            stop_timeout=options.stop_timeout,
            python=options.python,
            worker_args=options.worker_args,
            use_zygote=options.use_zygote,
            preload=options.preload,
            on_message=self._on_message,
            on_exit=self._worker_exited,
            changed=changes.notify,
            refill=self._refill,
            nice=options.worker_nice,
        )
        send = link.send
        # LOOP-STEP-DURABLE, LOOP-RESUME: the step records of running turns, and resume after a crash.
        self.steps = steps = StepRecords(book, send, hooks, self._bad_frame)
        hooks.result.append(steps.ended)
        # The parts, each given what it reads and writes. Dispatch, escalation and ending need each
        # other (a cancel ends a queued turn, an end hands the freed worker on, a start arms the
        # ladder): the two built first are connected to the later ones once all three exist.
        self._finisher = finisher = Finisher(book, hooks, send, timers)
        self._dispatcher = dispatcher = Dispatcher(book, options, pool, send, timers, hooks, steps)
        self._escalation = escalation = Escalation(
            book,
            pool.slots,
            send,
            timers,
            hooks,
            dispatcher,
            finisher,
            _procs.signal_tree,
            pool.boost,
            pool.hurry,
        )
        finisher.connect(escalation=escalation, dispatcher=dispatcher)
        dispatcher.connect(finisher=finisher, escalation=escalation)
        # Admission: the one way in for every turn; ADAPT-PROBE: ``learn_agent`` a name not in
        # ``agents_known``.
        self._admission = admission = Admission(
            book, options, hooks, dispatcher, timers, prefix, lambda: pool.zygote
        )
        self._children = children = ChildTurns(book, send, admission, escalation, dispatcher)  # TURN-PARENT
        # Exit handling: what a worker's death means for its turns (WORKER-END-LOG, LADDER-EARLY,
        # LADDER-STEPS).
        self._exits = ExitHandler(book, pool, link.drain, dispatcher, finisher, timers, changes.notify, steps)
        # Starting and disposing (API-ASYNCIO: its background tasks live in a task of their own).
        self._life = Lifecycle(book, options, pool, link, timers, dispatcher, escalation, finisher, changes)
        # One handler per message type a worker sends (``_on_message``).
        self._handlers: dict[type, Callable[[WorkerSlot, Any], None]] = {
            worker_link.Event: self._on_event,
            worker_link.Started: self._on_started,
            worker_link.End: self._on_end,
            worker_link.Ready: self._on_ready,
            worker_link.Spawn: children.spawn,
            worker_link.SpawnCancel: children.cancel,
            worker_link.Revoked: self._on_revoked,
            worker_link.Heartbeat: self._on_heartbeat,
            worker_link.BadFrame: self._on_bad_frame,
            worker_link.Step: steps.on_step,
        }

    # ---- read-only accessors front ends use ---------------------------------------------

    @property
    def table(self) -> TurnTable:
        """The turn table (``book.table``): read it, never change it."""
        return self.book.table

    @property
    def queue(self) -> TurnQueue:
        """The queue of turns waiting for a worker (``book.queue``): read it, never change it."""
        return self.book.queue

    @property
    def workers(self) -> int:
        return self.options.workers

    @property
    def spares(self) -> int:
        return self.options.spares

    @property
    def prefetch(self) -> int:
        return self.options.prefetch

    @property
    def max_events(self) -> int:
        return self.options.max_events

    @property
    def keep_results(self) -> int:
        return self.options.keep_results

    @property
    def allow_agents(self) -> AgentAllowlist | None:
        return self.options.allow_agents

    @property
    def input_bytes(self) -> int:
        """The inputs of turns not ended, in bytes (MEM-INPUTS)."""
        return self.book.input_bytes

    @property
    def worker_restarts(self) -> int:
        return self._exits.restarts

    @property
    def agents_known(self) -> dict[str, str | None]:
        """ADAPT-PROBE: the agent names probed, each with why it is refused (``None``: accepted)."""
        return self._admission.agents.kinds

    async def learn_agent(self, agent: Any) -> None:
        """ADAPT-PROBE: probe ``agent`` (a name not in ``agents_known``) before its first turn is accepted."""
        await self._admission.learn(agent)

    # ---- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Supervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Bind the worker link, start the pool and wait until ``workers`` workers are ready."""
        await self._life.start()

    async def aclose(self) -> None:
        """Dispose: cancel every turn with cause ``disposed``, escalate, reap, release everything.

        Returns only when every worker and every descendant of one has been reaped.
        """
        await self._life.aclose()

    def kill_now(self, turn_ids: Iterable[str] | None = None) -> None:
        """Skip the rest of every ladder: each live turn already being cancelled gets SIGKILL to
        its worker's tree now (it ends ``killed``), and from now on every cancel (disposal's
        included) does so at once, without grace or kill_after. Turns not cancelled run on.

        With ``turn_ids``, only those turns get SIGKILL now, cancelled or not, and later cancels
        keep their ladder. For a second SIGTERM/SIGINT (``turnpool serve``; a batch's second
        Ctrl-C): shutdown then waits for no client-chosen grace. Synchronous; call it on the
        supervisor's event loop. Unknown or ended ids are skipped.
        """
        self._escalation.kill_now(turn_ids)

    @property
    def closed(self) -> bool:
        return self.book.phase in ("closing", "closed")

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
        ``retry=True`` runs the turn again when its worker dies while it runs, or after a restart of a
        daemon with a journal that interrupted it (``attempts`` counts the runs), resuming from its
        recorded steps (LOOP-RESUME, docs/durability.md); otherwise such a turn ends ``crashed``.
        """
        # TypeError (also LINK-EXACT: a value that would come back a string), or PayloadTooLarge (ValueError)
        raw = wire.encode_payload(input, what="turn input", exact=True)
        admission = self._admission
        if type(agent) is str and agent not in admission.agents.kinds:  # ADAPT-PROBE: probed once
            await admission.learn(agent)
        turn = admission.accept(
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
        return TurnHandle(self, turn.id, pin=turn)  # API-HANDLE-KEEPS: the handle holds the record

    async def run(self, agent: str, input: Any = None, **kwargs: Any) -> TurnResult:
        """``submit`` then ``result``; the caller owns the turn (API-RUN-OWNS).

        Cancelling the task that awaits ``run`` (a cancel scope, ``asyncio.wait_for``,
        ``Task.cancel()``) cancels the turn with cause ``user`` and returns (raising the
        cancellation) only once the turn is quiescent. A wait on a handle's ``result()`` or
        ``events()`` only observes: cancelling it leaves the turn running."""
        handle = await self.submit(agent, input, **kwargs)
        turn = self.book.table.get(handle.turn_id)
        try:
            return await self.result(handle.turn_id)
        except BaseException:
            if turn.result is None:
                self._escalation.cancel(turn, USER)
                await self._finisher.wait_quiescent(turn)
            raise

    def handle(self, turn_id: str) -> TurnHandle:
        """A handle on an existing turn; raises ``UnknownTurn``."""
        return TurnHandle(self, turn_id, pin=self.book.table.get(turn_id))

    async def cancel(self, turn_id: str, cause: Any = None) -> Cause | None:
        """Cancel a turn (default cause ``{"kind": "user"}``); returns the winning cause.

        On a turn that already ended nothing changes and the winning cause (or ``None``) is
        returned. Raises ``UnknownTurn``, ``TypeError``/``ValueError`` for a bad cause.
        """
        accepted = validate_cause(cause)
        turn = self.book.table.get(turn_id)
        return self._escalation.cancel(turn, accepted)

    async def cancel_session(self, session: str, cause: Any = None) -> list[str]:
        """Cancel the running turn of ``session`` and clear its turns queued now.

        Turns submitted afterwards run normally. Returns the ids of the turns cancelled.
        """
        accepted = validate_cause(cause)
        if not isinstance(session, str) or not session:
            raise TypeError(f"session must be a non-empty string, got {shown_id(session)}")
        return self._escalation.cancel_session(session, accepted)

    async def when_idle(self) -> None:
        """Return once no turn is queued or running, and every interrupted worker is reaped."""
        await self._finisher.wait_idle()

    async def reload(self) -> dict[str, int]:
        """Replace every worker gracefully so that turns starting from now import agent code anew
        (WORKER-RELOAD; ``turnpool reload`` on a daemon). A worker keeps the modules it imported, with their
        globals, for its whole life: edited code reaches only workers started after the edit. Turns running
        now finish on their old workers, which are then retired; idle workers are replaced at once. Modules
        named in ``preload`` are imported once by the zygote and are not refreshed (restart the supervisor for
        those). Returns ``{"workers": replaced, "busy": of those, still finishing a turn}``. Raises
        ``SupervisorClosed`` when closed."""
        if self.book.phase != "running":
            raise SupervisorClosed("the supervisor is not running")
        return self.recycle_workers()

    def recycle_workers(self) -> dict[str, int]:
        """``reload``, synchronous, for a front end on the supervisor's event loop (the daemon)."""
        self._admission.agents.clear()  # ADAPT-PROBE: agent code may have changed
        return self._dispatcher.recycle()

    def keep_queued(self) -> list[str]:
        """DAEMON-KEEP-QUEUED: set aside, for a journal to run at the next start, every turn still queued that
        no worker was ever cleared to take: it leaves the queue without an end (no result, no end hook: its
        journal row stays ``queued``); whoever waits on it gets ``SupervisorClosed``. Child turns (their
        parent is being disposed) and turns already cleared for a worker (JOURNAL-GATE: their row says they
        may have run) are left to disposal. Call it at shutdown, before ``aclose``; the ids set aside, in
        queue order."""
        return self._life.keep_queued()

    # ---- the Backend contract: results and events --------------------------------------

    def record(self, turn_id: str) -> TurnRecord:
        """The live record of a turn (for front ends and tests: read it, never change it);
        raises ``UnknownTurn``."""
        return self.book.table.get(turn_id)

    def find(self, turn_id: str) -> TurnRecord | None:
        """The record of ``turn_id``, or ``None`` if this supervisor does not know it (kept, or
        beyond ``keep_results`` but held by a handle: API-HANDLE-KEEPS)."""
        return self.book.table.find(turn_id)

    def request_differs(
        self, turn: TurnRecord, agent: str, raw: msgspec.Raw, session: str | None
    ) -> tuple[str, ...]:
        """API-TURN-ID: what differs (``agent``, ``input``, ``session``) between ``turn``'s request and this
        one; an input the record cannot tell (restored from a journal) is not counted."""
        return request_differs(turn, agent, raw, session)

    def knows_input(self, turn: TurnRecord) -> bool:
        """API-TURN-ID: whether ``turn``'s record can tell its input apart (``False`` for a result
        restored from a journal: ask the journal)."""
        return input_known(turn)

    def records(self) -> list[TurnRecord]:
        """Every record this supervisor holds now: live turns and retained ended ones."""
        return list(self.book.table.records.values())

    async def result(self, turn_id: str) -> TurnResult:
        """Wait for the turn's one outcome (``TurnHandle.result``); raises ``UnknownTurn``."""
        turn = self.book.table.get(turn_id)
        if turn.result is None:
            # A bare asyncio future (API-BARE-FUTURE), not anyio's event: this engine runs on asyncio only,
            # and anyio's constructor looks the backend up on every call.
            await wait_done(turn)
        if turn.result is None and turn.state == "kept":  # DAEMON-KEEP-QUEUED: set aside for the next start
            raise SupervisorClosed(
                f"turn {shown_id(turn.id)} was still queued when the supervisor stopped: it stays in the "
                "journal and runs when the daemon starts again"
            )
        assert turn.result is not None
        return turn.result

    def follow_raw(self, turn_id: str) -> AsyncIterator[tuple[int, msgspec.Raw]]:
        """The turn's events as ``(seq, raw)`` from the oldest retained; ends when the turn ends.

        At most ``max_events`` events are retained per turn, and ``keep_events_mb`` in all for ended
        turns (MEM-EVENTS): a follower that starts late or falls further behind skips the dropped
        ones (``seq`` shows the gap; ``events`` yields an ``EventsDropped`` marker there). Raises
        ``UnknownTurn`` at once.
        """
        table = self.book.table
        table.get(turn_id)
        return table.follow(turn_id)

    def events(self, turn_id: str) -> AsyncIterator[Any]:
        """The turn's events, decoded (``TurnHandle.events``), in order; where this follower lost
        events to the bounded buffer, one ``EventsDropped(count, first)`` stands in their place
        (EVENTS-DROPPED). Raises ``UnknownTurn`` at once."""
        table = self.book.table
        table.get(turn_id)
        return table.events(turn_id)

    # ---- for front ends: named engine entry points -------------------------------------

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
            self._hooks.accept.append(on_accept)
        if on_start is not None:
            self._hooks.start.append(on_start)
        if on_event is not None:
            self._hooks.event.append(on_event)
        if on_result is not None:
            self._hooks.result.append(on_result)

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
        attempts: int = 1,
        readmit: bool = False,
    ) -> TurnRecord:
        """``submit`` for an input already encoded (a daemon passes its client's bytes through):
        validates like ``submit`` and returns the turn's record. A known ``turn_id`` returns the
        existing record (never runs twice).

        ``readmit=True`` accepts again a turn the journal already acknowledged (restart recovery,
        JOURNAL-RECOVERY), its ``attempts`` so far counted: the ``max_queue`` limit does not apply, since
        refusing would lose a turn a client was promised. For recovery only."""
        return self._admission.accept(
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
            readmit=readmit,
        )

    def restore_result(self, result: TurnResult) -> None:
        """Register a turn that ended before this supervisor started (a daemon's journal), so
        ``handle(id).result()`` and ``cancel(id)`` answer for it as for any ended turn."""
        self.book.table.restore(result, self.timers.clock())

    def cancel_record(self, turn: TurnRecord, cause: Cause) -> Cause | None:
        """``cancel`` for a record already looked up and a cause already validated (synchronous)."""
        return self._escalation.cancel(turn, cause)

    def cancel_session_now(self, session: str, cause: Cause) -> list[str]:
        """``cancel_session`` with a validated cause, synchronous: the ids cancelled."""
        return self._escalation.cancel_session(session, cause)

    def set_dispatch_gate(self, gate: DispatchGate) -> None:
        """JOURNAL-GATE: from now on a new turn is handed to a worker only once ``mark_recorded`` said its
        accept row is committed and ``gate`` (called with turns from the head of the queue whose
        row is written, JOURNAL-GATE-SHARE) answered ``clear_for_dispatch``. Set before the first submit."""
        self._dispatcher.gate = gate

    def dispatch_once(self, calls: Iterable[Callable[[], Any]]) -> None:
        """Run ``calls`` (a journal commit's callbacks: ``mark_recorded``, ``clear_for_dispatch``)
        with dispatch deferred to their end, as a receive batch from the workers is (JOURNAL-DISPATCH-ONCE): a
        commit of a thousand accept rows pumps once, not once per row (each pump walks up to
        capacity × depth turns at the head of the queue)."""
        dispatch = self._dispatcher
        if dispatch.defer:  # already inside a batch: its end pumps
            for call in calls:
                call()
            return
        dispatch.defer = True
        try:
            for call in calls:
                call()
        finally:
            dispatch.end_deferral()

    def mark_written(self, turn: TurnRecord) -> None:
        """JOURNAL-GATE-SHARE: the journal wrote ``turn``'s accept row, not committed yet
        (``Dispatcher.written``)."""
        self._dispatcher.written(turn)

    def mark_recorded(self, turn: TurnRecord) -> None:
        """JOURNAL-GATE: the journal committed ``turn``'s accept row: it may now pass the dispatch gate."""
        gate_recorded(turn)
        self._dispatcher.pump()

    def clear_for_dispatch(self, turns: list[TurnRecord]) -> None:
        """JOURNAL-GATE: the gate committed the "may run" row of ``turns``: hand them to workers."""
        for turn in turns:
            gate_cleared(turn)
        self._dispatcher.pump()

    def withdraw(self, turn: TurnRecord, why: str) -> None:
        """JOURNAL-GATE: a turn whose accept row could not be committed: it was never acknowledged and never
        ran (the gate held it); it ends ``failed`` (``JournalUnavailable``) and its id is forgotten."""
        if turn.state == "queued" and not turn.recorded:  # (JOURNAL-GATE-SHARE: cleared or not, never handed)
            self.book.queue.discard(turn)
            self._finisher.finish(turn, "failed", error=TurnError("JournalUnavailable", why))
        if turn.parent is None and turn.state == "ended":
            self.book.table.records.pop(turn.id, None)

    # ---- the pool ----------------------------------------------------------------------

    def _refill(self) -> None:
        """The pool asks to be topped up (after a back-off, or a lost worker)."""
        self._dispatcher.refill()

    async def _worker_exited(self, slot: WorkerSlot) -> None:
        """The pool saw ``slot``'s worker exit: settle its turns."""
        await self._exits.on_exit(slot)

    # ---- messages from workers: one method per message type -----------------------------

    def _bad_frame(self) -> None:
        self.bad_frames += 1

    def _batch_started(self) -> None:
        # Inside a receive batch dispatch runs once, at the end of the batch (not once per message).
        self._dispatcher.defer = True

    def _batch_ended(self) -> None:
        self._dispatcher.end_deferral()  # its sends still go out as one frame per worker

    def _on_message(self, slot: WorkerSlot, msg: Any) -> None:
        handler = self._handlers.get(type(msg))
        if handler is not None:
            handler(slot, msg)

    def _on_event(self, slot: WorkerSlot, msg: worker_link.Event) -> None:
        turn = slot.turn
        if turn is None or turn.id != msg.turn_id:
            self.bad_frames += 1  # not the turn this worker runs: out of order, ignored
            return
        data = msg.data
        self.book.table.add_event(turn, data)
        for hook in self._hooks.event:
            hook(turn, data)

    def _on_started(self, slot: WorkerSlot, msg: worker_link.Started) -> None:
        running = slot.turn
        if running is None:
            if self._dispatcher.started_ahead(slot, msg.turn_id):
                slot.heard = True
            else:
                self.bad_frames += 1  # no turn of that id is handed to this worker
        elif running.id == msg.turn_id:
            slot.heard = True  # (a repeat, or the Started of a turn its start marker showed first)
        elif not self._dispatcher.started_passed(slot, msg.turn_id):
            self.bad_frames += 1  # one turn at a time: another turn's Started is out of order

    def _on_end(self, slot: WorkerSlot, msg: worker_link.End) -> None:
        turn = slot.turn
        turn_id = msg.turn_id
        dispatcher = self._dispatcher
        dispatcher.retire_if_kept(slot, turn, turn_id)  # MEM-RETIRE: before the EndAck lets it go on
        if msg.ack and not (turn is not None and turn.id == turn_id and turn.escalation):
            # The worker holds back its next handed turn until this End is known here. A worker
            # being killed never gets it (LADDER-HANDOVER): it starts nothing more.
            self.link.send(slot, worker_link.EndAck(turn_id))
        if turn is None or turn.id != turn_id:
            if not dispatcher.ended_ahead(slot, msg):
                self.bad_frames += 1  # SEC-FORGE: not the end of a turn handed here that it could end
            return
        # TURN-ONE-OUTCOME: exactly one outcome; once SIGTERM went out it is killed.
        if turn.escalation:
            return  # once SIGTERM went out the outcome is "killed", whatever the worker says
        # (A slot doomed only because a send to it failed still reports truthfully: a turn
        # that ended before the worker died keeps its real outcome.)
        slot.turn = None
        slot.turns_run += 1
        if turn.started_at is not None:
            dispatcher.note_turn_time(self.timers.clock() - turn.started_at)
        output = output_of(msg, turn)
        self._finisher.finish(turn, msg.outcome, output=output, error=msg.error, worker_pid=slot.pid)
        dispatcher.after_turn(slot)

    def _on_ready(self, slot: WorkerSlot, msg: worker_link.Ready) -> None:
        pool = self.pool
        answer = pool.ready(slot, msg, self.timers.clock())
        if answer == "refused":
            self.bad_frames += 1
        elif answer == "ready":
            self._dispatcher.idle.append(slot)
            if pool.ready_event is not None and pool.ready_count() >= self.options.workers:
                pool.ready_event.set()
            self._dispatcher.pump()

    def _on_revoked(self, slot: WorkerSlot, msg: worker_link.Revoked) -> None:
        if not self._dispatcher.revoked(slot, msg.turn_id):
            self.bad_frames += 1  # no turn of that id is handed to this worker

    def _on_heartbeat(self, slot: WorkerSlot, msg: worker_link.Heartbeat) -> None:
        pass

    def _on_bad_frame(self, slot: WorkerSlot, msg: worker_link.BadFrame) -> None:
        log.warning("worker %s could not decode a frame: %s", slot.id, msg.reason)
