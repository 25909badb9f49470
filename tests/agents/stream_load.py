"""Agents for ``tests/test_stream_load.py``: streaming turns that mostly wait (as an LLM turn does)."""

from __future__ import annotations

import os
import threading

import anyio

import worker

WATCHER = "worker-watcher"  # worker/_flusher.py THREAD_NAME: the one thread of the worker's own


def _watcher_wakes() -> int:
    """How many times the worker's watcher thread has gone to sleep and woken (its voluntary
    context switches, from /proc)."""
    for thread in threading.enumerate():
        if thread.name == WATCHER:
            with open(f"/proc/self/task/{thread.native_id}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        return int(line.split()[1])
    raise RuntimeError("no watcher thread in this worker")


async def slow_stream(turn: worker.Turn) -> dict[str, int]:
    """Emits ``n`` events ``period`` seconds apart, and says how often the watcher thread woke
    meanwhile."""
    n, period = int(turn.input["n"]), float(turn.input["period"])
    await turn.emit({"i": -1})  # the turn's first emit and Started are out: count from here
    before = _watcher_wakes()
    for i in range(n):
        await anyio.sleep(period)  # allowed: the agent's behaviour (a model streaming slowly)
        await turn.emit({"i": i})
    return {"wakes": _watcher_wakes() - before}


async def big_then_wait(turn: worker.Turn) -> int:
    """Emits ``n`` events of about ``size`` bytes each as fast as it can, then waits to be
    cancelled, so its buffer can be looked at while it is live."""
    n, pad = int(turn.input["n"]), "x" * int(turn.input["size"])
    for i in range(n):
        await turn.emit({"i": i, "pad": pad})
    await turn.signal.wait()
    return n


def _autogroup_nice() -> int | None:
    try:
        with open("/proc/self/autogroup") as f:
            return int(f.read().split("nice")[1])
    except (OSError, IndexError, ValueError):
        return None


async def niceness(turn: worker.Turn) -> dict[str, object]:
    """This worker's scheduling niceness: the main thread's and its autogroup's (if the kernel has
    autogroups), as the kernel reports them."""
    return {"nice": os.getpriority(os.PRIO_PROCESS, 0), "autogroup": _autogroup_nice()}
