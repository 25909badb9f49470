"""turnpool agents used only by the benchmarks (``benchmarks._agents:NAME``)."""

from __future__ import annotations

import os
import time

import anyio

import worker


async def stamp(turn: worker.Turn) -> float:
    """Returns ``time.monotonic()`` at its start: when this queued turn began running."""
    return time.monotonic()


async def spin(turn: worker.Turn) -> None:
    """Emits its pid and start time, then spins without ever awaiting: only a kill stops it."""
    await turn.emit({"pid": os.getpid(), "t": time.monotonic()})
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        pass


async def awaiting(turn: worker.Turn) -> None:
    """Emits, then awaits in a loop (1 ms sleeps): a cancel lands at the next await."""
    await turn.emit({"pid": os.getpid()})
    while True:  # noqa: ASYNC110 - awaiting in a loop is what this agent is for
        await anyio.sleep(0.001)


async def burst(turn: worker.Turn) -> int:
    """Emits ``n`` small events (``{"i": i}``) as fast as it can: the event-stream benchmark."""
    n = int(turn.input["n"])
    emit = turn.emit
    for i in range(n):
        await emit({"i": i})
    return n
