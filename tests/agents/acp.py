"""Agents used only by the ACP tests (``tests.agents.acp:NAME``)."""

from __future__ import annotations

import os

import anyio

import worker
from examples import acp_agents


async def by_prompt(turn: worker.Turn) -> None:
    """Behaves as the prompt's text says: ``spin`` (stubborn: ignores the cancel), ``crash``
    (the worker exits with code 3), ``fail`` (raises ValueError), ``fail-on-cancel`` (waits, and
    raises RuntimeError when cancelled: the turn ends ``failed``); anything else is echoed."""
    text = (turn.input or {}).get("text", "")
    if text == "spin":
        await acp_agents.stubborn(turn)
    elif text == "crash":
        await turn.emit({"type": "delta", "text": "about to crash"})
        os._exit(3)
    elif text == "fail":
        raise ValueError("asked to fail")
    elif text == "fail-on-cancel":
        await turn.emit({"type": "delta", "text": "waiting"})
        try:
            await anyio.sleep_forever()
        finally:
            raise RuntimeError("cleanup went wrong")
    else:
        await turn.emit({"type": "delta", "text": text})
