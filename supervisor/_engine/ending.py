"""Ending a turn: its one ``TurnResult``, built once and delivered once, after quiescence.

``Finisher.finish`` builds the result (disposal wins, TURN-DISPOSAL: an interrupted turn reports cause
``disposed`` during shutdown) and stops the turn's timers; a turn with live children holds its
result until they end (TURN-PARENT: a child never outlives its parent). ``deliver`` publishes it: the
record's result, its waiters and followers, the result hooks (the journal's end row), the session's
next turn, the reply to a parent that spawned it, and the idle waiters once nothing is active. The
``Supervisor`` composes one; callers have already made sure the turn is quiescent (LADDER-STEPS).
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

import wire
from wire import DISPOSED, PARENT, TurnError, TurnResult

from .turns import seal_input, set_done, wait_done

if TYPE_CHECKING:
    from .supervisor import Supervisor
    from .turns import TurnRecord


class Finisher:
    """Ends turns and counts their outcomes; see the module docstring."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.causes: collections.Counter[str] = collections.Counter()
        self.idle_waiters: list[anyio.Event] = []

    # TURN-QUIESCENCE: idle means every turn ended, each after its worker's tree was reaped.
    async def wait_idle(self) -> None:
        """Return once no turn is active (accepted and not ended)."""
        while self.sup._active:
            ev = anyio.Event()
            self.idle_waiters.append(ev)
            await ev.wait()

    def wake_if_idle(self) -> None:
        """Release ``wait_idle`` callers once no turn is active."""
        if self.sup._active == 0 and self.idle_waiters:
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
        sup = self.sup
        now = sup._clock()
        cause = turn.cause
        # TURN-DISPOSAL: disposal wins.
        if sup._disposing and outcome in ("aborted", "killed"):
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
            submitted_at=turn.submitted_at + sup._wall_offset,
            started_at=started_at + sup._wall_offset if started_at is not None else None,
            ended_at=now + sup._wall_offset,
        )
        if turn.timer is not None:
            turn.timer.cancel()
        if turn.esc_timer is not None:
            turn.esc_timer.cancel()
        if turn.state == "running":
            sup._running -= 1
        live_children = [c for c in turn.children if c in sup._turns and sup._turns[c].state != "ended"]
        # TURN-PARENT: a child never outlives its parent: the parent's result waits for them.
        if live_children:
            # A child never outlives its parent: hold the parent's result until they end.
            turn.state = "ending"
            turn.pending_result = result
            turn.wake_followers()
            for child_id in live_children:
                sup._cancel(sup._turns[child_id], PARENT)
            return
        self.deliver(turn, result)

    def deliver(self, turn: TurnRecord, result: TurnResult) -> None:
        sup = self.sup
        turn.result = result
        turn.pending_result = None
        turn.state = "ended"
        turn.ended_at = sup._clock()
        seal_input(turn)  # API-TURN-ID: a digest stays, so a later submit under this id is still told apart
        sup.input_bytes -= len(turn.input)  # MEM-INPUTS
        turn.input = None  # type: ignore[assignment]  # no longer needed: free it
        self.outcomes[result.outcome] += 1
        if result.cause is not None:
            self.causes[result.cause.kind] += 1
        sup._active -= 1
        set_done(turn)  # API-BARE-FUTURE, MEM-LEAN: the waiters' list goes with it
        turn.wake_followers()
        for hook in sup._hooks.result:
            hook(turn, result)
        if turn.session is not None:
            sup._queue.session_quiescent(turn)
        lent_changed = turn.spawn_origin is not None
        if lent_changed:
            slot, req = turn.spawn_origin  # type: ignore[misc]
            turn.spawn_origin = None
            sup._lent -= 1
            slot.spawns.pop(req, None)
            if slot.state == "busy" and slot.turn is not None and slot.turn.id == turn.parent:
                sup._send(slot, wire.SpawnReply(req, result=result))
        if turn.parent is not None:
            parent = sup._turns.get(turn.parent)
            if parent is not None:
                if turn.id in parent.children:  # (a parent with no child holds the shared empty set)
                    parent.children.discard(turn.id)
                if parent.pending_result is not None and not any(
                    sup._turns.get(c) is not None and sup._turns[c].state != "ended" for c in parent.children
                ):
                    # Delivered now, after its last child: that is when it became quiescent.
                    held = msgspec.structs.replace(
                        parent.pending_result, ended_at=sup._clock() + sup._wall_offset
                    )
                    self.deliver(parent, held)
        sup.table.note_ended(turn.id)
        self.wake_if_idle()
        sup._pump()
        if lent_changed:
            sup._fill_pool()


def output_of(msg: wire.End, turn: TurnRecord) -> Any:
    """An End's output, decoded; ``None`` if it cannot be (the turn's outcome still stands). Notes
    its encoded size on ``turn`` (MEM-OUTPUTS), which the frame gives for free."""
    turn.output_bytes = len(msg.output)
    try:
        return wire.decode_payload(msg.output)
    except msgspec.DecodeError:
        return None
