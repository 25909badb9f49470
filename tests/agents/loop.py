"""Agents used only by the agent-loop tests (``tests.agents.loop:NAME``)."""

from __future__ import annotations

from typing import Any

import anyio

import worker
from examples.loop_agent import _research_loop


async def research_probe(turn: worker.Turn) -> Any:
    """``examples.loop_agent:research`` that also reports which exception left ``run()``
    (emitted shielded: the worker's cancel scope is cancelled by then), then re-raises it."""
    loop = _research_loop(turn)
    try:
        result = await loop.run("What is the answer?")
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            cause = getattr(exc, "cause", None)
            await turn.emit(
                {
                    "type": "run_raised",
                    "error": type(exc).__name__,
                    "turn_cancelled": isinstance(exc, worker.TurnCancelled),
                    "cause": cause.kind if cause is not None else None,
                    "interrupted": loop.last_run_interrupted,
                }
            )
        raise
    return {"text": getattr(result, "text", None)}
