"""Ending a turn: its one ``TurnResult``, built once and delivered once, after quiescence.

``Finisher.finish`` builds the result (disposal wins, TURN-DISPOSAL: an interrupted turn reports cause
``disposed`` during shutdown) and stops the turn's timers; a turn with live children holds its
result until they end (TURN-PARENT: a child never outlives its parent). ``deliver`` publishes it: the
record's result, its waiters and followers, the result hooks (the journal's end row), the session's
next turn, the reply to a parent that spawned it, and the idle waiters once nothing is active.
Callers have already made sure the turn is quiescent (LADDER-STEPS).

Its collaborators: the ``TurnBook`` (table, queue, counters), the hooks, the send callback to the
workers and the timers (their clock); once wired (``connect``), the ``Escalation`` that cancels a
parent's live children and the ``Dispatcher`` that hands the freed capacity on.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

import wire
from wire import DISPOSED, PARENT, TurnError, TurnResult, worker_link

from .states import move
from .turns import seal_input, set_done, wait_done

if TYPE_CHECKING:
    from .book import TurnBook
    from .dispatch import Dispatcher
    from .escalation import Escalation
    from .hooks import Hooks
    from .pool import WorkerSlot
    from .timers import Timers
    from .turns import TurnRecord

Send = Callable[["WorkerSlot", Any], None]


class Finisher:
    """Ends turns and counts their outcomes; see the module docstring."""

    def __init__(self, book: TurnBook, hooks: Hooks, send: Send, timers: Timers) -> None:
        self.book = book
        self.hooks = hooks
        self.send = send
        self.timers = timers
        self.escalation: Escalation | None = None  # set by ``connect``
        self.dispatcher: Dispatcher | None = None
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.causes: collections.Counter[str] = collections.Counter()
        self.idle_waiters: list[anyio.Event] = []

    def connect(self, *, escalation: Escalation, dispatcher: Dispatcher) -> None:
        """The parts that end needs and that need it (built after it): wired once."""
        self.escalation = escalation
        self.dispatcher = dispatcher

    # TURN-QUIESCENCE: idle means every turn ended, each after its worker's tree was reaped.
    async def wait_idle(self) -> None:
        """Return once no turn is active (accepted and not ended)."""
        while self.book.active:
            ev = anyio.Event()
            self.idle_waiters.append(ev)
            await ev.wait()

    def wake_if_idle(self) -> None:
        """Release ``wait_idle`` callers once no turn is active."""
        if self.book.active == 0 and self.idle_waiters:
            waiters, self.idle_waiters = self.idle_waiters, []
            for ev in waiters:
                ev.set()

    async def wait_quiescent(self, turn: TurnRecord) -> None:
        """API-RUN-OWNS: wait until ``turn`` has its result (it is quiescent), shielded from every
        cancellation — anyio's, and a native ``Task.cancel()`` (``asyncio.wait_for``), which is
        re-raised once the wait is over."""
        interrupted: BaseException | None = None
        with anyio.CancelScope(shield=True):
            # (DAEMON-KEEP-QUEUED: set aside, never ends here)
            while turn.result is None and turn.state != "kept":
                try:
                    await wait_done(turn)
                except asyncio.CancelledError as exc:
                    interrupted = exc
        if interrupted is not None:
            raise interrupted

    def finish(
        self,
        turn: TurnRecord,
        outcome: str,
        output: Any = None,
        error: TurnError | None = None,
        exit_code: int | None = None,
        worker_pid: int | None = None,
    ) -> None:
        book = self.book
        now = self.timers.clock()
        offset = book.wall_offset
        cause = turn.cause
        # TURN-DISPOSAL: disposal wins.
        if book.disposing and outcome in ("aborted", "killed"):
            cause = DISPOSED  # disposal wins over an earlier user or parent cause
        started_at = turn.started_at
        result = TurnResult(
            turn_id=turn.id,
            outcome=outcome,  # type: ignore[arg-type]  # one of wire's outcomes, checked by callers
            output=output,
            error=error,
            cause=cause,
            # LOOP-RESUME: a turn queued again after an attempt ran (or may have) says so, even if it
            # ends before its next attempt starts.
            started=turn.started or turn.attempts > 1,
            worker_pid=worker_pid,
            exit_code=exit_code,
            queued_s=(started_at if started_at is not None else now) - turn.submitted_at,
            run_s=(now - started_at) if started_at is not None else 0.0,
            session=turn.session,
            parent=turn.parent,
            agent=turn.agent,
            attempts=turn.attempts,
            submitted_at=turn.submitted_at + offset,
            started_at=started_at + offset if started_at is not None else None,
            ended_at=now + offset,
        )
        if turn.timer is not None:
            turn.timer.cancel()
        if turn.esc_timer is not None:
            turn.esc_timer.cancel()
        if turn.state == "running":
            book.running -= 1
        records = book.table.records
        live_children = [c for c in turn.children if c in records and records[c].state != "ended"]
        # TURN-PARENT: a child never outlives its parent: the parent's result waits for them.
        if live_children:
            # A child never outlives its parent: hold the parent's result until they end.
            move(turn, "ending")
            turn.pending_result = result
            turn.wake_followers()
            assert self.escalation is not None
            for child_id in live_children:
                self.escalation.cancel(records[child_id], PARENT)
            return
        self.deliver(turn, result)

    def deliver(self, turn: TurnRecord, result: TurnResult) -> None:
        book = self.book
        turn.result = result
        turn.pending_result = None
        move(turn, "ended")
        turn.ended_at = self.timers.clock()
        seal_input(turn)  # API-TURN-ID: a digest stays, so a later submit under this id is still told apart
        book.input_bytes -= len(turn.input)  # MEM-INPUTS
        turn.input = None  # type: ignore[assignment]  # no longer needed: free it
        self.outcomes[result.outcome] += 1
        if result.cause is not None:
            self.causes[result.cause.kind] += 1
        book.active -= 1
        set_done(turn)  # API-BARE-FUTURE, MEM-LEAN: the waiters' list goes with it
        turn.wake_followers()
        for hook in self.hooks.result:
            hook(turn, result)
        if turn.session is not None:
            book.queue.session_quiescent(turn)
        lent_changed = turn.spawn_origin is not None
        if lent_changed:
            slot, req = turn.spawn_origin  # type: ignore[misc]
            turn.spawn_origin = None
            book.lent -= 1
            slot.spawns.pop(req, None)
            if slot.state == "busy" and slot.turn is not None and slot.turn.id == turn.parent:
                self.send(slot, worker_link.SpawnReply(req, result=result))
        records = book.table.records
        if turn.parent is not None:
            parent = records.get(turn.parent)
            if parent is not None:
                if turn.id in parent.children:  # (a parent with no child holds the shared empty set)
                    parent.children.discard(turn.id)
                if parent.pending_result is not None and not any(
                    records.get(c) is not None and records[c].state != "ended" for c in parent.children
                ):
                    # Delivered now, after its last child: that is when it became quiescent.
                    held = msgspec.structs.replace(
                        parent.pending_result, ended_at=self.timers.clock() + book.wall_offset
                    )
                    self.deliver(parent, held)
        book.table.note_ended(turn.id)
        self.wake_if_idle()
        dispatcher = self.dispatcher
        assert dispatcher is not None
        dispatcher.pump()
        if lent_changed:
            dispatcher.refill()


def output_of(msg: worker_link.End, turn: TurnRecord) -> Any:
    """An End's output, decoded; ``None`` if it cannot be (the turn's outcome still stands). Notes
    its encoded size on ``turn`` (MEM-OUTPUTS), which the frame gives for free."""
    turn.output_bytes = len(msg.output)
    try:
        return wire.decode_payload(msg.output)
    except msgspec.DecodeError:
        return None
