"""Read-only views of turns for front ends (the HTTP API and its dashboard).

``Supervisor.turn_info``, ``Supervisor.turns`` and ``Supervisor.status`` call these; nothing here
changes a turn. The views are plain dicts of JSON-able values with wall-clock times (epoch seconds, like
``TurnResult.submitted_at``), so a front end never needs the private ``TurnRecord``.

The escalation fields say where a cancelled turn stands on the ladder (SPEC, "Escalation
ladder"): ``escalation`` is ``None`` (not cancelled), ``"abort"`` (``Abort`` sent, grace
running), ``"sigterm"`` or ``"sigkill"`` (the last signal sent); ``next_signal`` and
``next_signal_at`` name the step still to come and when it is due, so a dashboard can count down.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import wire
from worker import lowlevel

from . import treemem

if TYPE_CHECKING:
    from .book import TurnBook
    from .dispatch import Dispatcher
    from .ending import Finisher
    from .escalation import Escalation
    from .exits import ExitHandler
    from .link import WorkerLink
    from .pool import WorkerPool, WorkerSlot
    from .settings import EngineOptions
    from .turns import TurnRecord

TURN_STATES = ("queued", "running", "ended")
_PUBLIC_STATE = {
    "queued": "queued",
    "handed": "queued",
    "running": "running",
    "ending": "running",
    "ended": "ended",
}
_STEP = {0: "abort", 1: "sigterm", 2: "sigkill"}
_NEXT = {0: "sigterm", 1: "sigkill"}


def info(turn: TurnRecord, offset: float, *, with_input: bool = False) -> dict[str, Any]:
    """One turn's live facts as a JSON-able dict (see the module docstring); ``offset``: the loop
    clock's reading to epoch seconds (``TurnBook.wall_offset``)."""
    cancelled = turn.cause is not None
    escalation = _STEP.get(turn.escalation) if cancelled or turn.escalation else None
    nxt = None
    nxt_at = None
    esc = turn.esc_timer
    if esc is not None and esc.active and turn.state in ("running", "ending"):
        nxt = _NEXT.get(turn.escalation)
        nxt_at = esc.when + offset
    deadline = turn.timer
    out: dict[str, Any] = {
        "turn_id": turn.id,
        "state": _PUBLIC_STATE[turn.state],
        "agent": turn.agent,
        "session": turn.session,
        "parent": turn.parent,
        "worker_pid": _worker_pid(turn),
        "submitted_at": turn.submitted_at + offset,
        "started_at": turn.started_at + offset if turn.started_at is not None else None,
        "ended_at": turn.ended_at + offset if turn.ended_at is not None else None,
        "events": turn.events_base + len(turn.events),
        "cause": turn.cause.to_dict() if turn.cause is not None else None,
        "escalation": escalation,
        "next_signal": nxt,
        "next_signal_at": nxt_at,
        "deadline_at": deadline.when + offset if deadline is not None and deadline.active else None,
        "timeout": turn.timeout,
        "grace": turn.grace,
        "kill_after": turn.kill_after,
        "outcome": turn.result.outcome if turn.result is not None else None,
    }
    if with_input:
        raw = turn.input
        out["input"] = wire.decode_payload(raw) if raw is not None else None
        out["input_retained"] = raw is not None
    return out


def _worker_pid(turn: TurnRecord) -> int | None:
    """The worker running the turn, or the one that ran it once it ended (as its result says)."""
    slot = turn.worker
    if slot is not None and turn.state in ("running", "ending"):
        return slot.pid
    result = turn.result
    return result.worker_pid if result is not None and turn.state == "ended" else None


def _running(book: TurnBook, slots: dict[str, WorkerSlot]) -> Iterator[TurnRecord]:
    for slot in list(slots.values()):
        if slot.turn is not None and slot.turn.state in ("running", "ending"):
            yield slot.turn


def _queued(book: TurnBook, slots: dict[str, WorkerSlot]) -> Iterator[TurnRecord]:
    for slot in list(slots.values()):
        yield from (t for t in slot.ahead if t.state == "handed")
    queue = book.queue
    yield from (t for t in queue.ready if t.state == "queued")
    for waiting in list(queue.waiting.values()):
        yield from (t for t in waiting if t.state == "queued")


def _ended(book: TurnBook, slots: dict[str, WorkerSlot]) -> Iterator[TurnRecord]:
    table = book.table
    for turn_id in reversed(table.ended):
        turn = table.records.get(turn_id)
        if turn is not None and turn.state == "ended":
            yield turn


