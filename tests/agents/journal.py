"""Agents for the journal fault tests (``tests.agents.journal:NAME``): they count their own runs."""

from __future__ import annotations

import os

import anyio

import worker


def note(path: str, turn_id: str) -> None:
    """Append ``turn_id`` to ``path`` in one ``O_APPEND`` write: one line per execution."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (turn_id + "\n").encode())
    finally:
        os.close(fd)


async def count(turn: worker.Turn) -> dict:
    """Notes that it ran (``input["log"]``), then works ``input["ms"]`` milliseconds."""
    note(turn.input["log"], turn.id)
    await anyio.sleep(turn.input.get("ms", 3) / 1000)  # allowed: the agent's own work
    return {"ran": turn.id}
