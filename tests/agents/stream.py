"""Agents for the event-stream tests (``tests/test_event_stream.py``)."""

from __future__ import annotations

import anyio.lowlevel

import worker


async def burst(turn: worker.Turn) -> int:
    """Emits ``n`` small events ``{"i": i}`` as fast as it can, then returns ``n``."""
    n = int(turn.input["n"])
    for i in range(n):
        await turn.emit({"i": i})
    return n


async def burst_then_wait(turn: worker.Turn) -> int:
    """Emits ``n`` events as fast as it can, then waits to be cancelled: its events stay retained
    while the turn is live, so a follower can be held behind on purpose."""
    n = int(turn.input["n"])
    for i in range(n):
        await turn.emit({"i": i})
    await turn.signal.wait()
    return n


async def emit_while_cancelled(turn: worker.Turn) -> str:
    """Emits until its turn is cancelled, then awaits once (where the cancel lands)."""
    i = 0
    while not turn.signal.cancelled:
        await turn.emit({"i": i})
        i += 1
    await anyio.lowlevel.checkpoint()  # the first real await after the cancel: where it lands
    return "not cancelled"