_SOURCES = {"running": _running, "queued": _queued, "ended": _ended}


def listing(
    book: TurnBook, slots: dict[str, WorkerSlot], states: Iterable[str], limit: int
) -> list[dict[str, Any]]:
    """Turns in ``states`` (``queued``, ``running``, ``ended``: newest first), at most ``limit``."""
    chosen = list(states)
    for state in chosen:
        if state not in _SOURCES:
            raise ValueError(f"state must be one of {', '.join(TURN_STATES)}, got {state!r}")
    found = itertools.chain.from_iterable(_SOURCES[s](book, slots) for s in chosen)
    return [info(turn, book.wall_offset) for turn in itertools.islice(found, max(0, limit))]


def page(
    book: TurnBook,
    slots: dict[str, WorkerSlot],
    state: str,
    match: Callable[[TurnRecord], bool],
    offset: int,
    limit: int,
) -> tuple[int, list[dict[str, Any]]]:
    """The turns in ``state`` that ``match``: how many there are, and the views of those from
    ``offset`` (at most ``limit``). Only the page's turns are turned into views."""
    if state not in _SOURCES:
        raise ValueError(f"state must be one of {', '.join(TURN_STATES)}, got {state!r}")
    total = 0
    chosen: list[TurnRecord] = []
    for turn in _SOURCES[state](book, slots):
        if match(turn):
            if offset <= total < offset + limit:
                chosen.append(turn)
            total += 1
    return total, [info(turn, book.wall_offset) for turn in chosen]


def status(
    book: TurnBook,
    options: EngineOptions,
    pool: WorkerPool,
    link: WorkerLink,
    counts: tuple[Finisher, Escalation, ExitHandler],
    bad_frames: int,
) -> dict[str, Any]:
    """``Supervisor.status``: the workers (with their trees' memory), the queue and the counters."""
    finisher, escalation, exits = counts
    # MEM-STATUS-SAMPLE: sampled in the background for a large pool, measured now for a small one.
    slots = pool.slots.values()
    tg = pool.tg
    memory = pool.memory.figures(
        [s.pid for s in slots if s.state != "dead" and s.pid], tg.start_soon if tg is not None else None
    )
    zero = treemem.UNKNOWN
    workers: list[dict[str, Any]] = []
    append = workers.append
    for slot in slots:
        pid = slot.pid
        # MEM-STATUS-SAMPLE: the MiB figures come rounded with the sample (2.3 of this loop's 2.9 ms).
        rss, rss_mb, pss, pss_mb = memory.get(pid, zero) if slot.state != "dead" and pid else zero
        turn = slot.turn
        append(
            {
                "id": slot.id,
                "pid": pid,
                "state": slot.state,
                "turn_id": turn.id if turn is not None else None,
                "turns_run": slot.turns_run,
                "rss": rss,
                "rss_mb": rss_mb,
                "pss": pss,
                "pss_mb": pss_mb,
                "cgroup": slot.cgroup,
            }
        )
    return {
        "pid": os.getpid(),
        "state": book.phase,
        "workers": workers,
        "size": {
            "workers": options.workers,
            "spares": options.spares,
        },  # the pool's slots beyond `workers` are spares
        "queue": book.queued(),
        "running": book.running,
        "outcomes": dict(finisher.outcomes),
        "causes": dict(finisher.causes),
        "escalations": dict(escalation.counts),
        "bad_frames": bad_frames,
        "worker_restarts": exits.restarts,
        "worker_endpoint_rebinds": link.rebinds,  # WORKER-REBIND
        "last_start_error": pool.last_start_error,
        # WORKER-FD-RETRY: EMFILE/ENFILE met starting workers (each backed off and retried), by where.
        "fd_shortage": dict(pool.shortage.counts),
        "worker_output": describe_output(options),
        "worker_output_dropped": pool.output.dropped if pool.output is not None else 0,
        "worker_output_dropped_lines": pool.output.dropped_lines if pool.output is not None else 0,
        # What enforces worker.isolated's limits here (cgroup2 / cgroup1 controllers, else rlimits).
        "tool_limits": dict(lowlevel.tool_limits_backend()),
        # The byte budgets beside the counts, each with what it holds now (I-, E-, MEM-OUTPUTS).
        "memory": {
            "inputs_mb": _mib(book.input_bytes),
            "max_input_mb": _mib(options.max_input_bytes),
            "ended_events_mb": _mib(book.table.ended_bytes),
            "keep_events_mb": _mib(book.table.keep_event_bytes),
            "ended_outputs_mb": _mib(book.table.result_bytes),
            "keep_results_mb": _mib(book.table.keep_result_bytes),
        },
    }


