"""Agents for the daemon soak (``tests/support/soak_daemon.py``): each counts its own executions.

Every agent first appends its turn id to the run log named in its input (one ``O_APPEND`` write
of a short line is atomic), so the harness can count how often each acknowledged turn really
ran, whatever happened to the daemon in between. Then it misbehaves as its ``kind`` says.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio

import worker


def _note(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _background(pids_log: str) -> None:
    """fork → setsid → fork, no exec: a daemon the turn leaves behind. It notes its pid and start
    time (so the harness can tell it from a reused pid), then lives until killed."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        with open(f"/proc/{os.getpid()}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
        _note(pids_log, f"{os.getpid()} {start}")
        while True:
            time.sleep(3600)  # allowed: a background job that never ends by itself
    finally:
        os._exit(0)


async def counted(turn: worker.Turn) -> Any:
    inp = turn.input
    _note(inp["log"], turn.id)
    kind = inp["kind"]
    if kind == "noop":
        return None
    if kind == "fail":
        raise ValueError("this agent fails")
    if kind == "crash":
        os._exit(3)
    if kind == "spin":  # async, never awaits: only the escalation ladder stops it
        while True:
            pass
    if kind == "sleep_sync":  # a blocking call inside an async agent
        time.sleep(3600)  # noqa: ASYNC251  # allowed: the point, a blocking call in an async agent
    if kind == "forker":  # returns, leaving a double-forked daemon behind
        _background(inp["pids"])
        return {"forked": True}
    if kind == "flood":  # output the daemon must never block on
        chunk = b"x" * 65536 + b"\n"
        for _ in range(int(inp.get("chunks", 16))):
            os.write(1, chunk)
        return None
    if kind == "slow":  # cooperative: ends aborted when cancelled
        await turn.emit({"tick": 0})
        await anyio.sleep(3600)  # allowed: a cooperative agent waiting to be cancelled
    raise ValueError(f"unknown kind {kind!r}")
