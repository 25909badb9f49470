"""Where workers' stdout and stderr go: never onto the supervisor's own stderr (WORKER-OUTPUT).

A process that shares a pipe as stderr blocks in ``write`` when nobody reads that pipe; an
event loop that then logs stops, and with it deadlines, status and signal handling. So every
worker (and the zygote) gets a pipe of its own as fd 1 and fd 2. One *output pump* thread drains
all those pipes off the event loop and writes what it reads, each line prefixed with the
worker's id and pid, either

* to a log file rotated by size (``RotatingLog``: ``PATH``, ``PATH.1`` … ``PATH.<backups>``;
  at most ``(backups + 1) × max_bytes`` on disk, the oldest output dropped first), or
* to this process's stderr (the embedded default: prints of agents still show on a script's
  terminal), never filling a stderr pipe nobody reads (``_StderrSink`` drops and counts what
  does not fit), so the supervisor's own log lines still get through.

``"inherit"`` (workers share this process's fd 2 as today's embedded scripts may want, e.g.
to keep a terminal's colours) and ``None`` (``/dev/null``) skip the pump.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import selectors
import socket
import stat
import struct
import termios
import threading
import time
from pathlib import Path
from typing import Any

INHERIT = "inherit"
STDERR = "stderr"
MAX_BYTES = 16 * 2**20  # per log file before it is rotated
BACKUPS = 3  # rotated files kept: PATH.1 (newest) … PATH.3
LINE_MAX = 64 * 1024  # a partial line longer than this is written out without waiting for its end
READ_SIZE = 64 * 1024
DRAIN_MAX = 8 * 2**20  # read at most this much more per pipe at close (an escaped writer never holds it)


def check_worker_output(value: Any) -> str | Path | None:
    """Validate ``Supervisor(worker_output=...)``: ``"stderr"``, ``"inherit"``, ``None`` or a file path."""
    if value is None:
        return None
    if value in (STDERR, INHERIT):
        return str(value)
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        path = Path(value)
        if not str(value) or path.is_dir():
            raise ValueError(
                f"worker_output must be a log file path (not a directory), 'stderr', 'inherit' "
                f"or None, got {value!r}"
            )
        return path.absolute()
    raise TypeError(f"worker_output must be a log file path, 'stderr', 'inherit' or None, got {value!r}")


class RotatingLog:
    """An append-only log file rotated by size; written by the pump thread only.

    A write the file cannot take (a full disk, an I/O error) loses that output, never the pump:
    what was lost is counted in ``dropped`` (bytes) and ``dropped_lines``."""

    def __init__(self, path: Path, *, max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.dropped = 0
        self.dropped_lines = 0
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                if self._fd < 0:  # a reopen after a rotation failed: try again
                    self._fd = self._open()
                    self._size = os.fstat(self._fd).st_size
                room = max(self.max_bytes - self._size, 0)
                if room == 0:
                    self._rotate()
                    continue
                n = os.write(self._fd, view[:room])
                self._size += n
                view = view[n:]
        except OSError:
            # R-OUT-LOST: ENOSPC, EIO, EFBIG...: the rest of this write is lost, and counted.
            self.dropped += len(view)
            self.dropped_lines += bytes(view).count(b"\n")

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = -1  # never write to a closed (maybe reused) descriptor number
        try:
            for i in range(self.backups - 1, 0, -1):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(f"{self.path}.{i}", f"{self.path}.{i + 1}")
            with contextlib.suppress(FileNotFoundError):
                if self.backups > 0:
                    os.replace(self.path, f"{self.path}.1")
                else:
                    os.unlink(self.path)
        finally:
            # Reopened whatever happened, truncated if the rename failed: the bound holds either way.
            self._fd = os.open(
                self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_TRUNC, 0o600
            )
            self._size = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _StderrSink:
    """Forwards to this process's stderr without ever filling a pipe that nobody reads.

    On a pipe it writes through a second, non-blocking open of the same pipe (``/proc/self/fd/2``:
    the host's own fd 2 stays blocking) and only while the pipe is less than half full, so the
    host's own writes to stderr still find room; on a socket it sends with ``MSG_DONTWAIT``. What
    does not fit is dropped and counted (``dropped``). A terminal or a file is written as is.
    """

    def __init__(self) -> None:
        self.dropped = 0
        self.dropped_lines = 0
        self._sock: socket.socket | None = None
        self._fd = -1
        self._pipe_size = 0
        mode = os.fstat(2).st_mode
        if stat.S_ISSOCK(mode):
            self._sock = socket.socket(fileno=os.dup(2))
        elif stat.S_ISFIFO(mode):
            try:
                self._fd = os.open("/proc/self/fd/2", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                self._pipe_size = fcntl.fcntl(self._fd, fcntl.F_GETPIPE_SZ)
            except OSError:
                self._fd = -1
        if self._fd < 0 and self._sock is None:
            self._fd = os.dup(2)
            os.set_inheritable(self._fd, False)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            if self._sock is not None:
                view = view[self._sock.send(data, socket.MSG_DONTWAIT) :]
                if view:
                    raise BlockingIOError
                return
            if self._pipe_size:
                unread = struct.unpack("i", fcntl.ioctl(self._fd, termios.FIONREAD, b"\0\0\0\0"))[0]
                if unread + len(data) > self._pipe_size // 2:
                    raise BlockingIOError
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError:
            # Full (BlockingIOError), closed or broken: the output is lost, never the pump.
            self.dropped += len(view)
            self.dropped_lines += bytes(view).count(b"\n")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        elif self._fd >= 0:
            os.close(self._fd)
        self._fd = -1


class _Stream:
    __slots__ = ("key", "label", "pending")

    def __init__(self, key: str) -> None:
        self.key = key
        self.label = key.encode(errors="replace")
        self.pending = b""


class WorkerOutput:
    """The workers' output streams of one supervisor; ``open(label)`` gives a worker its fd.

    The fd returned belongs to the caller, who passes it to the worker (as fds 1 and 2) and then
    closes it. The pump thread starts with the first stream and is stopped by ``close()``, which
    first drains what the (by then reaped) workers left in their pipes.
    """

    def __init__(
        self, target: str | Path | None, *, max_bytes: int = MAX_BYTES, backups: int = BACKUPS
    ) -> None:
        self.target = target
        self._max_bytes = max_bytes
        self._backups = backups
        self._sink: RotatingLog | _StderrSink | None = None
        self._sel: selectors.DefaultSelector | None = None
        self._wake_r = self._wake_w = -1
        self._lock = threading.Lock()
        self._adds: list[tuple[int, _Stream]] = []
        self._labels: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False

    @property
    def dropped(self) -> int:
        """Bytes of output lost: a stderr nobody reads could not take them, or the log file
        could not (a full disk, an I/O error)."""
        return self._sink.dropped if self._sink is not None else 0

    @property
    def dropped_lines(self) -> int:
        """Lines of output lost (the newlines among the ``dropped`` bytes)."""
        return self._sink.dropped_lines if self._sink is not None else 0

    def open(self, label: str) -> int:
        """A new write fd (close-on-exec) for one worker, labelled in the log as ``label``."""
        if self.target is None:
            return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        if self.target == INHERIT:
            return os.dup(2)
        self.start()
        r, w = os.pipe()
        os.set_blocking(r, False)
        stream = _Stream(label)
        with self._lock:
            self._adds.append((r, stream))
            self._labels[label] = stream
        self._wake()
        return w

    def name(self, label: str, pid: int) -> None:
        """Once a worker's pid is known, its lines read ``<label>[<pid>]`` (what ``status`` and
        ``TurnResult.worker_pid`` show)."""
        with self._lock:
            stream = self._labels.pop(label, None)
        if stream is not None:
            stream.label = f"{label}[{pid}]".encode(errors="replace")

    def start(self) -> None:
        """Open the target and start the pump (once). Raises ``OSError`` naming a log file that
        cannot be written, before any worker exists."""
        if self._thread is not None or self.target is None or self.target == INHERIT:
            return
        if isinstance(self.target, Path):
            try:
                self._sink = RotatingLog(self.target, max_bytes=self._max_bytes, backups=self._backups)
            except OSError as exc:
                raise OSError(
                    exc.errno, f"cannot write the workers' output log {self.target}: {exc.strerror}"
                ) from exc
        else:
            self._sink = _StderrSink()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="turnpool-worker-output", daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def close(self, timeout: float = 5.0) -> None:
        """Drain what is left in the pipes (bounded by ``timeout``), stop the thread, close the log."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            assert self._sel is not None
            self._sel.close()
            if self._sink is not None:
                self._sink.close()
        self._thread = None

    # ---- the pump thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # a bug here must cost output, never the supervisor
            logging.getLogger("turnpool.supervisor").exception("the workers' output pump stopped")

    def _loop(self) -> None:
        assert self._sel is not None
        sel = self._sel
        while True:
            with self._lock:
                adds, self._adds = self._adds, []
            for fd, stream in adds:
                sel.register(fd, selectors.EVENT_READ, stream)
            if self._stopping:
                self._drain_all()
                return
            for key, _ in sel.select():
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                self._pump(key.fd, key.data)

    def _pump(self, fd: int, stream: _Stream) -> bool:
        """Read once from ``fd``; False once it is closed (EOF, every writer gone) or empty."""
        try:
            chunk = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            if stream.pending:
                self._emit(stream, stream.pending + b"\n")
                stream.pending = b""
            assert self._sel is not None
            self._sel.unregister(fd)
            os.close(fd)
            with self._lock:
                if self._labels.get(stream.key) is stream:
                    del self._labels[stream.key]  # a worker that died before its pid was known
            return False
        data = stream.pending + chunk
        cut = data.rfind(b"\n") + 1
        if cut:
            self._emit(stream, data[:cut])
            stream.pending = data[cut:]
        else:
            stream.pending = data
        if len(stream.pending) > LINE_MAX:
            self._emit(stream, stream.pending + b"\n")
            stream.pending = b""
        return True

    def _emit(self, stream: _Stream, lines: bytes) -> None:
        """Write complete lines, each prefixed ``<time> <label>: ``."""
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S ").encode() + stream.label + b": "
        body = prefix + lines[:-1].replace(b"\n", b"\n" + prefix) + b"\n"
        assert self._sink is not None
        self._sink.write(body)  # never raises: what it cannot write it counts as dropped

    def _drain_all(self) -> None:
        """At close: read what every pipe still holds; a pipe some escaped process keeps open for
        writing is read until it is empty, then closed."""
        assert self._sel is not None
        for key in list(self._sel.get_map().values()):
            if key.data is None:
                continue
            budget = DRAIN_MAX // READ_SIZE
            while budget and self._pump(key.fd, key.data):
                budget -= 1
            if key.fd in self._sel.get_map():
                stream = key.data
                if stream.pending:
                    self._emit(stream, stream.pending + b"\n")
                    stream.pending = b""
                self._sel.unregister(key.fd)
                os.close(key.fd)
