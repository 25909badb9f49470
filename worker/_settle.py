"""WORKER-SETTLE: the zygote runs the worker's own paths before it forks any worker, so that their code
is specialised once, in the zygote, instead of in every worker.

A forked worker pays for every page it writes (copy-on-write), and Python 3.11 writes to code it runs
for the first times: a function's warm-up counter, then its specialised instructions and their
inline caches (in the code object), the type attribute cache (in the interpreter's own data), the
ctypes types it makes. Run ``WARM_ROUNDS`` times in the zygote, an event loop made, run and closed,
a task group with timers, and the warm-up turn (WORKER-WARM) through a stub connection, leave that
code specialised and those caches full; each worker forked after it writes less of the zygote's
pages. Measured: a fork of the zygote running these paths writes 2.74 → 2.2 MiB (one round 2.52, 8
rounds 2.24, 20 rounds 2.22: ten are enough, ≈ 25 ms of the zygote's start); 64 idle workers after a
first turn each, 5.89 → 5.52 MiB of PSS per worker (the pool's processes: 6.08 → 5.67).

Nothing here starts a thread, creates a ZeroMQ context or keeps a descriptor: the zygote stays safe
to fork.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

WARM_ROUNDS = 10


class _Edge:
    attached = False


class _StubConnection:
    """What the warm-up turn (``WorkerLoop.warm_up``) uses of a ``Connection``, with no socket."""

    def __init__(self) -> None:
        self.frames = 0
        self.flusher = None
        self.edge = _Edge()
        self.sent: list[Any] = []

    def post(self, msg: Any) -> None:
        self.sent.append(msg)

    def flush(self) -> None:
        self.sent.clear()


async def _tick() -> None:
    import anyio
    import anyio.lowlevel

    await anyio.lowlevel.checkpoint()
    await anyio.sleep(0.0001)  # a timer, as a turn's or the heartbeats' sleep


async def run_paths() -> None:
    """One run of the worker's own paths, with no socket and no thread."""
    import anyio

    from wire import worker_link

    from . import _loop

    loop = _loop.WorkerLoop(_StubConnection())  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(_tick)
        tg.start_soon(_tick)
        await loop.warm_up()
    worker_link.encode_frame([worker_link.Heartbeat(0)])


def warm(rounds: int = WARM_ROUNDS) -> None:
    """Run the worker's paths ``rounds`` times (see the module docstring)."""
    import anyio

    from . import _endlog, _loop, _marker

    for size in (_marker.SIZE, _endlog.SIZE):
        ctypes.c_char * size  # ctypes caches the type: the workers find it made
    try:
        for _ in range(rounds):
            anyio.run(run_paths, backend="asyncio")
    except Exception as exc:  # noqa: BLE001 - only a saving: the workers pay the memory, nothing else
        print(f"turnpool zygote: warming the worker's paths failed: {exc!r}", file=sys.stderr)
    _loop.forget_warm_up()
