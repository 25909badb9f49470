"""LADDER-HEIR: a held turn, and the process whose end lets it start.

At the kill decision the supervisor hands the next queued turn to a warm spare together with the
doomed worker's identity (pid and start time). The spare holds the turn and starts it itself the
moment that process is gone - its pidfd becomes readable - without waiting for the supervisor to
see the exit, reap, and send a ``Run`` (each a thread woken on a loaded machine: the supervisor's
event loop, its ZeroMQ I/O thread, the spare's ZeroMQ I/O thread, then the spare's main thread).
The held ``Run`` arrives while the doomed worker is still being torn down (milliseconds), so at
the exit only the spare's main thread wakes, on its own pidfd. ``Proceed`` (sent by the
supervisor when it sees the exit) starts a held turn this process could not watch.
"""

from __future__ import annotations

import os

from .proctree._tree import start_time

start_ticks = start_time  # (the name ``worker.lowlevel`` gives it)


GONE = -1  # ``watch``: the process is already gone, the turn may start
UNWATCHABLE = -2  # ``watch``: no pidfd here; the turn waits for the supervisor's ``Proceed``


def watch(pid: int, start: int) -> int:
    """A pidfd that becomes readable when process ``pid`` (started at ``start``) has exited;
    ``GONE`` if it already has (no such pid, or the pid now names another process), or
    ``UNWATCHABLE`` if no pidfd can be opened for it (then only ``Proceed`` starts the turn).

    The pidfd is opened first and the start time read after: if that time is ``start``, the pid
    named this very process when the pidfd was opened (it existed before and still does), so the
    pidfd follows it; if it differs, the process was gone by the time of the read."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return GONE
    except (OSError, AttributeError):
        return UNWATCHABLE
    if start_ticks(pid) != start:
        os.close(fd)
        return GONE
    return fd
