"""Agents for tests/test_turn_cpu.py: what the per-turn CPU work could break."""

from __future__ import annotations

from typing import Any

import anyio

import worker


async def level_cancel(turn: worker.Turn) -> dict[str, Any]:
    """Swallows the first cancellation, then awaits again (level-triggered: cancelled again), and
    runs a shielded cleanup that awaits and emits before it lets the cancellation out."""
    await turn.emit({"step": "running"})
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        pass  # swallowed: a cancel scope is level-triggered, the next await raises again
    try:
        await anyio.sleep(60)  # allowed: the agent waits to be cancelled (level-triggered)
        return {"escaped": True}  # the scope let a second await run to its end: not anyio's scope
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.01)  # allowed: the agent's own shielded cleanup, which must finish
            await turn.emit({"step": "cleaned"})


async def emits(turn: worker.Turn) -> int:
    """Emits ``turn.input`` events and returns how many."""
    n = int(turn.input)
    for i in range(n):
        await turn.emit({"i": i})
    return n


async def two_children(turn: worker.Turn) -> list[str]:
    """Spawns two children, one after the other, and returns their outcomes."""
    a = await turn.spawn("examples.agents:echo", 1)
    b = await turn.spawn("examples.agents:echo", 2)
    return [a.outcome, b.outcome]
