"""Agents for ``tests/test_kill_speed.py``: what a worker looks like from inside when it is
killed, and what its warm-up left."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import worker


def _comm(tid: str) -> str:
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().strip()


async def threads(turn: worker.Turn) -> dict[str, Any]:
    """The worker's threads (kernel tasks), by name."""
    return {"pid": os.getpid(), "names": [_comm(t) for t in sorted(os.listdir("/proc/self/task"))]}


async def watch_sigcont(turn: worker.Turn) -> None:
    """Ignores SIGTERM, notes any SIGCONT its worker gets in ``path``, then spins until killed:
    a worker frozen and thawed by the SIGTERM step leaves the file behind."""
    path = turn.input["path"]

    def noted(signum: int, frame: Any) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, b"SIGCONT\n")
        os.close(fd)

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGCONT, noted)
    await turn.emit({"pid": os.getpid()})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # pure Python: the handler runs between bytecodes
        pass


async def warm_state(turn: worker.Turn) -> dict[str, Any]:
    """What the warm-up (WORKER-WARM) left in this worker."""
    from worker import lowlevel

    state = getattr(lowlevel, "warm_up_state", None)  # (absent before WORKER-WARM)
    return state() if state is not None else {}
