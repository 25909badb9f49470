"""Agents used only by the batch tests (importable by workers as ``tests.agents.batch:NAME``)."""

from __future__ import annotations

import os

import worker


async def fail_once(turn: worker.Turn) -> dict:
    """Fails the first time it runs for ``marker`` (a file path), completes after: a flaky job
    that a retry on ``failed`` rescues. (It fails rather than crashes: a worker that dies at
    once can take its last frames with it, and the supervisor then requeues the turn as never
    started, which would hide the first attempt from the batch.)"""
    marker = turn.input["marker"]
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return {"recovered": True, "turn": turn.id}
    os.close(fd)
    raise RuntimeError("first attempt fails")
