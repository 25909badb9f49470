"""Agents for the bounded-clients tests (``tests/test_clients_bounded.py``)."""

from __future__ import annotations

from typing import Any

import anyio

import worker


async def near_limit_output(turn: worker.Turn) -> str:
    """Returns a string whose encoding is just under ``wire.MAX_PAYLOAD_SIZE`` (by ``slack`` bytes)."""
    import wire

    slack = int((turn.input or {}).get("slack", 16))
    return "x" * (wire.MAX_PAYLOAD_SIZE - slack - 5)  # 5: msgpack's str32 header


async def near_limit_error(turn: worker.Turn) -> None:
    """Raises an exception whose message (``size`` bytes, default just under a message frame) would
    make the turn's result, with its ids around it, larger than one frame."""
    import wire

    raise RuntimeError("e" * int((turn.input or {}).get("size", wire.MAX_MESSAGE_SIZE - 400)))


async def flood(turn: worker.Turn) -> dict[str, int]:
    """Emits ``count`` small events as fast as it can (yielding to the worker's loop in between);
    with ``wait``, then runs until cancelled (its events stay kept while it runs)."""
    count = int((turn.input or {}).get("count", 100_000))
    size = int((turn.input or {}).get("size", 16))
    pad = "p" * size
    for i in range(count):
        await turn.emit({"i": i, "p": pad})
    if (turn.input or {}).get("wait"):
        await turn.signal.wait()
        await anyio.lowlevel.checkpoint()
    return {"events": count}


async def wait_for_cancel(turn: worker.Turn) -> dict[str, Any]:
    """Emits one event, then runs until cancelled (a long turn)."""
    await turn.emit({"started": True})
    await turn.signal.wait()
    await anyio.lowlevel.checkpoint()
    return {"cancelled": True}
