"""Exit handling: what a worker's death means for the turns it held.

``ExitHandler.on_exit`` runs when the pool sees a worker's pid exit (a pidfd event). It first reads
what the worker sent before it died (its frames still in the socket), reaps the worker with every
descendant (LADDER-STEPS: quiescence before any result), then settles each turn the worker held: the ends
it logged whose frames died with it (WORKER-END-LOG), the turn its start marker says it started
(LADDER-EARLY), turns handed ahead and never started (back to the front of the queue, unharmed, at most
``MAX_HANDOVERS`` times), and the running turn (``killed`` if its escalation began, else ``crashed``). It
counts the workers replaced (``restarts``).

Its collaborators: the ``TurnBook`` (queue, counters), the pool (reaping, the worker's files), the
link's ``drain`` (the frames a dead worker left in the socket), the ``Dispatcher`` (its slots, the
handed turns), the ``Finisher``, the timers (their clock) and ``changed`` (a slot left the pool).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .ending import output_of
from .states import mark_started, move

if TYPE_CHECKING:
    from .book import TurnBook
    from .dispatch import Dispatcher
    from .ending import Finisher
    from .pool import WorkerPool, WorkerSlot
    from .steps import StepRecords
    from .timers import Timers
    from .turns import TurnRecord

log = logging.getLogger("turnpool.supervisor")

# A turn handed to workers that all died before reporting it started is re-queued at most this
# many times in all, then ends ``crashed`` (no poison turn loops through the pool forever).
MAX_HANDOVERS = 3


class ExitHandler:
    """Settles the turns of a worker that exited; see the module docstring."""

    def __init__(
        self,
        book: TurnBook,
        pool: WorkerPool,
        drain: Callable[[], None],
        dispatcher: Dispatcher,
        finisher: Finisher,
        timers: Timers,
        changed: Callable[[], None],
        steps: StepRecords | None = None,
    ) -> None:
        self.book = book
        self.steps = steps  # LOOP-RESUME: requeues a retry=True turn whose worker died
        self.pool = pool
        self.drain = drain
        self.dispatcher = dispatcher
        self.finisher = finisher
        self.timers = timers
        self.changed = changed
        self.restarts = 0  # workers that exited or were lost while they held or could take turns

    async def on_exit(self, slot: WorkerSlot) -> None:
        """A worker's pid exited (called by the pool): settle its turns."""
        book = self.book
        pool = self.pool
        dispatcher = self.dispatcher
        finish = self.finisher.finish
        # Frames the worker sent before it died (its Started, its End) may still sit in the
        # socket: handle them first, so a turn that started is not mistaken for one that did not.
        was = slot.state
        slot.state = "dead"  # first: an End drained here must not hand the slot a new turn
        self.drain()
        # LADDER-HANDOVER: a killed worker whose handed turns already came back gives up its slot now,
        # before its tree is reaped: a warm spare starts the next queued turn meanwhile.
        doomed = slot.turn
        if doomed is not None and doomed.escalation > 0:
            doomed.exited_at = self.timers.clock()
            if not slot.ahead:
                dispatcher.release_exited(slot)
        # TURN-QUIESCENCE, LADDER-STEPS: quiescence: every descendant is killed and reaped before the turn's
        # result is out.
        code = await pool.reap_exit(slot)
        dispatcher.exited(slot)
        # Turns handed ahead never started: back to the front of the queue, unharmed, in order
        # (or aborted, never started, if they were cancelled meanwhile).
        turn = slot.turn
        slot.turn = None
        # LADDER-SETTLE: a killed worker holding nothing but its escalated turn (its handed turns came
        # back at the kill decision: LADDER-HANDOVER) has nothing its marker or End log could change:
        # that turn is ``killed`` whatever it logged (TURN-ONE-OUTCOME), and no handed turn is left to place.
        # Their files are removed unread, after the result is out (``drop_files_later``).
        moot = turn is not None and turn.escalation > 0 and not slot.ahead
        noted = None if moot else pool.take_noted(slot)
        # WORKER-END-LOG: first the ends the worker logged but whose frames died with it: those turns ran,
        # and end with their own outcome.
        if not moot:
            turn = self.apply_end_log(slot, turn, noted)
        handed_turns = list(slot.ahead)
        if noted is not None:
            started_id = noted[0]
            index = next((i for i, t in enumerate(handed_turns) if t.id == started_id), -1)
            if turn is None and index >= 0:
                # LADDER-EARLY: the worker noted it started this turn, but its Started died with it: the turn
                # ran (and crashed), it must not be handed to another worker. (Turns before it
                # that ran in the same unreported burst ended per the End log, above; one still
                # here was revoked or dropped unstarted.)
                first = handed_turns.pop(index)
                slot.ahead.remove(first)
                book.handed -= 1
                first.revoking = False
                move(first, "running")
                mark_started(first, self.timers.clock())
                book.running += 1
                turn = first
        for index in reversed(range(len(handed_turns))):
            handed = handed_turns[index]
            dispatcher.unhand(slot, handed)
            if handed.started:
                # A turn the worker went past (LADDER-EARLY) whose Started came but whose End died with it.
                finish(handed, "crashed", exit_code=code, worker_pid=slot.pid)
            elif handed.cause is not None:
                finish(handed, "aborted")
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
                    finish(handed, "crashed", exit_code=code, worker_pid=slot.pid)
                else:
                    handed.attempts += 1
                    book.queue.push(handed, front=True)
            else:
                book.queue.push(handed, front=True)
        if was == "starting":
            # Keep the specific reason (no Ready in time, wrong protocol) over the bare exit code.
            pool.start_failed(
                slot.failure or f"worker {slot.id} (pid {slot.pid}) exited with {code} before it was ready"
            )
        elif was != "stopping" or turn is not None:
            self.restarts += 1
        if turn is not None and turn.state == "running":
            if turn.escalation:
                finish(turn, "killed", exit_code=code, worker_pid=slot.pid)
            else:
                log.warning(
                    "worker %s (pid %s) died running turn %s: exit %s", slot.id, slot.pid, turn.id, code
                )
                # WORKER-CRASH: a crash costs one turn and one worker (refilled below); LOOP-RESUME: a
                # retry=True turn runs again from its last recorded step instead.
                if self.steps is None or not self.steps.requeue(turn):
                    finish(turn, "crashed", exit_code=code, worker_pid=slot.pid)
        if moot:
            pool.drop_files_later(slot)
        self.changed()
        dispatcher.refill()
        dispatcher.pump()

    def apply_end_log(
        self, slot: WorkerSlot, turn: TurnRecord | None, noted: tuple[str, float] | None
    ) -> TurnRecord | None:
        """WORKER-END-LOG: apply the ends a dead worker logged (``worker/_endlog.py``) whose frames never
        came.

        Only turns the worker provably reached are considered: the turn it reported running, the
        handed turns up to the one its start marker names (it runs them in the order handed), and
        the turns it went past before a marked turn that an earlier read made the running one,
        so a record naming a turn handed behind that - which the worker never started - changes
        nothing (SEC-FORGE). A turn already ended is not there to match (the log keeps stale records). A
        record for the marked turn counts only if it carries the marker's start time (a record
        left by an earlier turn under the same id does not). A turn whose escalation began ends
        ``killed`` whatever the worker logged (TURN-ONE-OUTCOME). Returns the running turn, or None if it
        ended."""
        records = self.pool.take_end_log(slot)
        if not records:
            return turn
        ends = {end.turn_id: (at, end) for at, end in records}  # a turn's last record is its latest
        marked_id, marked_at = noted if noted is not None else (None, None)
        reached: list[TurnRecord] = [turn] if turn is not None else []
        ahead = list(slot.ahead)
        index = next((i for i, t in enumerate(ahead) if t.id == marked_id), -1)
        # The handed turns up to the marked one, and those the worker went past (LADDER-EARLY) before a
        # marked turn that already runs here: a read of the marker made it ``turn``, so it is no
        # longer in ``ahead``, but the quick turns before it ran and their ends are in the log.
        reached += [t for i, t in enumerate(ahead) if i <= index or t.id in slot.passed]
        now = self.timers.clock()
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
                self.dispatcher.start_turn(slot, t, min(max(at, t.submitted_at), now))
                slot.turn = None
            output = output_of(end, t)
            log.info(
                "turn %s: ended %s per worker %s's End log (its frame died with the worker)",
                t.id,
                end.outcome,
                slot.id,
            )
            self.finisher.finish(t, end.outcome, output=output, error=end.error, worker_pid=slot.pid)
            slot.turns_run += 1
        return turn
