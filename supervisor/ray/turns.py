"""The router's turn table: each turn it sent, until retention forgets it, and the sessions
pinned to nodes while they have turns in flight.

It knows nothing of Ray: a turn's node is whatever ``NodeLink`` holds it, and the table only
records which one. ``Changes`` is the router's one "something moved" signal (a turn ended or
moved, a node came or went), shared by the table, the membership and the router.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from wire import TurnError, TurnResult

if TYPE_CHECKING:
    from .link import NodeLink

NODE_LOST = "NodeLost"  # the error type of a turn whose node was lost (outcome ``crashed``)


class Flag:
    """A one-shot "it happened" for asyncio, cheaper than ``asyncio.Event`` where most are set
    before anyone waits: nothing but two slots until someone waits. The router makes two per
    turn (acknowledged, ended), tens of thousands a second."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, None
        for fut in waiters or ():
            if not fut.done():  # a waiter cancelled meanwhile
                fut.set_result(None)

    async def wait(self) -> None:
        if self._set:
            return
        fut = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = [fut]
        else:
            self._waiters.append(fut)
        await fut


@dataclass(eq=False, slots=True)
class RoutedTurn:
    """A turn as the router knows it: the request it sent, where it is held, how it ended."""

    turn_id: str
    request: dict[str, Any]
    seq: int
    session: str | None
    retry: bool
    node: NodeLink | None = None
    attempts: int = 1
    # On asyncio (Ray's refs are awaited on asyncio anyway): two per turn, made cheaply.
    acked: Flag = field(default_factory=Flag)
    ack_error: BaseException | None = None
    done: Flag = field(default_factory=Flag)
    result: TurnResult | None = None
    submitted_at: float = field(default_factory=time.time)
    resent: bool = False  # placed again after its node was lost


def lost_result(turn: RoutedTurn, message: str) -> TurnResult:
    """The one outcome of a turn whose node was lost: ``crashed`` with a ``NodeLost`` error."""
    return TurnResult(
        turn_id=turn.turn_id,
        outcome="crashed",
        error=TurnError(NODE_LOST, message),
        session=turn.session,
        agent=turn.request["agent"],
        attempts=turn.attempts,
        submitted_at=turn.submitted_at,
        ended_at=time.time(),
    )


class Changes:
    """Wakes whoever waits for the router's state to move; an event is made only while someone
    waits, so a turn's end costs nothing when nobody does."""

    def __init__(self) -> None:
        self._changed: asyncio.Event | None = None

    def notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()


class TurnTable:
    """The turns this router sent (by id), the last ``keep_results`` ended ones, the count of
    turns not ended, and the session pins (session → node and its turns in flight)."""

    def __init__(self, keep_results: int, changes: Changes) -> None:
        self.keep_results = keep_results
        self.changes = changes
        self.turns: dict[str, RoutedTurn] = {}
        self._finished: collections.OrderedDict[str, RoutedTurn] = collections.OrderedDict()
        self.pins: dict[str, tuple[NodeLink, int]] = {}  # session -> (node, turns in flight)
        self.open = 0  # turns accepted by this router and not ended

    def get(self, turn_id: str) -> RoutedTurn | None:
        return self.turns.get(turn_id)

    def __contains__(self, turn_id: str) -> bool:
        return turn_id in self.turns

    def add(self, turn: RoutedTurn) -> None:
        self.turns[turn.turn_id] = turn
        self.open += 1

    def pin(self, turn: RoutedTurn, node: NodeLink) -> None:
        """R-ray-sessions: the session stays on ``node`` while any of its turns is in flight."""
        if turn.session is not None:
            _, count = self.pins.get(turn.session, (node, 0))
            self.pins[turn.session] = (node, count + 1)

    def pinned(self, session: str) -> NodeLink | None:
        """The node ``session`` is pinned to, if that node is live."""
        pin = self.pins.get(session)
        return pin[0] if pin is not None and pin[0].state == "live" else None

    def unpin(self, turn: RoutedTurn) -> None:
        if turn.session is None:
            return
        pin = self.pins.get(turn.session)
        if pin is not None and pin[0] is turn.node:
            if pin[1] <= 1:
                del self.pins[turn.session]
            else:
                self.pins[turn.session] = (pin[0], pin[1] - 1)

    def unpin_node(self, node: NodeLink) -> None:
        """A lost node's sessions go to their next rendezvous winner."""
        for session, (pinned, _) in list(self.pins.items()):
            if pinned is node:
                del self.pins[session]

    def drop(self, turn: RoutedTurn) -> None:
        """A submit the node refused: forget it (the caller gets the error)."""
        if turn.node is not None:
            turn.node.held.pop(turn.turn_id, None)
        if self.turns.get(turn.turn_id) is turn:
            del self.turns[turn.turn_id]
            self.open -= 1
        turn.done.set()  # never ran; its submit raised
        self.unpin(turn)

    def finish(self, turn: RoutedTurn, result: TurnResult) -> None:
        """The turn's one outcome: recorded once, kept for ``keep_results`` ended turns."""
        if turn.done.is_set():
            return
        turn.result = result
        self.open -= 1
        if turn.node is not None:
            turn.node.held.pop(turn.turn_id, None)
        self.unpin(turn)
        turn.done.set()
        self._finished[turn.turn_id] = turn
        while len(self._finished) > self.keep_results:
            old_id, old = self._finished.popitem(last=False)
            if self.turns.get(old_id) is old:
                del self.turns[old_id]
        self.changes.notify()
