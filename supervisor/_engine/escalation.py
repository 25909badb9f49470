"""The escalation ladder: how a turn is made to stop.

``cancel(cause)`` → ``Abort`` to the worker → ``grace`` → SIGTERM to the worker's whole tree →
``kill_after`` → SIGKILL to the tree → reaped → ``killed`` (SPEC, "Escalation ladder"). ``Escalation``
owns the ladder's state (the ``kill_now`` switch and the count of steps taken) and its rules: first
cause wins (TURN-FIRST-CAUSE), a queued turn is aborted unstarted (TURN-PRERUN), a cancel reaches the children
of a turn (TURN-PARENT), a turn handed ahead is escalatable from the handoff (LADDER-EARLY: its start marker
says whether it runs), and every step is keyed by turn, so a signal never reaches a worker that moved on.

Its collaborators: the ``TurnBook`` (table, queue), the pool's slots, the send callback, the timers,
the hooks (``abort``, ``sigterm``, ``sigkill`` steps), the ``Dispatcher`` (start notes, the handover
at the kill decision), the ``Finisher`` (a queued turn ends ``aborted``) and ``signal_tree``, the one
call that signals a worker's tree (``procs.signal_tree``; a unit test passes a recorder).
"""

from __future__ import annotations

import collections
import logging
import signal
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import wire
from wire import PARENT, Cause, worker_link

from .states import escalated, first_cause

if TYPE_CHECKING:
    from .book import TurnBook
    from .dispatch import Dispatcher
    from .ending import Finisher
    from .hooks import Hooks
    from .pool import WorkerSlot
    from .timers import Timers
    from .turns import TurnRecord

Send = Callable[["WorkerSlot", Any], None]
SignalTree = Callable[..., Any]  # ``procs.signal_tree(pid, signal, known=...)``

log = logging.getLogger("turnpool.supervisor")


