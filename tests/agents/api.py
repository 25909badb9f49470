"""Agents for tests/test_agent_errors.py and tests/test_api_contract.py (issue 15)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import worker


async def streams_by_yielding(turn: worker.Turn) -> AsyncIterator[dict[str, Any]]:
    """The mistake under test: an async generator where an agent (returns a value, emits events) belongs."""
    yield {"text": "chunk"}


def generator_agent(turn: worker.Turn) -> Any:
    """The same mistake with a plain generator."""
    yield {"text": "chunk"}


async def starts_a_supervisor(turn: worker.Turn) -> str:
    """Builds a supervisor inside its turn: refused (API-NO-NESTING)."""
    from supervisor import Supervisor

    async with Supervisor(workers=1, spares=0):
        return "started a nested pool"


async def marks_then_waits(turn: worker.Turn) -> dict[str, Any]:
    """Writes ``turn.input["marker"]`` (its pid) once running, emits, then waits cooperatively for
    ``seconds`` (default 60): a turn a test can see started from another process."""
    import os

    import anyio

    inp = turn.input or {}
    marker = inp.get("marker")
    if marker:
        tmp = f"{marker}.tmp"
        with open(tmp, "w") as f:  # noqa: ASYNC230 - a few bytes, before the agent waits
            f.write(str(os.getpid()))
        os.replace(tmp, marker)
    await turn.emit({"type": "started", "pid": os.getpid()})
    await anyio.sleep(float(inp.get("seconds", 60)))  # allowed: the agent's own behaviour (waiting)
    return {"waited": True}


class _UnreadableError(Exception):
    """An error whose message cannot be read: its ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no message for you")


async def raises_unreadable(turn: worker.Turn) -> None:
    """WORKER-ERROR-TEXT: raises an exception whose ``__str__`` raises."""
    raise _UnreadableError()


def raises_unreadable_sync(turn: worker.Turn) -> None:
    """WORKER-ERROR-TEXT, from a plain ``def`` agent (a thread)."""
    raise _UnreadableError()


async def raises_surrogate(turn: worker.Turn) -> None:
    """WORKER-ERROR-TEXT: an error message holding a lone surrogate, which UTF-8 cannot carry."""
    raise ValueError("bad \ud800 text")
