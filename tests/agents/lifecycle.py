"""Agents for the daemon's stop, restart and reload tests (``tests/test_daemon_lifecycle.py``)."""

from __future__ import annotations

import os
from typing import Any

import worker


async def record(turn: worker.Turn) -> str:
    """Appends its turn id to the file ``input["file"]`` (one line per run): how many times a
    turn ran is then read from that file, across daemon restarts."""
    inp: dict[str, Any] = turn.input
    fd = os.open(inp["file"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"{turn.id}\n".encode())
    finally:
        os.close(fd)
    return turn.id
