"""Giving freed heap back to the system (MEM-TRIM).

glibc's ``malloc`` keeps what a process frees: a turn that built 300 MiB of objects and dropped
them leaves its worker resident at 300 MiB (measured: 326 MiB after ``del``), and a daemon that
relayed an event flood to stopped followers stays at its peak (+258 MiB in CI) with 8 MiB of it
in use. Python's own small-object arenas go back when empty; this is about the rest: bytes, frames,
buffers and ZeroMQ's messages, all ``malloc``'d. ``malloc_trim(0)`` hands back every free page of
every arena (measured: 202 → 72 MiB in 16 ms, 0.2 ms when there is nothing to hand back).

``HeapKeeper.due`` says when a trim is worth it: what is resident but not in use by ``malloc``
(the resident set less malloc's in-use bytes: code, Python's arenas, and malloc's free pages not yet
handed back) rose by ``TRIM_SLACK`` above its lowest since the last trim. What is in use (a cache,
kept results) never trims; once it is freed, it does. Counting malloc's free bytes instead misses
memory reused and freed again between two looks (its free total ends where it was). The readings
are ``/proc/self/statm`` and ``mallinfo2`` (≈ 0.1 ms: it walks malloc's free lists). Without glibc
2.33's ``mallinfo2`` (musl, older glibc) nothing is trimmed and ``due`` is always False.
"""

from __future__ import annotations

import ctypes
import os

# A trim is worth it once this much more is resident and unused than at its lowest since the last.
TRIM_SLACK = 16 * 2**20

_PAGE = os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _load() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        libc.mallinfo2.argtypes = []
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):  # not glibc, or a glibc older than 2.33
        return None
    return libc


_LIBC = _load()


def resident_bytes() -> int:
    """This process's resident set size, from ``/proc/self/statm`` (0 if unreadable)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def unused_resident_bytes() -> int:
    """Resident bytes that ``malloc`` does not hold in use (its in-use arena and mmap'd bytes taken
    from the resident set); 0 without glibc."""
    if _LIBC is None:
        return 0
    info = _LIBC.mallinfo2()
    return resident_bytes() - int(info.uordblks) - int(info.hblkhd)


def trim() -> None:
    """Hand every free page of ``malloc``'s arenas back to the system (``malloc_trim(0)``).
    Releases the GIL while it runs (ctypes does for every foreign call)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class HeapKeeper:
    """When to trim (see the module docstring): ``due()`` after the process may have freed a lot,
    then ``trim()`` and ``trimmed()`` (or ``trim_now()``, which does both)."""

    __slots__ = ("low", "slack", "trims")

    def __init__(self, slack: int = TRIM_SLACK) -> None:
        self.slack = slack
        self.low = unused_resident_bytes()
        self.trims = 0

    def due(self) -> bool:
        if _LIBC is None:
            return False
        unused = unused_resident_bytes()
        if unused < self.low:
            self.low = unused
            return False
        return unused - self.low >= self.slack

    def trimmed(self) -> None:
        """A trim just ran: what is resident and unused now is the new low."""
        self.trims += 1
        self.low = unused_resident_bytes()

    def trim_now(self) -> None:
        trim()
        self.trimmed()
