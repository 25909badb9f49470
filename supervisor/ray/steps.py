"""Step records on a Ray cluster (RAY-STEP-RECORDS): a node's records live with the router, so a turn placed
again on another node after its node was lost resumes from its last recorded step.

``NodeSteps`` is a node supervisor's step sink (``StepRecords.set_sink``): records go to the router
in batches on the node's ``steps`` stream, and each is acknowledged to its worker only once the
router said it holds the batch (``steps_acked``): the router is what outlives a lost node.
``keep`` is the router's side: a turn's records, in ``seq`` order, carried by its next request.

Nothing here imports Ray.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

_encode = msgspec.msgpack.Encoder().encode
# (batch id, [(turn id, seq, kind, record)])
_decode = msgspec.msgpack.Decoder(tuple[int, list[tuple[str, int, str, bytes]]]).decode


class NodeSteps:
    """The node's side: a sink for its engine, a stream for the router, the router's acks."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, str, bytes]] = []
        self.callbacks: list[Callable[[], None]] = []
        self.sent: dict[int, list[Callable[[], None]]] = {}
        self.batch = 0
        self.wake = asyncio.Event()

    def write(
        self, turn_id: str, seq: int, step: int, kind: str, record: bytes, done: Callable[[], None]
    ) -> None:
        self.rows.append((turn_id, seq, kind, record))
        self.callbacks.append(done)
        self.wake.set()

    async def stream(self, closed: Callable[[], bool]) -> AsyncIterator[bytes]:
        while True:
            while not self.rows:
                if closed():
                    return
                self.wake.clear()
                await self.wake.wait()
            self.batch += 1
            rows, self.rows = self.rows, []
            self.sent[self.batch], self.callbacks = self.callbacks, []
            yield _encode((self.batch, rows))

    def acked(self, batch: int) -> None:
        """The router holds batch ``batch`` (and every one before it): their records are durable."""
        for old in sorted(b for b in self.sent if b <= batch):
            for done in self.sent.pop(old):
                done()


def keep(data: bytes, find: Callable[[str], Any]) -> int:
    """The router's side: store a batch's records on their turns (``find(turn_id)``: the routed turn
    this node holds, or None); returns the batch id to acknowledge."""
    batch, rows = _decode(data)
    for turn_id, seq, kind, record in rows:
        turn = find(turn_id)
        if turn is None:
            continue
        if turn.steps is None:
            turn.steps = []
        if seq == len(turn.steps):
            turn.steps.append((kind, record))
    return batch
