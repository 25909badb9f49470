"""The start marker: a tiny shared file in which a worker notes the turn it is starting.

ZeroMQ sends are asynchronous: a frame queued just before the process dies (an agent that
calls ``os._exit`` at once, a segfault) can die with it, ``Started`` included. The marker is a
memory-mapped file, written before any agent code runs (a memory write, no syscall), so the
kernel keeps it whatever happens to the process next. When a worker dies, the supervisor
reads it to tell a turn that started (and crashed) from one that never did.

The supervisor also reads it while the worker lives (rule S1 in ``docs/design.md``): a turn
whose ``Started`` frame cannot leave (an agent that stopped its own worker with SIGSTOP, or that
holds the GIL in one C call from its first line) is still known to have started, and when: the
marker carries the ``CLOCK_MONOTONIC`` time of the start, which is the same clock in every
process of the machine (the supervisor's event loop runs on it).

Layout: a 4-byte little-endian length, the start time (8-byte little-endian double, seconds of
``time.monotonic()``), then the turn id in UTF-8. The length is zeroed first and written last, so
a torn write reads as "nothing started".
"""

from __future__ import annotations

import mmap
import os
import struct
import time

HEAD = 4 + 8  # length, start time
SIZE = HEAD + 1024  # turn ids are at most 256 characters
_len = struct.Struct("<I")
_at = struct.Struct("<d")


def path_for(endpoint: str, worker_id: str) -> str | None:
    """Beside the private worker endpoint (``ipc://DIR/workers.sock``), or None (not ipc)."""
    if not endpoint.startswith("ipc://"):
        return None
    return os.path.join(os.path.dirname(endpoint[len("ipc://") :]), f"{worker_id}.started")


class StartMarker:
    """The worker's side: ``mark(turn_id)`` before the agent runs."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)

    def prime(self) -> None:
        """Write "nothing started" (what a new file reads as anyway): the page is then this
        process's own and writable, so the first ``mark`` takes no page fault (W-WARM)."""
        self._map[0:4] = b"\0\0\0\0"

    def mark(self, turn_id: str) -> float:
        """Note ``turn_id`` as starting now; returns the start time noted (the End log records the
        same value with the turn's end: rule E1 tells a current end from a stale one by it)."""
        data = turn_id.encode()[: SIZE - HEAD]
        m = self._map
        now = time.monotonic()
        m[0:4] = b"\0\0\0\0"
        _at.pack_into(m, 4, now)  # precompiled: no format lookup, no bytes object per turn
        m[HEAD : HEAD + len(data)] = data
        _len.pack_into(m, 0, len(data))
        return now


def read_noted(path: str) -> tuple[str, float] | None:
    """The supervisor's side: the last turn the worker noted as starting and when
    (``time.monotonic()`` seconds), if any."""
    try:
        with open(path, "rb") as f:
            head = f.read(SIZE)
    except OSError:
        return None
    if len(head) < HEAD:
        return None
    (n,) = struct.unpack("<I", head[:4])
    if n == 0 or n > SIZE - HEAD or len(head) < HEAD + n:
        return None
    (at,) = struct.unpack("<d", head[4:HEAD])
    return head[HEAD : HEAD + n].decode(errors="replace"), at


def read(path: str) -> str | None:
    """The last turn the worker noted as starting, if any."""
    noted = read_noted(path)
    return noted[0] if noted is not None else None
