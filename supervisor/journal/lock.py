"""One live daemon per journal (JOURNAL-ONE-DAEMON): what "a daemon owns this journal" is made of.

Two locks, taken by ``Journal.open`` and held for the daemon's life, each inherited by the journal's
writer process (so no second daemon opens the journal while a stuck writer might still write to it):

* an **open-file-description lock** (``fcntl(F_OFD_SETLK)``) on one byte of the journal file itself.
  It belongs to the file's inode, not to a name, a mount or a namespace: a second daemon reaching the
  same file through another network namespace (a second container sharing the volume), a hard link, a
  symlink or a bind mount is refused. It is an OFD lock, not a classic POSIX record lock, because a
  process loses every POSIX lock it holds on a file as soon as it closes *any* descriptor of that file,
  and SQLite opens and closes the journal's descriptors in the daemon (its reader) and in the writer.
  The byte is far past the bytes SQLite locks (1 GiB to 1 GiB + 512), so the two never conflict. A
  filesystem that cannot lock (``ENOLCK``, ``EOPNOTSUPP``, ``EINVAL``: NFS without lock service, some
  FUSE filesystems, a kernel before 3.15) is refused with one line: nothing could keep a second daemon
  off such a journal.
* an **abstract unix socket** named from the journal's real path: nothing on disk, so a second daemon
  in the same network namespace is refused even after the journal file was deleted or replaced under
  the first (which notices at its next write and stops); its peer credentials name the holder's pid.

Both are released by the kernel when the daemon and its writer are gone, however they died (SIGKILL
included): the writer dies with the daemon (its parent-death signal), or as soon as a write stuck on
the disk returns. Workers never hold them: both are close-on-exec and workers are started by exec.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import socket
import stat
import struct
from pathlib import Path

from .schema import JournalError, JournalLocked

# JOURNAL-ONE-DAEMON: the byte locked in the journal file. SQLite's locks sit at 0x40000000 .. 0x40000000 +
# 512; this one is at 1 TiB, a range SQLite never locks (and a lock past the end of a file is allowed).
LOCK_OFFSET = 1 << 40
# ``struct flock`` on 64-bit Linux (64-bit ``off_t``): l_type, l_whence, l_start, l_len, l_pid (0 for
# OFD locks), padding.
_FLOCK = struct.Struct("hhqqi4x")
# What a filesystem (or kernel) that cannot take the lock answers.
_CANNOT_LOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


def lock_name(path: Path) -> bytes:
    """The abstract unix socket that stands for "a daemon owns this journal": named from the
    journal's real path, so it cannot be deleted from under the daemon like a lock file."""
    real = os.path.realpath(path)
    return b"\0turnpool-journal-" + hashlib.sha256(real.encode()).hexdigest()[:32].encode()


def _holder(path: Path) -> str:
    """The pid of the daemon holding ``path``'s lock socket (its peer credentials), or ``?``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(lock_name(path))
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return str(struct.unpack("3i", creds)[0])
    except OSError:
        return "?"
    finally:
        probe.close()


def _refused(path: Path, pid: str | None = None) -> JournalLocked:
    if pid is not None and pid != "?":
        return JournalLocked(f"journal {path} is locked by another live daemon (pid {pid})")
    return JournalLocked(
        f"journal {path} is locked by another live daemon (pid not visible from here: it runs in another "
        "container or network namespace, or uses the same file through another path)"
    )


def lock_socket(path: Path) -> socket.socket:
    """Bind ``path``'s abstract lock socket; ``JournalLocked`` (with the holder's pid) when a live
    daemon in this network namespace holds it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(lock_name(path))
    except OSError as exc:
        sock.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        raise _refused(path, _holder(path)) from None
    sock.listen(8)
    return sock


def lock_file(path: Path) -> int:
    """Open the journal file (created empty, 0600, when missing) and take its OFD write lock; the
    descriptor, to be kept open for the daemon's life. ``JournalLocked`` when another daemon holds
    it, ``JournalError`` when the filesystem cannot lock or the path is not a regular file."""
    not_a_file = JournalError(f"journal {path} is not a regular file (a directory, FIFO or device?)")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise not_a_file  # a device is not even opened
    except FileNotFoundError:
        pass  # made below
    try:
        # Without blocking: a FIFO given as the journal must not hang the start.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK, 0o600)
    except IsADirectoryError:
        raise not_a_file from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise not_a_file
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, LOCK_OFFSET, 1, 0))
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise _refused(path) from None
        if exc.errno in _CANNOT_LOCK:
            raise JournalError(
                f"journal {path}: its filesystem cannot lock files ({os.strerror(exc.errno)}), so nothing "
                "would keep a second daemon off it; put the journal on a local filesystem"
            ) from None
        raise
    return fd
