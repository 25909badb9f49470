"""An agent module for ``tests/test_heir.py`` that notes when it is imported (LADDER-HEIR: a held turn
whose agent is not imported yet must not import it before the doomed worker is gone). The note goes
to the file named by ``TURNPOOL_TEST_IMPORT_NOTE``: ``pid monotonic``."""

from __future__ import annotations

import os
import time

import worker

_NOTE = os.environ.get("TURNPOOL_TEST_IMPORT_NOTE")
if _NOTE:
    with open(_NOTE, "a") as _f:
        _f.write(f"{os.getpid()} {time.monotonic()!r}\n")


async def agent(turn: worker.Turn) -> int:
    return os.getpid()
