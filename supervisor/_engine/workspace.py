"""What the engine keeps from agents, and what it gives each worker of its own.

* SEC-WORKER-FILES: each worker's start marker and End log are memory files with no name
  (``worker/_ownfile``). ``WorkerFiles`` creates them, keeps a read-only mapping of each and hands the
  descriptors to the worker, which maps and closes them: no other worker's agent can open them by a path or a
  descriptor, so none can write an end of its own making into another worker's log.
* WORKER-CWD: agents never run in a directory of the engine's. Each worker runs in a directory of its
  own, ``<runtime dir>/work-<pid>-<random>/<worker id>`` (mode 0700), made empty when it starts
  and removed once it is reaped; the engine's private directory (``sup-<pid>-<random>``, the
  worker endpoint) is nobody's working directory. An agent that empties its cwd empties its own.
* WORKER-REBIND: the engine's private directory and its ``workers.sock`` are checked before each worker
  start (one ``lstat``); deleted (a temp cleaner, an agent that found them), they are made again and
  the endpoint bound anew, beside the old binding, so the workers already connected stay connected.
  Where that is impossible the start fails with the reason in ``status()["last_start_error"]``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from pathlib import Path

from wire.worker_link import End
from worker import lowlevel, proctree

log = logging.getLogger("turnpool.supervisor")


class WorkerFiles:
    """One worker's start marker and End log (SEC-WORKER-FILES): the descriptors to hand over, and the
    supervisor's read-only mappings, which stay readable after the worker died."""

    __slots__ = ("endlog", "endlog_fd", "marker", "marker_fd", "proof_fd")

    def __init__(self, worker_id: str, token: str) -> None:
        self.marker_fd = self.endlog_fd = -1
        # LADDER-PROOF: the page every fork of the worker maps; ours to seal once the worker is dead.
        self.proof_fd = -1
        self.marker: lowlevel.OwnFileView | None = None
        self.endlog: lowlevel.OwnFileView | None = None
        try:
            self.marker_fd = lowlevel.own_file(f"{worker_id}-started", lowlevel.MARKER_SIZE)
            # A fresh interpreter takes its spawn token from here, not from its environment.
            lowlevel.marker_give_token(self.marker_fd, token)
            self.endlog_fd = lowlevel.own_file(f"{worker_id}-ends", lowlevel.ENDLOG_SIZE)
            self.marker = lowlevel.own_file_view(self.marker_fd, lowlevel.MARKER_SIZE)
            self.endlog = lowlevel.own_file_view(self.endlog_fd, lowlevel.ENDLOG_SIZE)
            self.proof_fd = proctree.proof_file()
        except BaseException:
            self.close()
            raise

    def handed(self) -> None:
        """The worker has its own copies of the descriptors (or will never need them): close ours,
        so that no descriptor of the supervisor's leads to the files either."""
        for name in ("marker_fd", "endlog_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def tree_gone(self) -> bool:
        """LADDER-PROOF: no process maps the worker's proof page any more (after the worker died; False
        when the worker was never given one)."""
        return proctree.proof_unmapped(self.proof_fd)

    def drop_proof(self) -> None:
        """The worker was not given the proof page (started as a fresh interpreter): never claim it."""
        if self.proof_fd >= 0:
            os.close(self.proof_fd)
            self.proof_fd = -1

    def noted(self) -> tuple[str, float] | None:
        """LADDER-EARLY: the turn the worker last noted it started, and when."""
        return lowlevel.marker_read_noted(self.marker.buf) if self.marker is not None else None

    def ends(self, pid: int) -> list[tuple[float, End]]:
        """WORKER-END-LOG: the ends the worker with ``pid`` logged, oldest first."""
        return lowlevel.endlog_read(self.endlog.buf, pid) if self.endlog is not None and pid else []

    def close(self) -> None:
        self.handed()
        self.drop_proof()
        for name in ("marker", "endlog"):
            view = getattr(self, name)
            if view is not None:
                view.close()
                setattr(self, name, None)


def ensure_private(path: Path) -> None:
    """``path`` (and its parent) as directories of ours with mode 0700, made again if they are
    gone; ``PermissionError`` if something else now stands there (a file, a symlink, another
    user's directory)."""
    for p in (path.parent, path):
        with contextlib.suppress(FileExistsError):
            p.mkdir(mode=0o700)
        st = p.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            raise PermissionError(f"{p} is no longer a directory of this user's")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(p, 0o700, follow_symlinks=False)


def make_worker_dir(base: Path, worker_id: str) -> str:
    """WORKER-CWD: a new empty directory for one worker's agents (mode 0700), under ``base``, made
    again if it was removed. Anything left under the worker's name (it cannot be: ids are never
    reused by one supervisor) is removed first."""
    ensure_private(base)
    path = base / worker_id
    if path.exists() or path.is_symlink():
        remove_tree(str(path))
    path.mkdir(mode=0o700)
    return str(path)


def remove_tree(path: str) -> None:
    """Remove a worker's directory with whatever its agents left in it (symlinks are not followed).

    Empty directories - a worker's, most often; the pool's holds one per worker - go with one ``rmdir``
    each, not the open, listing, close and ``rmdir`` that ``shutil.rmtree`` makes of every directory:
    the pool's with 512 workers' empty ones took 173 ms at a close that way (WORKER-CWD)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
            return
    with contextlib.suppress(OSError):
        os.rmdir(path)  # (only ever removes an empty directory, never follows a link)
        return
    with contextlib.suppress(OSError), os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.rmdir(entry.path)
    shutil.rmtree(path, ignore_errors=True)
