"""Where turnpool keeps its sockets: a per-user runtime directory created with mode 0700."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import zmq

import wire

ENDPOINT_ENV = "TURNPOOL_ENDPOINT"


def runtime_dir() -> Path:
    """The per-user runtime directory, private (ours, a real directory, mode 0700) (SEC-RUNDIR).

    ``$XDG_RUNTIME_DIR/turnpool`` when that is set, else ``<tmp>/turnpool-<uid>``. In a shared
    temp directory another user can create that name first (a directory of theirs, or a symlink
    to one): it is then never used, and neither chmod-ed nor followed. The fallback is
    ``$XDG_CACHE_HOME/turnpool-run`` (default ``~/.cache/turnpool-run``): under our own home,
    where nobody else can create it, and the same for the daemon and the CLI, so the default
    endpoint still finds the daemon. Each use of the fallback says why on the ``turnpool`` logger.
    """
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return _private(Path(xdg) / "turnpool")
    shared = Path(tempfile.gettempdir()) / f"turnpool-{os.getuid()}"
    try:
        return _private(shared)
    except PermissionError as exc:
        fallback = _fallback_dir()
        if len(str(fallback)) + IPC_SUFFIX_MAX > IPC_PATH_MAX:
            raise PermissionError(
                f"{exc}; the fallback {fallback} is too long for an ipc:// socket path ({IPC_PATH_MAX} "
                "bytes): set XDG_RUNTIME_DIR (or TURNPOOL_ENDPOINT)"
            ) from None
        _warn_once(f"{exc}; using {fallback} instead")
        return _private(fallback)


IPC_PATH_MAX = 107  # sun_path, less its terminating NUL
IPC_SUFFIX_MAX = len("/sup-4194304-abcdefgh/workers.sock")  # what a supervisor adds under the runtime dir


def _fallback_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "turnpool-run"


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logging.getLogger("turnpool").warning("turnpool: %s", message)


def _private(path: Path) -> Path:
    """``path`` as a directory of ours with mode 0700: created so, or refused (``PermissionError``)
    when something else (a symlink, another user's directory, a group- or world-open one we did
    not make private ourselves) is there."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PermissionError(
            f"runtime directory {path} is not a directory owned by this user (a symlink or "
            f"a file, made by uid {st.st_uid})"
        )
    if st.st_uid != os.getuid():
        raise PermissionError(
            f"runtime directory {path} is not a directory owned by this user (uid "
            f"{os.getuid()}): uid {st.st_uid} created it"
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700, follow_symlinks=False)  # ours: make it private again
    return path


def default_worker_log(endpoint: str) -> Path:
    """The worker log of the daemon serving ``endpoint``: next to its journal, in the state dir
    (WORKER-OUTPUT)."""
    import hashlib

    from .journal import state_dir

    key = hashlib.sha256(endpoint.encode()).hexdigest()[:16]
    return state_dir() / f"workers-{key}.log"


def default_endpoint() -> str:
    env = os.environ.get(ENDPOINT_ENV)
    if env:
        return env
    return f"ipc://{runtime_dir() / 'supervisor.sock'}"


def check_endpoint(endpoint: object, *, bind: bool = False) -> str:
    """``endpoint`` if it is one turnpool can use, else ``ValueError`` naming it and what is wrong
    (CLI-ENDPOINT).

    The one place an endpoint is judged, for the daemon (``bind``: ``tcp://*:0`` allowed) and for
    every client: ZeroMQ itself accepts a malformed address without complaint and then waits for
    a peer that can never come, so a typo would hang a command until Ctrl-C. Accepted:
    ``ipc://PATH`` (at most 107 bytes, or ``ipc://@name``, abstract) and ``tcp://HOST:PORT``
    (a port in 1–65535; 0 too when binding: any free port)."""
    if not isinstance(endpoint, str):
        raise TypeError(f"endpoint must be a string, got {type(endpoint).__name__}")
    shown = _cut(endpoint)
    if "://" not in endpoint:
        hint = f" (for a socket file write ipc://{endpoint})" if endpoint.startswith("/") else ""
        raise ValueError(f"endpoint {shown} has no scheme: write ipc://PATH or tcp://HOST:PORT{hint}")
    scheme, rest = endpoint.split("://", 1)
    if scheme == "ipc":
        if not rest or rest == "@":
            raise ValueError(f"endpoint {shown} has no path: write ipc:///path/to/turnpool.sock")
        if len(rest.encode()) > IPC_PATH_MAX:
            raise ValueError(
                f"endpoint {shown} is too long: a unix socket path holds {IPC_PATH_MAX} bytes, this one "
                f"{len(rest.encode())}; choose a shorter path"
            )
        return endpoint
    if scheme != "tcp":
        raise ValueError(
            f"endpoint {shown} has an unknown scheme {scheme!r}: write ipc://PATH or tcp://HOST:PORT"
        )
    host, sep, port = rest.rpartition(":")
    if not sep or not host or (host.endswith(":") and not host.startswith("[")):
        raise ValueError(f"endpoint {shown} has no port: write tcp://HOST:PORT")
    if not port.isdigit() or not (0 if bind else 1) <= int(port) <= 65535:
        low = 0 if bind else 1
        raise ValueError(
            f"endpoint {shown} has no valid port ({port!r}): write tcp://HOST:PORT, PORT {low}–65535"
        )
    if host == "*" and not bind:
        raise ValueError(f"endpoint {shown} names no host to connect to: write tcp://HOST:PORT")
    return endpoint


def _cut(text: str, limit: int = 120) -> str:
    """``repr(text)``, cut for an error message when it is long (the length is said)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(base: Path) -> list[Path]:
    """Remove ``sup-<pid>-*`` and ``work-<pid>-*`` directories whose supervisor is dead (killed
    with SIGKILL)."""
    removed = []
    for entry in [*base.glob("sup-*"), *base.glob("work-*")]:
        try:
            pid = int(entry.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if not _pid_alive(pid):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def private_dir(base: Path | None = None, *, kind: str = "sup") -> Path:
    """A fresh 0700 directory for one supervisor: ``sup-<pid>-*`` for its private worker endpoint,
    ``work-<pid>-*`` for its workers' own working directories (WORKER-CWD)."""
    base = base or runtime_dir()
    clean_stale(base)
    return Path(tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}-", dir=base))


def ipc_path(endpoint: str) -> Path | None:
    """The socket file of an ``ipc://`` endpoint (``None`` for other transports and abstract sockets)."""
    if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        return Path(endpoint[len("ipc://") :])
    return None


def client_link_options(sock: zmq.Socket[Any]) -> None:
    """The options every client-link socket gets, on both sides (the daemon's ROUTER, a client's
    DEALER): no linger, the wire's message limit, no queue limits (flow control is turnpool's)."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_SIZE)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
