"""WORKER-SHORT-SLICE: the threads that hand a frame on, at a short EEVDF slice.

With hundreds of busy workers on a few CPUs, an event's time from the agent's ``emit`` to its
follower was almost all a ZeroMQ I/O thread waiting for a CPU after it was woken: the worker's,
handed the frame by its main thread, and the supervisor's, woken by the frame's arrival. Linux's
EEVDF scheduler (6.6 and later) lets a thread ask for a shorter slice (``sched_setattr``'s
``sched_runtime`` under ``SCHED_OTHER``, honoured since 6.12, clamped to 0.1-100 ms): its virtual
deadline comes sooner, so when it wakes it may preempt the thread running there, and a group
(an autogroup) takes the shortest slice of what it holds. Only when it runs changes, not how much:
its weight (and the worker's niceness, WORKER-CPU-SHARE) stays.

Best effort: no privilege is needed for a thread of one's own process; a kernel before 6.12 takes
the call and ignores the runtime, one without ``sched_setattr`` (or a seccomp filter) refuses it,
and then nothing changes and nothing fails.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SLICE_NS = 100_000  # the shortest the kernel takes (0.1 ms); the default is 0.75-3 ms
_ATTR = struct.Struct("IIQiIQQQII")  # struct sched_attr, SCHED_ATTR_SIZE_VER1 (56 bytes)
_RUNTIME = 5  # its field sched_runtime
_SCHED_OTHER = 0

Syscall = Callable[..., int]  # libc's ``syscall(2)``: a number, then its arguments; -1 and errno when refused
NUMBERS = {"x86_64": (314, 315), "aarch64": (274, 275)}  # (sched_setattr, sched_getattr)
_libc: ctypes.CDLL | None = None


def _kernel() -> Syscall:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.syscall


def slice_of(tid: int, call: Syscall | None = None) -> int | None:
    """Thread ``tid``'s slice in ns (``sched_getattr``; 0: the calling thread), or None where it cannot be
    read. ``call``: the ``syscall`` to use (a test's fake; the kernel's by default)."""
    numbers = NUMBERS.get(os.uname().machine)
    if numbers is None:
        return None
    buf = ctypes.create_string_buffer(_ATTR.size)
    if (call or _kernel())(numbers[1], tid, buf, _ATTR.size, 0) != 0:
        return None
    attr = _ATTR.unpack(buf.raw)
    return int(attr[_RUNTIME]) if attr[1] == _SCHED_OTHER else None


def set_slice(tid: int, ns: int = SLICE_NS, call: Syscall | None = None) -> int:
    """Ask for a ``ns`` slice for thread ``tid`` (0: the calling thread), its policy, niceness and flags
    kept: 0 when the kernel took it, else the errno (ENOSYS where this machine's call is unknown); nothing
    changed either way."""
    numbers = NUMBERS.get(os.uname().machine)
    if numbers is None:
        return errno.ENOSYS
    call = call or _kernel()
    buf = ctypes.create_string_buffer(_ATTR.size)
    if call(numbers[1], tid, buf, _ATTR.size, 0) != 0:
        return ctypes.get_errno() or errno.EIO
    attr = list(_ATTR.unpack(buf.raw))
    if attr[1] != _SCHED_OTHER:
        return errno.EINVAL  # a real-time, batch or idle thread: not ours to touch
    attr[0], attr[_RUNTIME] = _ATTR.size, ns
    if call(numbers[0], tid, ctypes.create_string_buffer(_ATTR.pack(*attr), _ATTR.size), 0) != 0:
        return ctypes.get_errno() or errno.EIO
    return 0


def _tids() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


@contextmanager
def new_threads_short(ns: int = SLICE_NS, call: Syscall | None = None) -> Iterator[list[int]]:
    """The threads this process starts within the block (a ZeroMQ context's I/O and reaper threads,
    started by its first socket) get a ``ns`` slice; the list holds those the kernel took."""
    before = _tids()
    done: list[int] = []
    yield done
    done.extend(tid for tid in sorted(_tids() - before) if set_slice(tid, ns, call) == 0)
