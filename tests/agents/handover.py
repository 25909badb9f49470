"""Agents for ``tests/test_handover.py`` (LADDER-HANDOVER): a doomed turn that survives its SIGTERM,
one that ends on it, and queued turns that note where and when they ran."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import anyio

import worker


def _note(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


async def survive_term(turn: worker.Turn) -> None:
    """Ignores SIGTERM and spins: only the SIGKILL step (``kill_after``) ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    await turn.emit({"pid": os.getpid()})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pass


async def end_on_term(turn: worker.Turn) -> str:
    """Takes SIGTERM as a cue to return normally: its worker then sends an ``End`` (completed)
    after the supervisor's kill decision, and lives on until the SIGKILL step."""
    got: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    await turn.emit({"pid": os.getpid()})
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        pass
    return "ended after SIGTERM"


async def note_start(turn: worker.Turn) -> dict[str, Any]:
    """Appends ``pid monotonic`` to ``path`` at its start (once per run of the turn), then, if
    ``hold`` names a file, waits until that file exists."""
    _note(turn.input["path"], f"{turn.id} {os.getpid()} {time.monotonic()!r}")
    hold = turn.input.get("hold")
    if hold:
        while not os.path.exists(hold):  # noqa: ASYNC110, ASYNC240 - waiting on a file the test creates
            await anyio.sleep(0.005)  # allowed: the agent's own behaviour (waits for the test's go)
    return {"pid": os.getpid(), "t": time.monotonic()}