class Escalation:
    """Cancels turns and drives each cancelled turn's ladder; see the module docstring."""

    def __init__(
        self,
        book: TurnBook,
        slots: dict[str, WorkerSlot],
        send: Send,
        timers: Timers,
        hooks: Hooks,
        dispatcher: Dispatcher,
        finisher: Finisher,
        signal_tree: SignalTree,
        boost: Callable[[WorkerSlot], None] = lambda slot: None,
        hurry: Callable[[WorkerSlot], object] = lambda slot: None,
    ) -> None:
        self.book = book
        self.slots = slots  # the pool's slots (the same dict)
        self.send = send
        self.timers = timers
        self.hooks = hooks
        self.dispatcher = dispatcher
        self.finisher = finisher
        self.signal_tree = signal_tree
        self.boost = boost  # WORKER-SHARE-AT-CANCEL: the cancelled turn's worker gets its weight back
        # WORKER-SUPERVISOR-WEIGHT: a worker being killed weighs what the supervisor weighs.
        self.hurry = hurry
        self.kill_at_once = False  # kill_now(): every cancel goes straight to SIGKILL
        self.counts: collections.Counter[str] = collections.Counter()  # steps taken: sigterm, sigkill

    def cancel(self, turn: TurnRecord, cause: Cause) -> Cause | None:
        state = turn.state
        if state == "ended" or state == "ending":
            return turn.cause
        # TURN-FIRST-CAUSE: first cause wins; an ended turn keeps its cause.
        first = first_cause(turn, cause)
        # TURN-PARENT: the children are cancelled first, with cause parent, recursively.
        records = self.book.table.records
        for child_id in list(turn.children):
            child = records.get(child_id)
            if child is not None:
                self.cancel(child, PARENT)
        # TURN-PRERUN: a queued turn is removed and ends aborted, never started.
        if state == "queued":
            self.book.queue.discard(turn)
            self.finisher.finish(turn, "aborted")
        elif state == "handed" and first:
            # Handed ahead: the worker drops it unstarted (End aborted, never Started), or, if it
            # started meanwhile, honours the Abort. Its start marker tells whether it started (LADDER-EARLY):
            # the ladder is armed now either way, and looks again if it had not.
            slot = turn.worker
            assert slot is not None
            self.send(slot, worker_link.Abort(turn.id, cause))  # (first: the cause it now holds)
            self.hooks.stepped(turn, "abort")
            self.dispatcher.note_marked_start(slot)
            if turn.esc_timer is None:  # (armed already if the marker showed it running)
                self.arm(turn, slot)
        elif state == "running" and first:
            slot = turn.worker
            assert slot is not None
            self.boost(slot)
            self.send(slot, worker_link.Abort(turn.id, cause))  # (first: the cause it now holds)
            self.hooks.stepped(turn, "abort")
            self.arm(turn, slot)
        return turn.cause

    def arm(self, turn: TurnRecord, slot: WorkerSlot) -> None:
        if self.kill_at_once:
            turn.esc_timer = self.timers.call_later(0, self.escalate, turn, slot, 2)
        else:
            turn.esc_timer = self.timers.call_later(turn.grace, self.escalate, turn, slot, 1)

    # TURN-SESSION-CANCEL: exactly the turns queued at the call, and the running one: never armed for the
    # future.
    def cancel_session(self, session: str, cause: Cause) -> list[str]:
        cancelled = []
        for turn in self.book.queue.queued_of_session(session):
            self.cancel(turn, cause)
            cancelled.append(turn.id)
        for slot in list(self.slots.values()):
            for turn in list(slot.ahead):
                if turn.session == session and turn.state == "handed":
                    self.cancel(turn, cause)
                    cancelled.append(turn.id)
            running = slot.turn
            if running is not None and running.session == session and running.state == "running":
                self.cancel(running, cause)
                cancelled.append(running.id)
        return cancelled

    def deadline(self, turn: TurnRecord) -> None:
        self.cancel(turn, wire.DEADLINE)

    # LADDER-STEPS: the ladder's steps, each keyed by the turn and logged with turn id, pid and step.
    def escalate(self, turn: TurnRecord, slot: WorkerSlot, step: int) -> None:
        if turn.state == "handed" and turn.worker is slot and slot.state != "dead":
            # Cancelled while handed ahead and no Started yet: the start marker may say it runs
            # (LADDER-EARLY).
            self.dispatcher.note_marked_start(slot)
            if turn.state == "handed":  # not reached yet: look again later (its Started re-arms too)
                again = max(turn.grace, 0.05)
                turn.esc_timer = self.timers.call_later(again, self.escalate, turn, slot, step)
                return
        # Keyed by turn: act only if this worker is still on this very turn.
        if slot.turn is not turn or slot.state == "dead":
            return
        slot.doomed = True
        # LADDER-HANDOVER: the first signal is the kill decision. The turn's outcome is ``killed`` from
        # here whatever its worker sends (TURN-ONE-OUTCOME): the turns handed ahead to its worker go back to
        # the queue now (another worker may take them); the slot itself is given up at the worker's exit.
        decided = escalated(turn, step, self.timers.clock())
        if decided:
            self.hurry(slot)  # before the signal: the handler and the exit run at that weight
            self.dispatcher.take_back_ahead(slot)
        if step == 1:
            self.counts["sigterm"] += 1
            self.signal_tree(slot.pid, signal.SIGTERM, known=slot.known)
            self.hooks.stepped(turn, "sigterm")
            turn.esc_timer = self.timers.call_later(turn.kill_after, self.escalate, turn, slot, 2)
            log.warning(
                "escalate turn=%s pid=%s step=SIGTERM after grace %.3gs", turn.id, slot.pid, turn.grace
            )
        else:
            self.counts["sigkill"] += 1
            self.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)
            self.hooks.stepped(turn, "sigkill")
            log.warning(
                "escalate turn=%s pid=%s step=SIGKILL after kill_after %.3gs",
                turn.id,
                slot.pid,
                turn.kill_after,
            )
        if decided:
            # LADDER-HEIR: the signal is out first (the kill is not delayed); a warm spare now gets the
            # next queued turn, held until this worker's process is gone.
            self.dispatcher.hand_to_heir(slot)

    def kill_now(self, turn_ids: Iterable[str] | None = None) -> None:
        """``Supervisor.kill_now``: SIGKILL now to the trees of the named turns, or of every turn
        being cancelled (and from then on every cancel goes straight to SIGKILL)."""
        records = self.book.table.records
        if turn_ids is None:
            self.kill_at_once = True
            targets = [t for t in records.values() if t.cause is not None]
        else:
            targets = [t for t in map(records.get, turn_ids) if t is not None]
        for turn in targets:
            if turn.state not in ("handed", "running") or turn.worker is None:
                continue
            slot = turn.worker
            if turn.state == "handed":
                self.dispatcher.note_marked_start(slot)
            if turn.state == "running" and slot.turn is turn and turn.escalation < 2:
                if turn.esc_timer is not None:
                    turn.esc_timer.cancel()
                self.escalate(turn, slot, 2)
