"""Agents for the speed-work tests: the batch runner's (``tests/test_batch_resume.py``) and the
daemon paths' (``tests/test_daemon_speed.py``: ordering, pacing and flooding, each observable from
the test through files, never through timing)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

import worker


async def note_run(turn: worker.Turn) -> str:
    """Appends the job's id to ``turn.input["log"]`` (one ``O_APPEND`` write: whole lines) as it
    completes, so a test can count how many times each job ran to completion."""
    job_id = str(turn.input["id"])
    fd = os.open(turn.input["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (job_id + "\n").encode())
    finally:
        os.close(fd)
    return job_id


async def record(turn: worker.Turn) -> Any:
    """Appends its input (one line) to the file ``path`` and returns it: the file shows the order
    in which turns ran and how many times each did."""
    inp = turn.input
    with open(inp["path"], "a") as f:  # noqa: ASYNC230 - one short local append
        f.write(f"{inp['mark']}\n")
    return inp["mark"]


async def _wait_file(path: Path) -> None:
    with anyio.fail_after(120):
        while not path.exists():  # noqa: ASYNC110, ASYNC240 - a file from another process: poll
            await anyio.sleep(0.001)  # allowed: the agent's own pacing, polling for the test's file


async def paced(turn: worker.Turn) -> int:
    """Emits ``count`` integers (0, 1, ...) in chunks of ``chunk``; after each chunk it waits for the
    follower to write ``<dir>/got-<n>`` (n: events received so far): a follower that keeps up."""
    inp = turn.input
    count, chunk, where = int(inp["count"]), int(inp["chunk"]), Path(inp["dir"])
    for i in range(count):
        await turn.emit(i)
        if (i + 1) % chunk == 0 and i + 1 < count:
            await _wait_file(where / f"got-{i + 1}")
    return count


async def flood_then_wait(turn: worker.Turn) -> int:
    """Emits 0, waits for ``<dir>/go``, emits 1 … ``count - 1`` as fast as it can, writes
    ``<dir>/emitted``, then waits for ``<dir>/release`` before it returns (so the turn is still
    running while a test reads)."""
    inp = turn.input
    count, where = int(inp["count"]), Path(inp["dir"])
    await turn.emit(0)
    await _wait_file(where / "go")
    for i in range(1, count):
        await turn.emit(i)
    (where / "emitted").write_text("")
    await _wait_file(where / "release")
    return count
