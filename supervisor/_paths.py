"""Where turnpool keeps its sockets: a per-user runtime directory created with mode 0700."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

ENDPOINT_ENV = "TURNPOOL_ENDPOINT"


def runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR/turnpool`` or ``<tmp>/turnpool-<uid>``, created 0700 and checked to be ours."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(xdg) / "turnpool" if xdg and os.path.isdir(xdg) else Path(tempfile.gettempdir()) / f"turnpool-{os.getuid()}"
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = base.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"runtime directory {base} is not a directory owned by this user")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(base, 0o700)
    return base


def default_endpoint() -> str:
    env = os.environ.get(ENDPOINT_ENV)
    if env:
        return env
    return f"ipc://{runtime_dir() / 'supervisor.sock'}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(base: Path) -> list[Path]:
    """Remove ``sup-<pid>-*`` directories whose supervisor is dead (killed with SIGKILL)."""
    removed = []
    for entry in base.glob("sup-*"):
        try:
            pid = int(entry.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if not _pid_alive(pid):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def private_dir(base: Path | None = None) -> Path:
    """A fresh 0700 directory for one supervisor's private worker endpoint."""
    base = base or runtime_dir()
    clean_stale(base)
    return Path(tempfile.mkdtemp(prefix=f"sup-{os.getpid()}-", dir=base))
