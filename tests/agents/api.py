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
    """Builds a supervisor inside its turn: refused (H3)."""
    from supervisor import Supervisor

    async with Supervisor(workers=1, spares=0):
        return "started a nested pool"
