"""Agents used only by the tests (importable by workers as ``tests.agents:NAME``)."""

from __future__ import annotations

import os

import anyio

import worker


async def signal_state(turn: worker.Turn) -> dict:
    """Reports whether this turn's signal is already set when the turn starts, and the pid."""
    return {"cancelled": turn.signal.cancelled, "cause": turn.signal.cause, "pid": os.getpid()}


async def wait_signal(turn: worker.Turn) -> dict:
    """Emits once, then waits on the signal and returns the cause it saw (honours the cancel by returning)."""
    await turn.emit({"type": "waiting", "pid": os.getpid()})
    with anyio.CancelScope(shield=True):
        cause = await turn.signal.wait()
    return {"saw": cause.kind}


async def checkpoint_loop(turn: worker.Turn) -> None:
    """Loops on ``turn.checkpoint()`` (shielded from scope cancellation) until it raises."""
    await turn.emit({"type": "looping"})
    with anyio.CancelScope(shield=True):
        while True:
            await anyio.sleep(0.005)  # allowed: the agent's own work between checkpoints
            await turn.checkpoint()


def sync_cooperative(turn: worker.Turn) -> str:
    """A plain ``def`` agent: emits, then blocks on the signal and bails out with TurnCancelled."""
    turn.emit_sync({"type": "sync-started"})
    turn.signal.wait_sync()
    turn.signal.raise_if_cancelled()
    return "unreachable"


async def catches_and_fails(turn: worker.Turn) -> None:
    """Cancelled, it raises an unrelated error: the turn ends ``failed``, not ``aborted``."""
    await turn.emit({"type": "ready"})
    try:
        await anyio.sleep_forever()
    finally:
        raise RuntimeError("cleanup went wrong")


async def bad_output(turn: worker.Turn) -> object:
    """Returns something msgspec cannot encode."""
    return object()


async def spawn_tree(turn: worker.Turn) -> dict:
    """Spawns a chain ``depth`` deep; the leaf emits and waits to be cancelled."""
    depth = int((turn.input or {}).get("depth", 1))
    await turn.emit({"type": "node", "depth": depth, "pid": os.getpid()})
    if depth <= 0:
        await anyio.sleep_forever()
    child = await turn.spawn("tests.agents:spawn_tree", {"depth": depth - 1})
    return {"child": child.turn_id, "outcome": child.outcome}


async def spawn_with_timeout(turn: worker.Turn) -> dict:
    """Spawns a slow child but stops awaiting it after ``after`` seconds (the agent's own
    choice): the abandoned child must be cancelled with cause ``parent``."""
    after = float((turn.input or {}).get("after", 0.3))
    with anyio.move_on_after(after) as scope:
        await turn.spawn("examples.agents:slow", {"seconds": 60})
    return {"gave_up": scope.cancelled_caught}


async def spawn_echo(turn: worker.Turn) -> dict:
    """Spawns an ``echo`` child and returns its result's outcome and output."""
    child = await turn.spawn("examples.agents:echo", turn.input)
    return {"outcome": child.outcome, "output": child.output, "parent": child.parent}


async def hang_first_time(turn: worker.Turn) -> dict:
    """On its first run (no ``marker`` file yet) creates the marker, emits and hangs cooperatively;
    on a later run (a retry after a daemon restart) returns at once."""
    from pathlib import Path

    marker = Path(turn.input["marker"])
    if marker.exists():  # noqa: ASYNC240 - a tiny local marker file
        return {"run": "again"}
    marker.write_text("first run")  # noqa: ASYNC240
    await turn.emit({"type": "started", "pid": os.getpid()})
    await anyio.sleep_forever()
    return {"run": "first"}
