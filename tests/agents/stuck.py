"""Agents stuck before their first ``await`` (``tests.agents.stuck:NAME``), for ``tests/test_stuck.py``.

None of them can emit an event (``emit`` is awaited), so each one writes its pid to the file named
by ``turn.input["mark"]`` before it gets stuck: the test waits for that file, never for a sleep.
The blocking-import agents live in ``tests/agents/stuck_import_block.py`` and
``tests/agents/stuck_import_slow.py`` (their import itself is what blocks).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import wire
import worker
from wire import worker_link


def note(path: str | None, text: str | None = None) -> None:
    """Write ``text`` (default: this pid) to ``path`` atomically: a reader never sees half of it."""
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text if text is not None else str(os.getpid()))
    os.replace(tmp, path)


async def spin(turn: worker.Turn) -> None:
    """A CPU loop that never awaits (and so never sees ``Abort``)."""
    note(turn.input.get("mark"))
    while True:
        pass


async def sleeper(turn: worker.Turn) -> None:
    """``time.sleep`` inside ``async def``: the event loop never runs again."""
    note(turn.input.get("mark"))
    while True:
        time.sleep(3600)  # noqa: ASYNC251  # allowed: the agent must never await (the fault under test)


async def hog_spin(turn: worker.Turn) -> None:
    """Allocates ``mb`` MiB, then spins without awaiting: only the memory limit's ladder stops it."""
    block = bytearray(int(turn.input.get("mb", 300)) * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    note(turn.input.get("mark"))
    while True:
        pass


async def self_stopper(turn: worker.Turn) -> None:
    """Stops its whole worker with SIGSTOP at once: no thread of the worker runs any more, so no
    frame queued in it (``Started`` included) can leave."""
    note(turn.input.get("mark"))
    os.kill(os.getpid(), signal.SIGSTOP)
    while True:
        pass


async def count(turn: worker.Turn) -> Any:
    """Appends its turn id to ``turn.input["log"]`` (one line per execution) and returns at once,
    without awaiting: its ``Started`` and ``End`` share one frame."""
    with open(turn.input["log"], "a") as f:  # noqa: ASYNC230 - the agent must not await (the fault under test)
        f.write(turn.id + "\n")
    return turn.input.get("i")


async def forger(turn: worker.Turn) -> Any:
    """Sends, over its worker's own connection, an ``End`` (completed, forged output) for the turn
    ``turn.input["victim"]`` - a turn handed to this worker behind this one - then returns."""
    forged = worker_link.End(
        turn.input["victim"], "completed", wire.encode_payload({"forged": True}, what="output")
    )
    turn._conn.send_now(forged)
    await turn.emit({"type": "forged"})  # on the wire when it returns: the forged End went first
    return "forger done"
