"""Child turns: what a running turn's ``turn.spawn(...)`` asks of the supervisor.

A child is accepted only while its parent runs and is not cancelled; the parent then waits on it
and lends its worker slot (``TurnBook.lent``), so a pool of parents waiting on children can
never deadlock, and turns handed ahead to the parent's worker are revoked (they would wait behind
it). A cancelled parent's children are cancelled with cause ``parent`` (TURN-PARENT, ``escalation.py``);
a child's result is sent back to the parent when it is delivered (``ending.py``).

Its collaborators: the ``TurnBook`` (table, lent slots), the send callback, ``Admission`` (a child
comes in as every turn does), the ``Escalation`` (a child given up is cancelled) and the
``Dispatcher`` (pool size, pump).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wire import PARENT, TurnError, worker_link

from .._errors import QueueFull, SupervisorClosed

if TYPE_CHECKING:
    from .admission import Admission
    from .book import TurnBook
    from .dispatch import Dispatcher
    from .escalation import Escalation
    from .pool import WorkerSlot

Send = Callable[["WorkerSlot", Any], None]


class ChildTurns:
    """Accepts and cancels the child turns running turns spawn; see the module docstring."""

    def __init__(
        self,
        book: TurnBook,
        send: Send,
        admission: Admission,
        escalation: Escalation,
        dispatcher: Dispatcher,
    ) -> None:
        self.book = book
        self.send = send
        self.admission = admission
        self.escalation = escalation
        self.dispatcher = dispatcher

    def cancel(self, slot: WorkerSlot, msg: worker_link.SpawnCancel) -> None:
        """The parent gave up waiting on a child (its ``spawn`` call was cancelled): cancel the child."""
        child_id = slot.spawns.get(msg.req)
        child = self.book.table.records.get(child_id) if child_id else None
        if child is not None:
            self.escalation.cancel(child, PARENT)

    def spawn(self, slot: WorkerSlot, msg: worker_link.Spawn) -> None:
        """A running turn asks for a child turn: accept it (or answer why not) and lend the slot."""
        send = self.send
        parent = slot.turn
        if parent is None or parent.id != msg.parent or parent.state != "running":
            send(
                slot,
                worker_link.SpawnReply(
                    msg.req, error=TurnError("SpawnError", "the parent turn is not running")
                ),
            )
            return
        if parent.cause is not None:
            send(
                slot,
                worker_link.SpawnReply(
                    msg.req, error=TurnError("SpawnError", "the parent turn was cancelled")
                ),
            )
            return
        try:
            child = self.admission.accept(
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
            send(slot, worker_link.SpawnReply(msg.req, error=TurnError(type(exc).__name__, str(exc))))
            return
        parent.add_child(child.id)
        child.spawn_origin = (slot, msg.req)
        slot.spawns[msg.req] = child.id
        # The parent waits on its child: it lends its slot, so the pool can never deadlock.
        # TURN-LEND: a waiting parent lends its slot.
        self.book.lent += 1
        for handed in slot.ahead:  # they would wait behind the parent: give them back
            self.dispatcher.revoke(slot, handed)
        self.dispatcher.refill()
        self.dispatcher.pump()
