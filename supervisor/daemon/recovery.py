"""Connects a ``Journal`` to a ``Daemon``: records every turn, and recovers after a restart.

Recording: a client's submit is acknowledged only once its row is committed; child turns
(``turn.spawn``) are recorded as they are accepted; starts and ends as they happen.

Recovery, before clients can connect:

* turns that ended are registered again, so their results can be fetched by id;
* turns that were queued run again, in their original order (sessions keep their order);
* turns that may have run (their "dispatched" row, JOURNAL-GATE, or "running" row is committed) end
  ``crashed`` (the supervisor was lost), unless they were submitted with ``retry=True``: those
  are queued again, ``attempts`` + 1; a turn still ``queued`` provably never reached a worker;
* all of them are readmitted whatever ``--max-queue`` says: they were acknowledged;
* unfinished child turns end with their parent gone: ``aborted`` (cause ``parent``) if they
  never started, ``crashed`` if they were running — a child never outlives its parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from typing import Any

import msgspec

import wire
from wire import TurnError, TurnResult

from .._engine import TurnRecord
from .._engine.supervisor import Supervisor
from .._errors import JournalUnavailable
from ..journal import Journal, RecoveredTurn
from ..journal.steps import attach_steps
from .clients import Gate
from .server import Daemon

log = logging.getLogger("turnpool.daemon")

EXIT_JOURNAL_LOST = 3  # ``turnpool serve`` exits with it when its journal file was deleted or replaced

SUPERVISOR_LOST = TurnError(
    "SupervisorLost", "the daemon stopped while this turn was running, or cleared to run"
)


def attach_journal(daemon: Daemon, journal: Journal) -> None:
    """Record every turn the daemon accepts in ``journal`` and recover unfinished ones at start.
    Call before ``daemon.serve()``.

    It also installs the supervisor's dispatch gate (JOURNAL-GATE: a turn reaches a worker only after its
    accept row and then its "dispatched" row are committed), the lookup of ids the supervisor no
    longer holds (JOURNAL-LOOKUP), and the write-failure state (JOURNAL-UNAVAILABLE:
    ``daemon.unavailable``)."""
    loop_box: list[asyncio.AbstractEventLoop] = []
    # The daemon's own context, so that callbacks handed over from the journal's thread run as
    # the loop's own code does (anyio knows its event loop there; a thread's context does not).
    context_box: list[contextvars.Context] = []

    # JOURNAL-CALLBACKS: the journal's thread hands its callbacks over in bursts (a commit of a thousand rows
    # resolves a thousand acks): they queue here and one wake-up of the loop runs them all, in
    # order, instead of a ``call_soon_threadsafe`` (a write to the loop's self-pipe) per row.
    handed: list[tuple[Any, tuple[Any, ...]]] = []
    handed_lock = threading.Lock()

    def run_handed() -> None:
        with handed_lock:
            calls = handed[:]
            handed.clear()
        for fn, args in calls:
            fn(*args)

    loop_thread: list[int] = []

    def on_loop(fn: Any, *args: Any) -> None:
        if loop_thread and threading.get_ident() == loop_thread[0] and not handed:
            fn(*args)  # JOURNAL-DIRECT: the loop read the commit's reply itself
            return
        with handed_lock:
            handed.append((fn, args))
            if len(handed) > 1:
                return  # a wake-up is already on its way and will run this one too
        # The loop is closed: the daemon is gone, nobody waits any more.
        with contextlib.suppress(RuntimeError):
            loop_box[0].call_soon_threadsafe(run_handed, context=context_box[0])

    def run_all(fns: list[Any]) -> None:
        sup = daemon.sup
        if sup is None:
            for fn in fns:
                fn()
            return
        sup.dispatch_once(fns)  # JOURNAL-DISPATCH-ONCE: one pump for the whole commit, not one per row

    journal.deliver = lambda fns: on_loop(run_all, fns)
    daemon.before_reply.append(journal.hand_over)

    def record(turn: TurnRecord, gate: Gate | None) -> None:
        # The row's callbacks are one object (JOURNAL-GATE-WAIT): ``committed`` runs on the loop
        # (JOURNAL-CALLBACKS, JOURNAL-DIRECT).
        sup = daemon.sup
        assert sup is not None
        row = _AcceptRow(sup, daemon.unrecorded, turn, gate, on_loop)
        journal.accepted(turn, row, row)
        sup.mark_written(turn)  # JOURNAL-GATE-SHARE: its "dispatched" row may now share this row's commit

    def accepted(turn: TurnRecord) -> Any:
        gate = Gate()
        daemon.unrecorded[turn.id] = gate  # until its row is committed or refused (``record``)
        record(turn, gate)
        return gate  # the submit is acknowledged once the row is committed

    def child_accepted(turn: TurnRecord) -> None:
        if turn.parent is not None:  # clients' turns are recorded (and gated) by ``accepted``
            record(turn, None)

    def started(turn: TurnRecord, pid: int) -> None:
        journal.started(turn.id, pid)

    def ended(turn: TurnRecord, result: TurnResult) -> None:
        journal.ended(result)

    def event(turn: TurnRecord, data: msgspec.Raw) -> None:
        journal.event(turn.id, turn.events_base + len(turn.events) - 1, bytes(data))

    def error_changed(error: str | None) -> None:
        daemon.unavailable = error
        if error is not None and journal.broken and daemon.exit_code == 0:
            # Deleted or replaced: it cannot come back. Stop (as SIGTERM does) and exit non-zero.
            log.error("journal %s is gone: stopping; nothing more can be made durable", journal.path)
            daemon.exit_code = EXIT_JOURNAL_LOST
            with contextlib.suppress(RuntimeError):
                daemon.stop()

    def gate(turns: list[TurnRecord]) -> None:
        sup = daemon.sup
        assert sup is not None
        # on the loop (JOURNAL-CALLBACKS)
        journal.dispatched([t.id for t in turns], lambda: sup.clear_for_dispatch(turns))

    def startup(sup: Supervisor) -> None:
        loop_box.append(asyncio.get_running_loop())
        loop_thread.append(threading.get_ident())
        context_box.append(contextvars.copy_context())
        journal.on_error_change = lambda error: on_loop(error_changed, error)
        if journal.error is not None:
            error_changed(journal.error)
        sup.set_dispatch_gate(gate)
        recover(sup, journal)
        # LOOP-STEP-DURABLE, LOOP-RESUME: records to the journal; resumed turns get theirs
        attach_steps(sup, journal)
        journal.attach()  # JOURNAL-DIRECT: from here the loop talks to the writer process itself
        sup.add_hooks(on_accept=child_accepted)

    daemon.startup_hooks.append(startup)
    daemon.accept_hooks.append(accepted)
    daemon.start_hooks.append(started)
    daemon.end_hooks.append(ended)
    daemon.lookup = journal.lookup
    # WORKER-FD-RETRY: counted in status and metrics
    daemon.fd_shortages["journal"] = lambda: journal.fd_shortage
    daemon.journal_path = str(journal.path)  # CLI-HISTORY
    if journal.journal_events:
        daemon.event_hooks.append(event)


class _AcceptRow:
    """The callbacks of one accept row (JOURNAL-GATE-WAIT), as one object — not three closures and their cells
    per submit (the garbage collector walked them all while thousands waited for a commit): called
    with no argument when the row is committed (``on_commit``), with ``(why, conflict)`` when its
    batch failed or the id was already there (``on_fail``)."""

    __slots__ = ("gate", "on_loop", "sup", "turn", "unrecorded")

    def __init__(
        self,
        sup: Supervisor,
        unrecorded: dict[str, Any],
        turn: TurnRecord,
        gate: Gate | None,
        on_loop: Any,
    ) -> None:
        self.sup, self.unrecorded, self.turn, self.gate, self.on_loop = sup, unrecorded, turn, gate, on_loop

    def __call__(self, why: str | None = None, conflict: bool = False) -> None:
        if why is not None:
            self.on_loop(self._refused, why, conflict)  # from the writer thread (or the loop, JOURNAL-DIRECT)
            return
        self.sup.mark_recorded(self.turn)
        gate = self.gate
        if gate is not None:
            self.unrecorded.pop(self.turn.id, None)
            gate.settle()

    def _refused(self, why: str, conflict: bool) -> None:
        self.sup.withdraw(self.turn, why)
        gate = self.gate
        if gate is not None:
            self.unrecorded.pop(self.turn.id, None)
            gate.settle(ValueError(why) if conflict else JournalUnavailable(why))


def _lost(turn: RecoveredTurn, outcome: str, cause: wire.Cause | None, error: TurnError | None) -> TurnResult:
    """The result of a turn the daemon lost. ``started`` is true for every turn that may have run
    (``dispatched`` or ``running``, JOURNAL-GATE): a turn's ``running`` row is committed after its worker
    started it, so a turn that ran just before a SIGKILL is often still ``dispatched``, and a
    result saying it never started would invite a resubmission that runs it twice."""
    now = time.time()
    return TurnResult(
        turn_id=turn.turn_id,
        outcome=outcome,  # type: ignore[arg-type]  # "crashed", "aborted" or "failed", from here
        cause=cause,
        error=error,
        started=turn.state in ("dispatched", "running"),
        session=turn.session,
        parent=turn.parent,
        agent=turn.agent,
        attempts=turn.attempts,
        ended_at=now,
    )


def recover(sup: Supervisor, journal: Journal) -> dict[str, int]:
    """Bring ``sup`` back to what the journal says; returns counts of what was done."""
    counts = {"results": 0, "requeued": 0, "retried": 0, "crashed": 0, "orphaned": 0, "refused": 0}
    for result in journal.recent_results(sup.keep_results):
        sup.restore_result(result)
        counts["results"] += 1
    for turn in journal.recover():
        # JOURNAL-GATE: cleared to run, so maybe it did
        may_have_run = turn.state in ("dispatched", "running")
        if turn.parent is not None:
            if may_have_run:
                result = _lost(turn, "crashed", None, SUPERVISOR_LOST)
            else:
                result = _lost(turn, "aborted", wire.PARENT, None)
            journal.ended(result)
            sup.restore_result(result)
            counts["orphaned"] += 1
            continue
        if sup.allow_agents is not None and not sup.allow_agents.allows(turn.agent):
            # SEC-ALLOW: a daemon restarted with a narrower allowlist never imports what it refuses.
            why = f"agent {turn.agent!r} is no longer allowed by this daemon (--allow-agent)"
            result = _lost(turn, "failed", None, TurnError("AgentNotAllowed", why))
            journal.ended(result)
            sup.restore_result(result)
            counts["refused"] += 1
            continue
        attempts = turn.attempts
        if may_have_run:
            if not turn.retry:
                result = _lost(turn, "crashed", None, SUPERVISOR_LOST)
                journal.ended(result)
                sup.restore_result(result)
                counts["crashed"] += 1
                continue
            attempts += 1
            journal.requeued(turn.turn_id, attempts)
            counts["retried"] += 1
        else:
            counts["requeued"] += 1
        # Everything here was acknowledged once: readmitted whatever --max-queue says (JOURNAL-RECOVERY).
        sup.accept_encoded(
            turn.agent,
            msgspec.Raw(turn.input),
            session=turn.session,
            timeout=turn.timeout,
            grace=turn.grace,
            kill_after=turn.kill_after,
            turn_id=turn.turn_id,
            retry=turn.retry,
            attempts=attempts,
            readmit=True,
        )
    journal.flush()
    if any(counts[k] for k in ("requeued", "retried", "crashed", "orphaned", "refused")):
        log.warning("journal %s: recovered after a restart: %s", journal.path, counts)
    return counts
