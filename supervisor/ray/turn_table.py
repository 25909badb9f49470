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
from typing import TYPE_CHECKING

import msgspec

from wire import TurnError, TurnResult

from .batches import Request

if TYPE_CHECKING:
    from .node_link import NodeLink

NODE_LOST = "NodeLost"  # the error type of a turn whose node was lost (outcome ``crashed``)


@dataclass(eq=False, slots=True)
class RoutedTurn:
    """A turn as the router knows it: the request it sent, where it is held, how it ended.

    The request is kept in fields of its own, not in a dict: one object per turn fewer for the
    garbage collector (see ``acked``)."""

    turn_id: str
    agent: str
    raw: msgspec.Raw | None  # the encoded input (None: a Ray-native run, placed, never sent)
    seq: int
    session: str | None
    retry: bool
    timeout: float | None = None
    grace: float | None = None
    kill_after: float | None = None
    id_given: bool = False  # the caller chose the id: placed by its hash, not by load
    node: NodeLink | None = None
    attempts: int = 1
    # Two one-shot flags, kept in the turn itself, not as two asyncio.Events: the router holds
    # up to ``keep_results`` ended turns, and every object it keeps per turn is one more for the
    # garbage collector's full passes to walk (they were a third of a no-op batch's time).
    acked: bool = False  # the node acknowledged it (or it ended, or its node was lost)
    ack_error: BaseException | None = None
    done: bool = False  # it has its one result (or its submit was refused)
    # Who waits for each: one future, or a list of them (a second waiter is rare).
    _ack_waiters: asyncio.Future[None] | list[asyncio.Future[None]] | None = None
    _done_waiters: asyncio.Future[None] | list[asyncio.Future[None]] | None = None
    result: TurnResult | None = None
    submitted_at: float = field(default_factory=time.time)
    resent: bool = False  # placed again after its node was lost
    # RAY-STEP-RECORDS: its step records, (kind, record) in seq order
    steps: list[tuple[str, bytes]] | None = None

    def row(self) -> Request:
        """The request as it travels to the node (``batches.encode_requests``)."""
        assert self.raw is not None
        return (
            self.agent,
            self.raw,
            self.session,
            self.timeout,
            self.grace,
            self.kill_after,
            self.turn_id,
            self.retry,
            self.attempts,
            self.steps or [],
        )

    def set_acked(self) -> None:
        if not self.acked:
            self.acked = True
            waiters, self._ack_waiters = self._ack_waiters, None
            _wake(waiters)

    def set_done(self) -> None:
        if not self.done:
            self.done = True
            waiters, self._done_waiters = self._done_waiters, None
            _wake(waiters)

    async def wait_acked(self) -> None:
        if not self.acked:
            fut = asyncio.get_running_loop().create_future()
            self._ack_waiters = _add(self._ack_waiters, fut)
            await fut

    async def wait_done(self) -> None:
        if not self.done:
            fut = asyncio.get_running_loop().create_future()
            self._done_waiters = _add(self._done_waiters, fut)
            await fut


def _add(
    waiters: asyncio.Future[None] | list[asyncio.Future[None]] | None, fut: asyncio.Future[None]
) -> asyncio.Future[None] | list[asyncio.Future[None]]:
    if waiters is None:
        return fut
    if isinstance(waiters, list):
        waiters.append(fut)
        return waiters
    return [waiters, fut]


def _wake(waiters: asyncio.Future[None] | list[asyncio.Future[None]] | None) -> None:
    for fut in waiters if isinstance(waiters, list) else (waiters,) if waiters is not None else ():
        if not fut.done():  # a waiter cancelled meanwhile
            fut.set_result(None)


def lost_result(turn: RoutedTurn, message: str) -> TurnResult:
    """The one outcome of a turn whose node was lost: ``crashed`` with a ``NodeLost`` error."""
    return TurnResult(
        turn_id=turn.turn_id,
        outcome="crashed",
        error=TurnError(NODE_LOST, message),
        session=turn.session,
        agent=turn.agent,
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
        """RAY-SESSIONS: the session stays on ``node`` while any of its turns is in flight."""
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
        turn.set_done()  # never ran; its submit raised
        self.unpin(turn)

    def finish(self, turn: RoutedTurn, result: TurnResult) -> None:
        """The turn's one outcome: recorded once, kept for ``keep_results`` ended turns."""
        if turn.done:
            return
        turn.result = result
        turn.steps = None  # RAY-STEP-RECORDS: resumed no more
        self.open -= 1
        if turn.node is not None:
            turn.node.held.pop(turn.turn_id, None)
        self.unpin(turn)
        turn.set_done()
        self._finished[turn.turn_id] = turn
        while len(self._finished) > self.keep_results:
            old_id, old = self._finished.popitem(last=False)
            if self.turns.get(old_id) is old:
                del self.turns[old_id]
        self.changes.notify()
