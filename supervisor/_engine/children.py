"""Child turns: what a running turn's ``turn.spawn(...)`` asks of the supervisor.

A child is accepted only while its parent runs and is not cancelled; the parent then waits on it
and lends its worker slot (``Supervisor._lent``), so a pool of parents waiting on children can
never deadlock, and turns handed ahead to the parent's worker are revoked (they would wait behind
it). A cancelled parent's children are cancelled with cause ``parent`` (TURN-PARENT, ``escalation.py``);
a child's result is sent back to the parent when it is delivered (``ending.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import wire
from wire import PARENT, TurnError

from .._errors import QueueFull, SupervisorClosed

if TYPE_CHECKING:
    from .pool import WorkerSlot
    from .supervisor import Supervisor


class ChildTurns:
    """Accepts and cancels the child turns running turns spawn; see the module docstring."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def cancel(self, slot: WorkerSlot, msg: wire.SpawnCancel) -> None:
        """The parent gave up waiting on a child (its ``spawn`` call was cancelled): cancel the child."""
        sup = self.sup
        child_id = slot.spawns.get(msg.req)
        child = sup._turns.get(child_id) if child_id else None
        if child is not None:
            sup._cancel(child, PARENT)

    def spawn(self, slot: WorkerSlot, msg: wire.Spawn) -> None:
        """A running turn asks for a child turn: accept it (or answer why not) and lend the slot."""
        sup = self.sup
        parent = slot.turn
        if parent is None or parent.id != msg.parent or parent.state != "running":
            sup._send(
                slot,
                wire.SpawnReply(msg.req, error=TurnError("SpawnError", "the parent turn is not running")),
            )
            return
        if parent.cause is not None:
            sup._send(
                slot, wire.SpawnReply(msg.req, error=TurnError("SpawnError", "the parent turn was cancelled"))
            )
            return
        try:
            child = sup._accept(
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
            sup._send(slot, wire.SpawnReply(msg.req, error=TurnError(type(exc).__name__, str(exc))))
            return
        parent.add_child(child.id)
        child.spawn_origin = (slot, msg.req)
        slot.spawns[msg.req] = child.id
        # The parent waits on its child: it lends its slot, so the pool can never deadlock.
        # TURN-LEND: a waiting parent lends its slot.
        sup._lent += 1
        for handed in slot.ahead:  # they would wait behind the parent: give them back
            if not handed.revoking and handed.cause is None:
                handed.revoking = True
                sup._send(slot, wire.Revoke(handed.id))
        sup._fill_pool()
        sup._pump()
