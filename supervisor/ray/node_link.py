"""One node's link: the router's handle on a node supervisor and the two streams it keeps with it.

``NodeLink`` holds what the router knows of one node (its actor, its workers, the turns it holds
and the ones waiting for the next batch, its last status) and runs the node's two streams
(RAY-BATCHES): the flusher, which sends submissions in batches, one batch in flight at a time,
and the results stream, which brings results back in batches and is also the router's liveness
channel: its failure is how the router learns the node is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import ray.exceptions

from wire import TurnResult

from .batches import decode_results, encode_requests
from .node import SUBMIT_BATCH
from .steps import keep
from .turn_table import lost_result

if TYPE_CHECKING:
    from .turn_table import RoutedTurn, TurnTable

log = logging.getLogger("turnpool.ray")


def kill_actor(actor: Any) -> None:
    """``ray.kill`` without a restart, quietly when the actor (or Ray) is already gone."""
    with contextlib.suppress(Exception):  # already dead, or Ray is gone: nothing of it to stop
        ray.kill(actor, no_restart=True)


_SENDS = itertools.count(1)


@dataclass(eq=False)
class NodeLink:
    """A node supervisor as the router sees it, and its submit and result streams.

    ``table`` is the router's turn table (results end turns there); ``lose`` declares this node
    lost (the membership's loss handling); ``running`` says whether the router still runs (a
    stream that ends while it closes is a close, not a loss)."""

    key: str
    node_id: str
    actor: Any
    workers: int
    table: TurnTable
    lose: Callable[[NodeLink, str], Awaitable[None]]
    running: Callable[[], bool]
    loss_timeout: float
    state: str = "live"  # live → lost | closed
    pid: int | None = None
    held: dict[str, RoutedTurn] = field(default_factory=dict)  # sent (or being sent), not ended
    pending: list[RoutedTurn] = field(default_factory=list)  # waiting for the next batch
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    status: dict[str, Any] | None = None
    late: int = 0  # results dropped because their turn had ended already (see ``settle``)
    last_sent: int = 0  # RAY-SPREAD: when a turn was last sent here (``_SENDS``): ties go round robin

    def load(self) -> tuple[float, int]:
        """Turns held or waiting, per worker: the least loaded node takes a turn with no home;
        among equally loaded nodes (all idle, as one-at-a-time turns leave them) the one sent a
        turn least recently, so such turns spread over the cluster instead of all going to the
        first node (and a node that joins takes the next one, not a backlog of them)."""
        return (len(self.held) + len(self.pending)) / self.workers, self.last_sent

    def send(self, turn: RoutedTurn) -> None:
        """Hold ``turn`` here and queue it for the next batch."""
        self.held[turn.turn_id] = turn
        self.pending.append(turn)
        self.last_sent = next(_SENDS)
        self.wake.set()

    async def flusher(self) -> None:
        """Sends the node's submissions in batches, one batch in flight at a time (order kept)."""
        while self.state == "live":
            if not self.pending:
                await self.wake.wait()
                self.wake.clear()
                continue
            # RAY-BATCHES: one submit_batch call per node per flush, not one Ray call per turn,
            # its requests as one msgpack byte string.
            batch, self.pending = self.pending[:SUBMIT_BATCH], self.pending[SUBMIT_BATCH:]
            try:
                data = encode_requests([t.row() for t in batch])
                refused = await self.actor.submit_batch.remote(data)
            except ray.exceptions.RayError as exc:
                # Sent, never acknowledged: they are held by a node that is gone, like any other.
                for turn in batch:
                    turn.set_acked()
                await self.lose(self, f"submit failed: {type(exc).__name__}")
                return
            for i, error in refused:
                turn = batch[i]
                if turn.resent:
                    # Its caller has a handle already: the turn ends, truthfully, here.
                    message = f"sent again after its node was lost, refused: {type(error).__name__}: {error}"
                    self.table.finish(turn, lost_result(turn, message))
                else:
                    turn.ack_error = error
                    self.table.drop(turn)
            for turn in batch:
                turn.set_acked()

    async def results_stream(self) -> None:
        """Follows the node's results; its failure is how the router learns the node is lost."""
        unavailable_since: float | None = None
        while self.state == "live":
            try:
                async for ref in self.actor.results.remote():
                    data = await ref
                    unavailable_since = None
                    for result in decode_results(data):
                        self.settle(result)
                if not self.running():
                    return  # closed: the stream ended after the last result
                reason = "the node supervisor stopped"
            except ray.exceptions.ActorUnavailableError as exc:
                # RAY-LOSS: unreachable (restarting, partitioned) is not yet lost; after
                # node_loss_timeout it is, and the actor is killed so nothing runs twice.
                now = time.monotonic()
                unavailable_since = unavailable_since or now
                if now - unavailable_since < self.loss_timeout:
                    await anyio.sleep(min(0.5, self.loss_timeout / 4))  # retry back-off
                    continue
                reason = f"unreachable for {self.loss_timeout:g}s ({type(exc).__name__})"
            except ray.exceptions.RayError as exc:
                reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            await self.lose(self, reason)
            return

    async def steps_stream(self) -> None:
        """RAY-STEP-RECORDS: keeps the node's step records on their turns, and acknowledges each batch to the
        node once kept. Ends when the node goes: its results stream tells the loss."""

        def mine(turn_id: str) -> RoutedTurn | None:
            turn = self.table.get(turn_id)
            return turn if turn is not None and turn.node is self and not turn.done else None

        try:
            async for ref in self.actor.steps.remote():
                batch = keep(await ref, mine)
                await self.actor.steps_acked.remote(batch)
        except ray.exceptions.RayError:
            return

    def settle(self, result: TurnResult) -> None:
        """End a turn this node held with the result the node sent, unless it has ended already.

        A result reaches the router on the results stream, and a cancelled turn's also in the
        cancel's reply (RAY-CANCEL-REPLY): whichever comes first ends the turn, the other is
        counted in ``late`` and dropped. A result for a turn now held by another node (retried
        after this one was declared lost) or already ended as lost is dropped too (RAY-LOSS)."""
        turn = self.table.get(result.turn_id)
        if turn is None or turn.node is not self:
            return  # not ours (a Ray-native run), or moved to another node
        if turn.done:
            self.late += 1  # its end came by the other way first, or the node was declared lost
            return
        if turn.attempts != result.attempts:
            result = msgspec.structs.replace(result, attempts=turn.attempts)
        self.table.finish(turn, result)
