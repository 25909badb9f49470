"""The stale-batch flusher: frames a stuck turn queued still leave the worker (rule S1).

The worker batches what it sends per event-loop iteration (``Connection.post``): a quick turn's
``Started`` and ``End`` share one frame, and turns handed ahead run back to back in one
iteration. An async agent that blocks before its first ``await`` (a CPU loop, ``time.sleep``, an
import that blocks) never gives the loop back, so that batch - its own ``Started``, and the
``End`` of the turns before it - would never leave. This thread notices a batch that has waited a
whole tick and sends it itself (ZeroMQ's own I/O thread then writes it without the GIL).

It costs nothing per turn while turns keep the loop turning (one check per tick, 5 ms), and it
sleeps for good once the worker has been idle for a second (the next turn then wakes it: a
thread woken per turn cost ≈ 20 µs of latency per turn, measured). A turn that holds the GIL in
one C call from its first line, or that stops its worker with SIGSTOP, starves this thread too:
the supervisor then reads the start marker instead (``worker/_marker.py``).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

TICK = 0.005  # seconds a batch may wait before this thread sends it
IDLE_TICKS = 200  # idle ticks in a row (1 s) before it sleeps until the next turn


class StaleFlusher:
    def __init__(self, conn: Any, blocked: set[int]) -> None:
        self._conn = conn
        self._blocked = blocked  # signals the main thread must get (docs/design.md P4)
        self._wake = threading.Event()
        self.idle = False  # sleeping until ``poke``: the worker had nothing to send and no turn
        self.busy = False  # a turn is running (set by the worker loop)

    def start(self) -> None:
        threading.Thread(target=self._run, name="stale-flusher", daemon=True).start()

    def poke(self) -> None:
        """A turn starts while this thread sleeps: watch again."""
        self._wake.set()

    def _run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, self._blocked)
        conn = self._conn
        seen = -1
        idle_ticks = 0
        while True:
            if self.busy or conn._out:
                idle_ticks = 0
            elif idle_ticks < IDLE_TICKS:
                idle_ticks += 1
            else:
                idle_ticks = 0
                self._wake.clear()
                self.idle = True
                # Checked again after ``idle`` is set: a turn that started meanwhile either saw
                # ``idle`` (and pokes) or is seen here.
                if not self.busy and not conn._out:
                    self._wake.wait()
                self.idle = False
                seen = -1
                continue
            time.sleep(TICK)
            batch = conn.batches
            if batch == seen and conn._out:
                conn.flush_stale(batch)
            seen = batch
