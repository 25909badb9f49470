"""Agents that misbehave in the ways the fault matrix needs (``tests.agents.faults:NAME``).

Each one emits a first event (``{"type": "started", "pid": ...}``) before it misbehaves, so a
test can wait for the turn to be seen running instead of sleeping. The ones in
``examples.agents`` (echo, failing, crasher, stubborn, sigterm_ignorer, sigterm_blocker,
forker, hog) cover the rest of the matrix.
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
import time
from typing import Any

import anyio
import anyio.lowlevel
import zmq

import worker


async def gil_holder(turn: worker.Turn) -> None:
    """Blocks in one C call that holds the GIL and never returns to the interpreter loop.

    ``sum`` over ``itertools.repeat`` runs entirely in C: no bytecode runs, so neither the
    worker's Python signal handlers (SIGTERM, the parent-death SIGUSR2) nor any other thread
    (the life-pipe watcher) gets to run until it returns — in hours. It ignores ``Abort`` too.
    """
    await turn.emit({"type": "started", "pid": os.getpid()})
    sum(itertools.repeat(1, 10**14))


async def stubborn_hog(turn: worker.Turn) -> None:
    """Allocates ``mb`` MiB (default 300) and then spins without awaiting: the memory limit's
    cancel is ignored, so the ladder must kill it (outcome ``killed``, cause ``memory``)."""
    mb = int((turn.input or {}).get("mb", 300))
    await turn.emit({"type": "started", "pid": os.getpid()})  # before the limit can trip
    block = bytearray(mb * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    while True:
        time.sleep(0.01)  # noqa: ASYNC251  # allowed: the agent must never await (the fault under test)


async def forker_only_children(turn: worker.Turn) -> None:
    """Starts ``children`` plain grandchildren (default 2; no daemon), emits their pids and hangs
    without awaiting."""
    import subprocess

    pids = []
    for _ in range(int((turn.input or {}).get("children", 2))):
        p = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])  # noqa: ASYNC220  # allowed: a grandchild that just lives
        pids.append(p.pid)
    await turn.emit({"type": "started", "pid": os.getpid(), "children": pids})
    while True:
        time.sleep(0.01)  # noqa: ASYNC251  # allowed: the agent must never await (the fault under test)


def _worker_sockets() -> list[zmq.Socket[Any]]:
    return [o for o in gc.get_objects() if isinstance(o, zmq.Socket) and not o.closed]


async def socket_closer(turn: worker.Turn) -> str:
    """Finds the worker's own ZeroMQ socket(s) (through ``gc``) and closes them, then returns.

    The worker can no longer report anything: it must die rather than stay up deaf."""
    await turn.emit({"type": "started", "pid": os.getpid()})
    for sock in _worker_sockets():
        sock.close(linger=0)
    return "closed"


async def socket_options(turn: worker.Turn) -> dict[str, int]:
    """Reports the smallest ``MAXMSGSIZE`` of the worker's sockets that reach outside the process
    (its DEALERs; the link monitor is an inproc PAIR)."""
    socks = [s for s in _worker_sockets() if s.socket_type == zmq.DEALER]
    return {"count": len(socks), "maxmsgsize": min(s.getsockopt(zmq.MAXMSGSIZE) for s in socks)}


async def garbage_writer(turn: worker.Turn) -> str:
    """Writes binary garbage to stdout and stderr (Python level and raw fds), then returns."""
    junk = bytes(range(256)) * 64
    sys.stdout.write("\x00\xff garbage \x1b[2J not a frame\n")
    sys.stdout.flush()
    sys.stderr.write("\x00 more garbage\n")
    os.write(1, junk)
    os.write(2, junk)
    await anyio.lowlevel.checkpoint()
    return "wrote"


async def exit_at_once(turn: worker.Turn) -> None:
    """Kills its worker before yielding once: the worker's ``Started`` frame never leaves the
    process; only the start marker tells the supervisor that the turn started."""
    os._exit(9)


async def crash_when_told(turn: worker.Turn) -> None:
    """Emits, then waits; SIGUSR1 makes it die: ``{"how": "exit", "code": n}`` or ``{"how": "segv"}``.

    The test sends the signal after it saw the first event, so the supervisor knows the turn
    started (an agent that dies before its first frame leaves the process is ``exit_at_once``)."""
    import ctypes
    import signal

    inp = turn.input or {}

    def die(signum: int, frame: Any) -> None:
        if inp.get("how") == "segv":
            ctypes.string_at(0)
        os._exit(int(inp.get("code", 3)))

    signal.signal(signal.SIGUSR1, die)
    await turn.emit({"type": "started", "pid": os.getpid()})
    await anyio.sleep_forever()


async def big_output(turn: worker.Turn) -> str:
    """Returns a value larger than ``wire.MAX_PAYLOAD_SIZE``: the turn must fail, not the link."""
    import wire

    return "x" * (wire.MAX_PAYLOAD_SIZE + 1)


async def big_event(turn: worker.Turn) -> str:
    """Emits an event larger than ``wire.MAX_PAYLOAD_SIZE`` (``emit`` raises ``PayloadTooLarge``)."""
    import wire

    await turn.emit("x" * (wire.MAX_PAYLOAD_SIZE + 1))
    return "unreachable"


async def env_probe(turn: worker.Turn) -> dict[str, Any]:
    """Reports whether the spawn token is visible to agent code or to a child process."""
    import subprocess

    child = subprocess.run(  # noqa: ASYNC221 - a quick probe
        [sys.executable, "-c", "import os; print('TURNPOOL_SPAWN_TOKEN' in os.environ)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {"in_environ": "TURNPOOL_SPAWN_TOKEN" in os.environ, "in_child": child.stdout.strip() == "True"}


async def stream_when_told(turn: worker.Turn) -> dict[str, int]:
    """Emits event 0, waits until the turn is cancelled, then emits ``count - 1`` more events and
    returns (shielded, so it completes): lets a test follow from the first event deterministically."""
    count = int((turn.input or {}).get("count", 100))
    with anyio.CancelScope(shield=True):
        await turn.emit({"i": 0})
        await turn.signal.wait()
        for i in range(1, count):
            await turn.emit({"i": i})
    return {"events": count}


async def exit_first_run_only(turn: worker.Turn) -> str:
    """On its first run (no marker file yet) emits and kills its worker at once; a second run
    (which must never happen) would return "rerun"."""
    from pathlib import Path

    marker = Path(turn.input)
    if marker.exists():  # noqa: ASYNC240 - a tiny local marker file
        return "rerun"
    marker.write_text("ran")  # noqa: ASYNC240
    await turn.emit({"dying": True})
    os._exit(3)
