"""The start marker: a tiny shared memory file in which a worker notes the turn it is starting.

ZeroMQ sends are asynchronous: a frame queued just before the process dies (an agent that
calls ``os._exit`` at once, a segfault) can die with it, ``Started`` included. The marker is a
memory-mapped file, written before any agent code runs (a memory write, no syscall), so the
kernel keeps it whatever happens to the process next. When a worker dies, the supervisor
reads it to tell a turn that started (and crashed) from one that never did.

The supervisor also reads it while the worker lives (rule LADDER-EARLY in ``docs/design.md``): a turn
whose ``Started`` frame cannot leave (an agent that stopped its own worker with SIGSTOP, or that
holds the GIL in one C call from its first line) is still known to have started, and when: the
marker carries the ``CLOCK_MONOTONIC`` time of the start, which is the same clock in every
process of the machine (the supervisor's event loop runs on it).

The file has no name (``worker/_ownfile.py``, rule SEC-WORKER-FILES): the supervisor creates it, keeps a
read-only mapping and hands the worker its descriptor, which the worker maps and closes.

Layout: a 4-byte little-endian length, the start time (8-byte little-endian double, seconds of
``time.monotonic()``), then the turn id in UTF-8. The length is zeroed first and written last, so
a torn write reads as "nothing started".
"""

from __future__ import annotations

import os
import struct
import time

from . import _ownfile

HEAD = 4 + 8  # length, start time
ID_MAX = 1024  # turn ids are at most 256 characters
TOKEN_AT = HEAD + ID_MAX  # the spawn token, for a worker started as a fresh interpreter (SEC-WORKER-FILES)
TOKEN_MAX = 64
SIZE = TOKEN_AT + TOKEN_MAX
_len = struct.Struct("<I")
_at = struct.Struct("<d")


class StartMarker:
    """The worker's side: ``mark(turn_id)`` before the agent runs."""

    def __init__(self, fd: int) -> None:
        """Map the marker the supervisor made (``fd``, of ``SIZE`` bytes); ``fd`` is closed."""
        self._map = _ownfile.take(fd, SIZE)

    def take_token(self) -> str:
        """The spawn token the supervisor left in the marker (empty if none), erased as it is read:
        unlike an environment variable it is not in ``/proc/<pid>/environ`` for anyone to read."""
        m = self._map
        raw = bytes(m[TOKEN_AT:SIZE]).split(b"\0", 1)[0]
        m[TOKEN_AT:SIZE] = bytes(TOKEN_MAX)
        return raw.decode(errors="replace")

    def prime(self) -> None:
        """Write "nothing started" (what a new file reads as anyway): the page is then this
        process's own and writable, so the first ``mark`` takes no page fault (WORKER-WARM)."""
        self._map[0:4] = b"\0\0\0\0"

    def mark(self, turn_id: str) -> float:
        """Note ``turn_id`` as starting now; returns the start time noted (the End log records the
        same value with the turn's end: rule WORKER-END-LOG tells a current end from a stale one by it)."""
        data = turn_id.encode()[:ID_MAX]
        m = self._map
        now = time.monotonic()
        m[0:4] = b"\0\0\0\0"
        _at.pack_into(m, 4, now)  # precompiled: no format lookup, no bytes object per turn
        m[HEAD : HEAD + len(data)] = data
        _len.pack_into(m, 0, len(data))
        return now


def give_token(fd: int, token: str) -> None:
    """The supervisor's side: leave ``token`` in the new marker ``fd`` for the worker to take."""
    data = token.encode()
    if len(data) >= TOKEN_MAX:
        raise ValueError("a spawn token is at most 63 bytes")
    os.pwrite(fd, data, TOKEN_AT)


def read_noted(view: memoryview | bytes) -> tuple[str, float] | None:
    """The supervisor's side, from its mapping of the marker: the last turn the worker noted as
    starting and when (``time.monotonic()`` seconds), if any."""
    try:
        head = bytes(view[:SIZE])
    except ValueError:  # a closed mapping
        return None
    if len(head) < HEAD:
        return None
    (n,) = struct.unpack("<I", head[:4])
    if n == 0 or n > ID_MAX or len(head) < HEAD + n:
        return None
    (at,) = struct.unpack("<d", head[4:HEAD])
    return head[HEAD : HEAD + n].decode(errors="replace"), at


def read(view: memoryview | bytes) -> str | None:
    """The last turn the worker noted as starting, if any."""
    noted = read_noted(view)
    return noted[0] if noted is not None else None
