"""LADDER-PROOF: one page every process of a worker's tree maps, so that its absence can be proved in O(1).

The supervisor makes a memory file (``make``) for each zygote-forked worker and keeps its descriptor;
the worker maps it shared (``carry``), before it forks anything, and closes its descriptor. Every fork
of the worker, and every fork of those, inherits the mapping, and closing every descriptor does not
remove it. The kernel counts the shared writable mappings of the file (the descriptor is read-write,
so a mapping made read-only may still be made writable, and counts), and refuses ``F_SEAL_WRITE`` while
any exists. Once the worker is dead, ``unmapped`` - that seal - succeeds only if no process maps the
page any more: none of the forks of its tree is alive (an ``exec`` drops the mapping: the cgroup and the
process group speak for exec'd descendants; see ``supervisor/_engine/reaper.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os

_MAP: mmap.mmap | None = None  # the worker's mapping, for the life of the process


def make() -> int:
    """A fresh one-page memory file that can be sealed, close-on-exec; its descriptor, or -1 where
    there is no such file (no memfd: the proof is never claimed)."""
    try:
        fd = os.memfd_create("turnpool-proof", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError):
        return -1
    try:
        os.ftruncate(fd, mmap.PAGESIZE)
    except OSError:
        os.close(fd)
        return -1
    return fd


def carry(fd: int) -> None:
    """In the worker, before it forks anything: map the page for the life of the process (every fork
    inherits it) and close ``fd``. If it cannot be mapped, the file is sealed against any further
    seal, so the supervisor's ``unmapped`` fails and it looks for what the worker left instead."""
    global _MAP
    try:
        _MAP = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ)
    except OSError:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL)
    finally:
        os.close(fd)


def unmapped(fd: int) -> bool:
    """Whether no process maps the page of ``fd`` any more (the supervisor, after the worker exited).
    Seals the file against writes when so: nothing may map it again."""
    if fd < 0:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
    except OSError:  # EBUSY: a process still maps it; EPERM: sealed by a worker that could not map it
        return False
    return True
