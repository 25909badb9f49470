"""What the framework-adapter and MCP tests share: reading a turn's events, and bounded waits."""

from __future__ import annotations

import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio

from supervisor import TurnHandle
from tests.support.backends import gone

__all__ = ["events_of", "gone", "wait_for_event", "wait_for_file"]


async def events_of(handle: TurnHandle) -> list[dict[str, Any]]:
    """Every event of the turn, once it has ended (bounded)."""
    with anyio.fail_after(60):
        async with aclosing(handle.events()) as events:
            return [event async for event in events]


async def wait_for_event(handle: TurnHandle, kind: str) -> dict[str, Any]:
    """The turn's first event of type ``kind`` (bounded); fails if the turn ends without one."""
    with anyio.fail_after(60):
        async with aclosing(handle.events()) as events:
            async for event in events:
                if event["type"] == kind:
                    return event
        result = await handle.result()  # (ended: at once) what ended it, for the failure's message
    raise AssertionError(
        f"the turn ended without a {kind} event: {result.outcome}, cause {result.cause}, error {result.error}"
    )


def wait_for_file(path: Path, bound: float = 60.0) -> str:
    """Bounded poll of a file another process writes."""
    deadline = time.monotonic() + bound
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} was never written"
        time.sleep(0.01)  # allowed: bounded poll of a file written in another process
    return path.read_text()
