"""The worker's one helper thread: the stale-batch flusher (rule LADDER-EARLY) and the life-pipe watcher.

The worker batches what it sends per event-loop iteration (``Connection.post``): a quick turn's
``Started`` and ``End`` share one frame, and turns handed ahead run back to back in one
iteration. An async agent that blocks before its first ``await`` (a CPU loop, ``time.sleep``, an
import that blocks) never gives the loop back, so that batch - its own ``Started``, and the
``End`` of the turns before it - would never leave. This thread notices a batch that has waited a
whole tick and sends it itself (ZeroMQ's own I/O thread then writes it without the GIL).

It costs nothing per turn while turns keep the loop turning (one check per tick, 5 ms), and it
ticks only while batches are being posted (WORKER-PARK): after ``PARK_TICKS`` ticks (50 ms) in which no
batch began and none waits, it parks (sleeps without a timeout) and the next ``Connection.post`` that
begins a batch wakes it through a pipe. A turn that waits between its events - a model streaming
deltas, the common case - posts no batch at all (``emit`` sends at once), so its worker's thread
sleeps instead of waking 200 times a second: with 200 such turns that was 40,000 thread wake-ups
a second on two cores, and the supervisor delivering their events waited for the CPUs behind them.
A burst of quick turns keeps posting, so the thread keeps ticking and costs the burst no wake-up.
A turn that holds the GIL in one C call from its first line, or that stops its worker with
SIGSTOP, starves this thread too: the supervisor then reads the start marker instead
(``worker/_marker.py``).

WORKER-ONE-THREAD: the same thread watches the life pipe (EOF: the supervisor is gone), in the same
``poll`` that times its ticks. One thread fewer than a watcher of its own: a killed worker's exit
must wake and end every thread of the process before its pidfd is readable, and each costs a
scheduling round on a loaded machine (docs/design.md, WORKER-ONE-THREAD).
"""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Callable
from typing import Any

TICK = 0.005  # seconds a batch may wait before this thread sends it
PARK_TICKS = 10  # WORKER-PARK: quiet ticks in a row (50 ms: no batch begun, none waiting) before it parks
THREAD_NAME = "worker-watcher"  # never forks: the end-of-turn sweep skips it (``_sweep``)


class StaleFlusher:
    """Started before the turn loop exists (``attach`` gives it the connection later), so the
    life pipe is watched from the moment the process guards are in place."""

    def __init__(
        self,
        blocked: set[int],
        *,
        life_fd: int | None = None,
        on_life_lost: Callable[[], None] | None = None,
    ) -> None:
        self._conn: Any = None
        self._blocked = blocked  # signals the main thread must get (docs/design.md WORKER-SIGNALS)
        self._life_fd = life_fd
        self._on_life_lost = on_life_lost
        self._wake_r, self._wake_w = os.pipe()  # not inheritable: agents' children never see it
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # WORKER-PARK: sleeping until ``poke``: no batch began for a few ticks and none waits. The
        # worker's ``Connection.post`` pokes when it begins a batch and sees this set.
        self.parked = False

    def start(self) -> None:
        threading.Thread(target=self._run, name=THREAD_NAME, daemon=True).start()

    def attach(self, conn: Any) -> None:
        """The turn loop's connection exists: watch its batches from now on."""
        self._conn = conn
        self.poke()

    def poke(self) -> None:
        """A turn starts while this thread sleeps: watch again."""
        try:  # noqa: SIM105 - once per batch: suppress() would add a context manager
            os.write(self._wake_w, b"x")
        except BlockingIOError:  # the pipe is full: a wake-up is pending anyway
            pass

    def _life_lost(self) -> bool:
        """The life pipe is readable: EOF (or an error) means the supervisor is gone."""
        assert self._life_fd is not None
        try:
            data = os.read(self._life_fd, 1)
        except InterruptedError:
            return False
        except OSError:
            return True
        return not data

    def _run(self) -> None:
        # Leave SIGTERM and the parent-death signal to the main thread, where Python runs the
        # handler. Delivered here, an interrupted poll's EINTR retry needs the GIL that a busy
        # agent holds: the handler then started one switch interval (5 ms) late (WORKER-SIGNALS).
        signal.pthread_sigmask(signal.SIG_BLOCK, self._blocked)
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        if self._life_fd is not None:
            poller.register(self._life_fd, select.POLLIN)
        tick_ms = int(TICK * 1000)
        seen = -1  # the batch number seen at the last tick
        quiet = 0  # ticks in a row with no batch begun and none waiting
        while True:
            conn = self._conn
            timeout: int | None = tick_ms
            if conn is None:
                timeout = None
            elif quiet >= PARK_TICKS:
                quiet = 0
                self.parked = True
                # Checked again after ``parked`` is set: a batch begun meanwhile is either seen
                # here or its ``post`` saw ``parked`` and pokes (the byte waits in the pipe).
                if conn._out:
                    self.parked = False
                else:
                    timeout = None
            for fd, _ in poller.poll(timeout):
                if fd == self._wake_r:
                    try:
                        while os.read(self._wake_r, 64):
                            pass
                    except BlockingIOError:
                        pass
                elif self._life_lost():
                    if self._on_life_lost is not None:
                        self._on_life_lost()  # kills the tree and exits (or another thread does)
                    return
            if timeout is None:
                self.parked = False
                seen = -1
                continue
            if conn is None:
                continue
            batch = conn.batches
            if batch == seen and conn._out:
                conn.flush_stale(batch)
            quiet = quiet + 1 if batch == seen and not conn._out else 0
            seen = batch
