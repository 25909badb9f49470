"""Agents for the HTTP front end's tests (``"tests.agents.http:NAME"``)."""

from __future__ import annotations

import os
from typing import Any

import worker


async def blob_streamer(turn: worker.Turn) -> dict[str, int]:
    """Emits ``count`` events of ``size`` characters each as fast as it can, then returns."""
    inp: dict[str, Any] = turn.input or {}
    count = int(inp.get("count", 100))
    blob = "x" * int(inp.get("size", 1024))
    for i in range(count):
        await turn.emit({"i": i, "blob": blob})
    return {"events": count, "pid": os.getpid()}


async def emit_then_wait(turn: worker.Turn) -> str:
    """Emits ``count`` events, then waits (cooperatively) until it is cancelled: ends ``aborted``."""
    for i in range(int((turn.input or {}).get("count", 3))):
        await turn.emit({"i": i})
    await turn.signal.wait()
    await turn.checkpoint()  # raises the cancellation
    return "not reached"


async def blobs_when_told(turn: worker.Turn) -> dict[str, int]:
    """Emits event 0, waits until the turn is cancelled, then emits ``count - 1`` events of
    ``size`` characters as fast as it can and returns (shielded, so it completes): lets a test
    connect its followers first."""
    import anyio

    inp: dict[str, Any] = turn.input or {}
    count = int(inp.get("count", 100))
    blob = "x" * int(inp.get("size", 1024))
    with anyio.CancelScope(shield=True):
        await turn.emit({"i": 0})
        await turn.signal.wait()
        for i in range(1, count):
            await turn.emit({"i": i, "blob": blob})
    return {"events": count}


async def ticker(turn: worker.Turn) -> int:
    """Emits ``{"tick": i}`` every ``every`` seconds (default 0.1) until cancelled (cooperative)."""
    import anyio

    every = float((turn.input or {}).get("every", 0.1))
    i = 0
    while True:
        await turn.emit({"tick": i})
        i += 1
        await anyio.sleep(every)  # allowed: the agent's own pace between events
