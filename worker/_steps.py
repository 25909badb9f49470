"""A turn's step log: the records an agent loop makes durable through the supervisor.

``StepLog`` belongs to one ``Turn`` (made on first use: a turn that records nothing pays
nothing). ``record`` posts one ``worker_link.Step`` (batched with the turn's other messages) and returns
its ``seq``; ``durable(seq)`` waits for the supervisor's ``StepAck`` saying every record up to it
is durable (LOOP-STEP-DURABLE: a daemon acknowledges only once its journal committed it). ``recorded`` are
the records of the turn's earlier attempts, handed back in ``Run.steps`` (LOOP-RESUME), decoded on
first use; ``corrupt`` says why they cannot be read, if so (the loop refuses to run blind).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

import wire
from wire import worker_link

from ._connection import Connection

# LOOP-STEP-SIZE: the largest step record kept (a tool returning more is told to the model in this
# attempt, but not recorded: the turn cannot be resumed past it), and the most a turn's records
# may hold in all (they travel back in one ``Run`` frame, under ``wire.MAX_MESSAGE_SIZE``).
MAX_STEP_BYTES = 4 * 1024 * 1024
MAX_TURN_STEP_BYTES = 24 * 1024 * 1024

_encode = msgspec.msgpack.Encoder().encode
_decode_list = msgspec.msgpack.Decoder(list[dict[str, Any]]).decode


class StepRecordTooLarge(ValueError):
    """A step record over ``MAX_STEP_BYTES`` (or past the turn's ``MAX_TURN_STEP_BYTES``)."""


class StepRefused(RuntimeError):
    """The supervisor could not make a step record durable (its journal refused it)."""


class StepLog:
    __slots__ = (
        "_raw",
        "_recorded",
        "acked",
        "attempt",
        "bytes",
        "conn",
        "corrupt",
        "error",
        "loops",
        "next_seq",
        "turn_id",
        "waiters",
    )  # fmt: skip

    def __init__(self, turn_id: str, attempt: int, raw: msgspec.Raw, conn: Any) -> None:
        self.turn_id = turn_id
        self.attempt = attempt
        # A turn made without the worker's connection (a test's) has no supervisor to record to.
        self.conn: Connection | None = conn if isinstance(conn, Connection) else None
        self._raw = raw
        self._recorded: list[dict[str, Any]] | None = None
        self.corrupt: str | None = None
        self.error: str | None = None
        self.waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.loops = 0  # agent loops that recorded in this turn so far (each has its own index)
        self.bytes = len(raw)
        recorded = self.recorded
        self.next_seq = len(recorded)
        self.acked = self.next_seq - 1

    @property
    def recorded(self) -> list[dict[str, Any]]:
        """The earlier attempts' records, in ``seq`` order (empty on a first attempt, or when they
        cannot be read: see ``corrupt``)."""
        if self._recorded is None:
            self._recorded = []
            raw = bytes(self._raw)
            if raw and raw != bytes(wire.NIL):
                try:
                    self._recorded = _decode_list(raw)
                except (msgspec.DecodeError, RecursionError) as exc:
                    self.corrupt = f"the step records of turn {self.turn_id!r} cannot be read: {exc}"
        return self._recorded

    def record(self, step: int, kind: str, body: dict[str, Any]) -> int:
        """Post one record now; its ``seq``. Raises ``StepRecordTooLarge`` (nothing is sent)."""
        data = _encode(body)
        size = len(data)
        if size > MAX_STEP_BYTES:
            raise StepRecordTooLarge(
                f"a {kind} step record of {size} bytes is over the limit of {MAX_STEP_BYTES} bytes"
            )
        if self.bytes + size > MAX_TURN_STEP_BYTES:
            raise StepRecordTooLarge(
                f"the turn's step records would hold {self.bytes + size} bytes, over the limit of "
                f"{MAX_TURN_STEP_BYTES}"
            )
        self.bytes += size
        seq = self.next_seq
        self.next_seq = seq + 1
        if self.conn is None:  # no supervisor (a test's bare turn): durable as far as it goes
            self.acked = seq
        else:
            self.conn.post(worker_link.Step(self.turn_id, seq, step, kind, msgspec.Raw(data)))
        return seq

    async def durable(self, seq: int) -> None:
        """Wait until record ``seq`` (and every one before it) is durable; raises ``StepRefused``."""
        if self.acked >= seq or seq < 0:
            self._check()
            return
        assert self.conn is not None
        fut = self.conn._loop.create_future()
        self.waiters.append((seq, fut))
        await fut
        self._check()

    def _check(self) -> None:
        if self.error is not None:
            raise StepRefused(self.error)

    def on_ack(self, msg: worker_link.StepAck) -> None:
        if msg.error is not None:
            if self.error is None:
                self.error = msg.error  # a refused record is not durable, nor is any after it
        elif msg.seq > self.acked:
            self.acked = msg.seq
        keep = []
        for seq, fut in self.waiters:
            if fut.done():
                continue
            if seq <= self.acked or self.error is not None:
                fut.set_result(None)
            else:
                keep.append((seq, fut))
        self.waiters = keep
