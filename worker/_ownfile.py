"""A worker's own shared memory: the start marker and the End log live in memory files that have
no name in any directory, so no other process can open them by a path.

The supervisor creates each one (``create``: a ``memfd``), maps it read-only for itself, and hands
the descriptor to the worker it starts (inherited at a fixed number, or passed over the zygote's
socket). The worker maps it and closes the descriptor before any agent code runs (``take``). From
then on the pages exist only as two mappings: the worker's (writable) and the supervisor's
(read-only). Another worker's agent running as the same user finds no file to open in any
directory and no descriptor to open under ``/proc/<pid>/fd`` (rule SEC-WORKER-FILES in ``docs/design.md``);
what is left to it is another process's memory itself (``/proc/<pid>/mem``, ``map_files``,
``ptrace``), which the kernel grants only to root or to a process allowed to trace the other
(see "The trust boundary" in ``docs/guarantees.md``).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile

# Python's ``mmap.mmap(fd, ...)`` keeps a duplicate of ``fd`` open for as long as the map lives
# (3.13 added ``trackfd=False``): that duplicate would be one more way in through
# ``/proc/<pid>/fd``. The mapping is made with libc's ``mmap`` instead, which keeps none.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_int = ctypes.c_int
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, _int, _int, _int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def create(name: str, size: int) -> int:
    """A new zero-filled memory file of ``size`` bytes, close-on-exec; its descriptor."""
    try:
        fd = os.memfd_create(f"turnpool-{name}", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        # No memfd (an old kernel, a seccomp filter): an unnamed temporary file (O_TMPFILE or
        # unlinked at once): it has no name either.
        with tempfile.TemporaryFile() as f:
            fd = os.dup(f.fileno())
    try:
        os.ftruncate(fd, size)
        # Mode 0: the descriptors handed out are the only way in. A process of the same user that
        # is not allowed to trace the holder cannot open it again through ``/proc/<pid>/fd/<n>``
        # (that open checks the file's mode), even in the moments a descriptor is still open.
        os.fchmod(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


class Mapping:
    """A shared mapping of ``size`` bytes of ``fd`` that holds no descriptor; ``buf`` is its memory
    (a read-only view unless ``writable``). After ``close()`` nothing may touch a ``buf`` taken
    before: readers copy what they read (``bytes(buf[a:b])``)."""

    __slots__ = ("_addr", "_size", "buf")

    def __init__(self, fd: int, size: int, *, writable: bool) -> None:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        addr = _libc.mmap(None, size, prot, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of a worker's own file failed: {os.strerror(err)}")
        self._addr: int | None = addr
        self._size = size
        view = memoryview((ctypes.c_char * size).from_address(addr)).cast("B")
        self.buf = view if writable else view.toreadonly()

    def close(self) -> None:
        addr, self._addr = self._addr, None
        if addr is not None:
            self.buf.release()
            _libc.munmap(addr, self._size)


def view(fd: int, size: int) -> Mapping:
    """The supervisor's read-only mapping of ``fd`` (which stays open: the caller closes it)."""
    return Mapping(fd, size, writable=False)


def take(fd: int, size: int) -> memoryview:
    """The worker's writable mapping of ``fd``, for the life of the process; the descriptor is
    closed, so nothing of the worker's can be opened to reach the pages."""
    try:
        return Mapping(fd, size, writable=True).buf
    finally:
        os.close(fd)
