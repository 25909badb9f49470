"""Agents for the Ray backend's tests (``tests.agents.cluster:NAME``), run by node supervisors.

Each reports what the test needs to tell where it ran: the worker's parent is the node
supervisor (the Ray actor process, a child subreaper), so ``os.getppid()`` names the node.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import anyio

import worker

from .tree import _daemonize


async def where(turn: worker.Turn) -> dict[str, Any]:
    """Returns the worker's pid, its node supervisor's pid, the worker's blocked signals and its
    niceness."""
    blocked = 0
    with open("/proc/self/status") as f:  # noqa: ASYNC230 - procfs, never blocks
        for line in f:
            if line.startswith("SigBlk:"):
                blocked = int(line.split()[1], 16)
    return {
        "pid": os.getpid(),
        "node_pid": os.getppid(),
        "sigblk": blocked,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "input": turn.input,
    }


async def fail(turn: worker.Turn) -> None:
    """Raises (outcome ``failed``)."""
    raise RuntimeError("failed on purpose")


async def crash(turn: worker.Turn) -> None:
    """Kills its own worker (outcome ``crashed``)."""
    os._exit(3)


async def cooperative(turn: worker.Turn) -> None:
    """Emits, then waits for the abort and honours it (outcome ``aborted``)."""
    await turn.emit({"type": "started", "node_pid": os.getppid()})
    await anyio.sleep_forever()


async def stubborn(turn: worker.Turn) -> None:
    """Emits, then ignores Abort and SIGTERM in a blocking sleep (outcome ``killed``)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    await turn.emit({"type": "started", "node_pid": os.getppid()})
    while True:
        time.sleep(0.05)  # noqa: ASYNC251  # allowed: the agent must never await (the fault under test)


async def count(turn: worker.Turn) -> int:
    """Emits ``n`` numbered events, in order, then returns ``n``."""
    n = int(turn.input["n"])
    for i in range(n):
        await turn.emit(i)
    return n


async def logged(turn: worker.Turn) -> dict[str, Any]:
    """Appends ``start <tag>`` and ``end <tag>`` to ``log`` around a short hold: a session's turns
    that overlapped would interleave the lines."""
    path, tag = turn.input["log"], turn.input["tag"]
    with open(path, "a") as f:  # noqa: ASYNC230 - a local file, one line
        f.write(f"start {tag} {os.getppid()}\n")
    await anyio.sleep(float(turn.input.get("hold", 0.05)))  # allowed: the agent holds its turn open
    with open(path, "a") as f:  # noqa: ASYNC230 - a local file, one line
        f.write(f"end {tag} {os.getppid()}\n")
    return {"node_pid": os.getppid()}


async def once(turn: worker.Turn) -> int:
    """Appends one line to ``log`` per run (a turn run twice shows two lines)."""
    with open(turn.input["log"], "a") as f:  # noqa: ASYNC230 - a local file, one line
        f.write(f"{turn.id} {os.getppid()}\n")
    return os.getppid()


async def daemon_then_hang(turn: worker.Turn) -> None:
    """Leaves a setsid daemon and a plain child, emits, then blocks forever without awaiting:
    only a kill ends it (or the loss of its node)."""
    pids = _daemonize(turn.input["pid_file"])
    await turn.emit({"type": "started", **pids})
    while True:
        time.sleep(0.05)  # noqa: ASYNC251  # allowed: the agent must never await (the fault under test)


async def hang_unless_retried(turn: worker.Turn) -> int:
    """Appends its node supervisor's pid to ``log``; the first run then blocks (its node is
    about to be lost), a later run returns how many runs there were."""
    path = turn.input["log"]
    with open(path, "a") as f:  # noqa: ASYNC230 - a local file, one line
        f.write(f"{os.getppid()}\n")
    with open(path) as f:  # noqa: ASYNC230 - a local file, one line
        runs = len(f.read().split())
    if runs >= 2:
        return runs
    while True:
        time.sleep(0.05)  # noqa: ASYNC251  # allowed: blocks until its node is lost
