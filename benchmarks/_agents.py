"""turnpool agents used only by the benchmarks (``benchmarks._agents:NAME``)."""

from __future__ import annotations

import os
import time

import anyio

import worker


async def stamp(turn: worker.Turn) -> float:
    """Returns ``time.monotonic()`` at its start: when this queued turn began running."""
    return time.monotonic()


async def spin(turn: worker.Turn) -> None:
    """Emits its pid and start time, then spins without ever awaiting: only a kill stops it."""
    await turn.emit({"pid": os.getpid(), "t": time.monotonic()})
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        pass


async def awaiting(turn: worker.Turn) -> None:
    """Emits, then awaits in a loop (1 ms sleeps): a cancel lands at the next await."""
    await turn.emit({"pid": os.getpid()})
    while True:  # noqa: ASYNC110 - awaiting in a loop is what this agent is for
        await anyio.sleep(0.001)


async def burst(turn: worker.Turn) -> int:
    """Emits ``n`` small events (``{"i": i}``) as fast as it can: the event-stream benchmark."""
    n = int(turn.input["n"])
    emit = turn.emit
    for i in range(n):
        await emit({"i": i})
    return n


async def flood(turn: worker.Turn) -> int:
    """Emits ``count`` small events as fast as ``emit`` allows (event-stream throughput)."""
    count = int((turn.input or {}).get("count", 1000))
    emit = turn.emit
    for i in range(count):
        await emit(i)
    return count


async def ticker(turn: worker.Turn) -> int:
    """Emits ``time.monotonic()`` ``rate`` times a second for ``seconds`` (emit → delivery latency);
    the clock is the machine's, so a follower in another process subtracts it from its own."""
    inp = turn.input or {}
    rate, seconds = float(inp.get("rate", 50)), float(inp.get("seconds", 2))
    period = 1.0 / rate
    n = int(rate * seconds)
    start = time.monotonic()
    for i in range(n):
        delay = start + i * period - time.monotonic()
        if delay > 0:
            await anyio.sleep(delay)
        await turn.emit(time.monotonic())
    return n


async def stubborn_timed(turn: worker.Turn) -> None:
    """Like ``examples.agents:stubborn`` (a CPU loop that ignores ``Abort``), and notes when the
    SIGTERM step reaches it: ``time.time()`` is written to ``input["path"]`` from the signal
    handler, before the worker's own handler kills the tree. For splitting a kill's overshoot."""
    import signal

    fd = os.open(turn.input["path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: object) -> None:
        os.write(fd, repr(time.time()).encode())
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_term)
    await turn.emit({"pid": os.getpid()})
    x = 0
    while True:
        x += 1


async def held_stamp(turn: worker.Turn) -> dict[str, float]:
    """Notes ``time.monotonic()`` and its pid at its start, then holds its worker ``hold`` seconds
    (default 0.5), so that N turns submitted at once to N idle workers run one on each: the scale
    curve's "first turn on every worker"."""
    t = time.monotonic()
    await anyio.sleep(float((turn.input or {}).get("hold", 0.5)))  # allowed: the turn's own work
    return {"pid": os.getpid(), "t": t}