def _mib(n: int) -> float:
    return round(n / 2**20, 1)


def describe_output(options: EngineOptions) -> str:
    """Where workers' stdout and stderr go: a log file path, ``stderr``, ``inherit`` or ``discarded``."""
    return "discarded" if options.worker_output is None else str(options.worker_output)


class Views:
    """What ``Supervisor`` tells front ends about itself: its status, a turn's live facts, the turns
    in a state, and the counters (read-only; the parts named here are the supervisor's own)."""

    # The parts these read (set in ``Supervisor.__init__``).
    book: TurnBook
    options: EngineOptions
    pool: WorkerPool
    link: WorkerLink
    _dispatcher: Dispatcher
    _escalation: Escalation
    _finisher: Finisher
    _exits: ExitHandler
    bad_frames: int

    async def status(self) -> dict[str, Any]:
        """Workers (id, pid, state, turn_id, turns_run, rss in bytes and rss_mb: resident memory of the
        worker's whole tree summed per process, so shared pages count once per process; pss and pss_mb: its
        proportional set size, shared pages split between the processes mapping them, which is what
        ``max_rss_mb`` is compared with; cgroup: the worker's own cgroup or None), the queue and counters.

        Async, as on ``Client`` (one contract: async on the async classes, blocking on
        ``SyncSupervisor``/``SyncClient``); ``status_now`` is the synchronous form for front ends that run on
        the supervisor's loop."""
        return self.status_now()  # API-ONE-CONTRACT

    def status_now(self) -> dict[str, Any]:
        """``status()`` synchronously, for code on the supervisor's event loop (a daemon answering a
        request, a metrics scrape); users call ``await status()``."""
        counts = (self._finisher, self._escalation, self._exits)
        return status(self.book, self.options, self.pool, self.link, counts, self.bad_frames)

    def describe_output(self) -> str:
        """Where workers' stdout and stderr go: a log file path, ``stderr``, ``inherit`` or ``discarded``."""
        return describe_output(self.options)

    def turn_info(self, turn_id: str) -> dict[str, Any]:
        """One turn's live facts for front ends (state, agent, session, cause, escalation step and
        when the next signal is due, event count; its input while retained). Raises ``UnknownTurn``."""
        return info(self.book.table.get(turn_id), self.book.wall_offset, with_input=True)

    def turns(self, state: str | tuple[str, ...] = "running", *, limit: int = 100) -> list[dict[str, Any]]:
        """Turns in ``state`` (``queued``, ``running``, ``ended`` newest first; or a tuple of them) as
        ``turn_info`` dicts without input, at most ``limit``. Raises ``ValueError`` for another state."""
        return listing(self.book, self.pool.slots, (state,) if isinstance(state, str) else state, limit)

    def turns_page(
        self, state: str, match: Callable[[TurnRecord], bool], offset: int, limit: int
    ) -> tuple[int, list[dict[str, Any]]]:
        """The turns in ``state`` that ``match``: how many, and the ``turn_info`` views (without input)
        of at most ``limit`` of them from ``offset`` (the HTTP dashboard's pages). ``ValueError`` for
        another state than ``queued``, ``running`` or ``ended``."""
        return page(self.book, self.pool.slots, state, match, offset, limit)

    @property
    def active(self) -> int:
        """Turns accepted and not yet ended."""
        return self.book.active

    @property
    def running(self) -> int:
        """Turns a worker reported started and that have not ended."""
        return self.book.running

    @property
    def queued(self) -> int:
        """Turns waiting for a worker (handed ahead but not started included)."""
        return self.book.queued()

    @property
    def escalations(self) -> dict[str, int]:
        """How many times each escalation step (``sigterm``, ``sigkill``) was taken."""
        return dict(self._escalation.counts)

    @property
    def wall_offset(self) -> float:
        """Add to the loop clock's readings (``TurnRecord`` times) to get epoch seconds."""
        return self.book.wall_offset

    @property
    def prefetch_depth(self) -> int:
        """How many turns a worker may hold at once now (adapted to recent turn times)."""
        return self._dispatcher.depth
