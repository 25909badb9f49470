"""Agents for ``tests/test_heir.py`` (LADDER-HEIR): a turn that notes whether the doomed worker it was
held for still ran when it started, and one that makes its worker unable to watch a process."""

from __future__ import annotations

import errno
import os
import time
from typing import Any

import worker


def proc_state(pid: int) -> str:
    """The process state letter of ``pid`` (``R``, ``S``, ``Z`` ...), or ``gone``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return "gone"
    return data[data.rfind(b")") + 2 :].split()[0].decode()


async def note_doomed(turn: worker.Turn) -> dict[str, Any]:
    """At its start: this worker's pid, the time, and the state of process ``doomed`` (the worker
    being killed when this turn was queued): ``Z`` (exited, not reaped yet) or ``gone`` once it no
    longer runs; anything else means it still ran beside this turn."""
    doomed = turn.input["doomed"]
    return {"pid": os.getpid(), "t": time.monotonic(), "doomed": proc_state(doomed)}


async def blind(turn: worker.Turn) -> int:
    """Makes this worker unable to open a pidfd (as on a kernel without ``pidfd_open``): a held
    turn then waits for the supervisor's ``Proceed``. Returns the worker's pid."""

    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open is not available here (tests.agents.heir:blind)")

    os.pidfd_open = no_pidfd  # this worker process only
    return os.getpid()
