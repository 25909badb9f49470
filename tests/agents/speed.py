"""Agents for the tests of the speed work on the batch runner (``tests/test_batch_resume.py``)."""

from __future__ import annotations

import os

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
