"""Plain functions the peers run (importable by reference, so every pool can pickle them)."""

from __future__ import annotations

import os
import time


def noop() -> None:
    """The cheapest task: the peers' twin of ``examples.agents:noop``."""
    return None


def stamp() -> float:
    """Returns ``time.monotonic()`` at its start (CLOCK_MONOTONIC is system-wide on Linux, so
    the caller can compare it with its own clock): when the next queued task began running."""
    return time.monotonic()


def spin(seconds: float = 3600.0) -> None:
    """A CPU loop that never yields: only a kill stops it early."""
    deadline = time.monotonic() + seconds
    x = 0
    while time.monotonic() < deadline:
        x += 1


def sleepy(seconds: float = 3600.0) -> None:
    """Sleeps in 1 ms steps: a Python-level interrupt (Ray's ``force=False``) can land between them."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.001)


def sleepy_started(path: str, seconds: float = 3600.0) -> None:
    """``sleepy`` that first writes ``path``: the caller cancels a task known to be running (a
    task cancelled while still pending ends at once without having run, which is not the case
    being measured)."""
    with open(path + ".tmp", "w") as f:
        f.write("started")
    os.replace(path + ".tmp", path)
    sleepy(seconds)


def spin_report(path: str, seconds: float = 3600.0) -> None:
    """Writes ``"<pid> <monotonic start>"`` to ``path``, then spins without yielding."""
    import os

    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {time.monotonic()}")
    os.replace(path + ".tmp", path)
    spin(seconds)


def held_stamp(hold: float = 0.5) -> tuple[int, float]:
    """The peers' twin of ``benchmarks._agents:held_stamp``: ``(pid, monotonic at start)``, then
    holds the process ``hold`` seconds so N tasks submitted at once to N processes run one on each."""
    t = time.monotonic()
    time.sleep(hold)
    return os.getpid(), t
