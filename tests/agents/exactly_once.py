"""Agents for ``tests/test_exactly_once.py``: each notes its own execution before anything else.

The note is one ``O_APPEND`` write of a short line (atomic), made before the agent returns or
kills its worker, so the test counts how often each turn really ran whatever the pool did.
"""

from __future__ import annotations

import os
from typing import Any

import worker


def _note(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


async def counted(turn: worker.Turn) -> Any:
    """``kind`` "quick": returns at once (no await), its output naming the turn, padded with
    ``pad`` bytes (an output that fills the worker's End log); "crash": kills its worker at once."""
    inp = turn.input
    _note(inp["log"], turn.id)
    if inp["kind"] == "crash":
        os._exit(3)
    return {"ran": turn.id, "pad": "x" * int(inp.get("pad", 0))}
