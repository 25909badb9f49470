"""Example agents: one per behaviour the pool must handle.

Each is ``"examples.agents:NAME"``. Inputs are dicts; every key is optional.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Any

import anyio

import worker


async def echo(turn: worker.Turn) -> Any:
    """Returns its input unchanged."""
    return turn.input


def echo_sync(turn: worker.Turn) -> Any:
    """``echo`` as a plain ``def`` (runs in a worker thread)."""
    return turn.input


async def noop(turn: worker.Turn) -> None:
    """Does nothing: the cheapest possible turn (benchmarks)."""
    return None


async def streamer(turn: worker.Turn) -> dict[str, int]:
    """Emits ``count`` delta events (default 5), ``delay`` seconds apart (default 0)."""
    inp = turn.input or {}
    count = int(inp.get("count", 5))
    delay = float(inp.get("delay", 0))
    for i in range(count):
        await turn.emit({"type": "delta", "i": i, "text": f"chunk {i} "})
        if delay:
            await anyio.sleep(delay)
    return {"events": count}


async def slow(turn: worker.Turn) -> dict[str, Any]:
    """Cooperative: sleeps ``seconds`` (default 30) in small awaits, emitting a tick event first."""
    inp = turn.input or {}
    seconds = float(inp.get("seconds", 30))
    await turn.emit({"type": "started", "pid": os.getpid()})
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # noqa: ASYNC110 - small awaits, each one a cancellation point
        await anyio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return {"slept": seconds}


async def stubborn(turn: worker.Turn) -> None:
    """A CPU loop that never awaits: ignores ``Abort``; only SIGTERM (handled by the worker) stops it."""
    await turn.emit({"type": "started", "pid": os.getpid()})
    seconds = float((turn.input or {}).get("seconds", 3600))
    deadline = time.monotonic() + seconds
    x = 0
    while time.monotonic() < deadline:
        x += 1
    return None


async def sigterm_ignorer(turn: worker.Turn) -> None:
    """Ignores SIGTERM and never awaits: only SIGKILL stops it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    await turn.emit({"type": "started", "pid": os.getpid()})
    while True:
        pass


async def sigterm_blocker(turn: worker.Turn) -> None:
    """Blocks SIGTERM with the signal mask and never awaits: only SIGKILL stops it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    await turn.emit({"type": "started", "pid": os.getpid()})
    while True:
        pass


_DAEMON = r"""
import os, sys, time
if os.fork() > 0:
    os._exit(0)
os.setsid()
if os.fork() > 0:
    os._exit(0)
sys.stdout.write(str(os.getpid()) + "\n"); sys.stdout.flush()
os.close(1)
while True:
    time.sleep(1)
"""


async def forker(turn: worker.Turn) -> None:
    """Starts ``children`` grandchildren (default 2) and a double-forked setsid daemon, emits their
    pids, then hangs without awaiting (so only the kill stops it). ``ignore_sigterm`` makes the
    worker ignore SIGTERM too, so only the supervisor's SIGKILL step stops the tree."""
    inp = turn.input or {}
    if inp.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pids = []
    for _ in range(int(inp.get("children", 2))):
        p = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])  # noqa: ASYNC220 - a misbehaving agent: blocks on purpose
        pids.append(p.pid)
    d = subprocess.Popen([sys.executable, "-c", _DAEMON], stdout=subprocess.PIPE)  # noqa: ASYNC220 - a misbehaving agent: blocks on purpose
    assert d.stdout is not None
    daemon_pid = int(d.stdout.readline())
    d.wait()
    await turn.emit({"type": "pids", "children": pids, "daemon": daemon_pid, "worker": os.getpid()})
    if inp.get("cooperative"):
        await anyio.sleep_forever()
    while True:
        time.sleep(0.01)  # noqa: ASYNC251 - hangs without awaiting: only the kill stops it


async def crasher(turn: worker.Turn) -> None:
    """Dies on its own: ``{"how": "exit", "code": 3}`` (default) or ``{"how": "segv"}``."""
    inp = turn.input or {}
    await turn.emit({"type": "started", "pid": os.getpid()})
    if inp.get("how") == "segv":
        ctypes.string_at(0)
    os._exit(int(inp.get("code", 3)))


async def failing(turn: worker.Turn) -> None:
    """Raises ``ValueError(message)``."""
    raise ValueError((turn.input or {}).get("message", "this agent always fails"))


async def hog(turn: worker.Turn) -> None:
    """Allocates ``mb`` MiB (default 512) and then waits cooperatively: the memory limit's target."""
    mb = int((turn.input or {}).get("mb", 512))
    block = bytearray(mb * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    await turn.emit({"type": "allocated", "mb": mb})
    await anyio.sleep_forever()


async def parent(turn: worker.Turn) -> dict[str, Any]:
    """Spawns a child turn (``child`` agent, default ``slow``) and returns its outcome."""
    inp = turn.input or {}
    result = await turn.spawn(inp.get("child", "examples.agents:slow"), inp.get("child_input", {}))
    return {"child": result.turn_id, "outcome": result.outcome}
