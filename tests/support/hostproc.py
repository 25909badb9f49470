"""A host process for death tests: ``python -c SCRIPT ARGS…`` that prints one JSON line once it has set
up what the test will kill; the test gets the process and that line, and the process is killed and
reaped however the test ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio


@asynccontextmanager
async def host(
    script: str, *args: str, ready_s: float = 60
) -> AsyncIterator[tuple[subprocess.Popen[bytes], Any]]:
    """Start the host and wait (at most ``ready_s``) for its JSON line."""
    proc = subprocess.Popen(  # noqa: ASYNC220 - its stdout is read in a thread
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, cwd=os.getcwd()
    )
    try:
        assert proc.stdout is not None
        with anyio.fail_after(ready_s):
            line = await anyio.to_thread.run_sync(proc.stdout.readline)
        yield proc, json.loads(line)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
