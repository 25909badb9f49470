"""Agents for ``tests/test_isolation.py``: output floods (WORKER-OUTPUT)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import worker


def flood(turn: worker.Turn) -> Any:
    """Writes ``mib`` MiB of 1 KiB lines to fd 1 (every 16th to fd 2), noting ``flooding`` then
    ``flooded`` in the file ``marker``; then never returns (the turn's deadline ends it)."""
    marker = Path(turn.input["marker"])
    marker.write_text("flooding")
    line = b"x" * 1023 + b"\n"
    for i in range(int(turn.input["mib"]) * 1024):
        os.write(2 if i % 16 == 15 else 1, line)
    marker.write_text("flooded")
    while True:
        time.sleep(1)  # allowed: an agent that never returns, for the deadline to end


async def hello(turn: worker.Turn) -> Any:
    """Prints one recognisable line on stdout and one on stderr, returns the worker's cwd."""
    print(f"hello-stdout {turn.input}", flush=True)
    os.write(2, f"hello-stderr {turn.input}\n".encode())
    return os.getcwd()


def dump(turn: worker.Turn) -> Any:
    """Writes ``mib`` MiB of 1 KiB lines to fd 1 and returns (a flood that ends)."""
    line = b"y" * 1023 + b"\n"
    for _ in range(int(turn.input["mib"]) * 1024):
        os.write(1, line)
    return "done"
