"""Helpers for tests against a real ``turnpool serve`` subprocess.

Each daemon gets its own short temp dir (``/tmp/tpd…``: an ``ipc://`` path must fit in 107
bytes), its own ``TURNPOOL_ENDPOINT`` and ``XDG_RUNTIME_DIR``, so tests never share a daemon.
Start-up is awaited on the daemon's own "ready" line on stdout, bounded; nothing sleeps.

Workers import agents only from ``--path`` directories (WORKER-PATH): ``start`` passes the repo root,
so ``tests.agents:...`` resolves wherever the daemon runs. Commands run with ``python -P``, like
the ``turnpool`` console script, which never searches its working directory either.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio

from supervisor import Client
from supervisor.daemon.server import READY_PREFIX
from supervisor.journal import lock_name

ENTRY = "from supervisor.cli.main import entry; entry()"
READY_TIMEOUT = 60.0
ROOT = str(Path(__file__).resolve().parents[2])  # the repo root: ``tests.*`` agents live under it


def turnpool_argv(*args: str) -> list[str]:
    """argv running the ``turnpool`` console script with this interpreter."""
    return [sys.executable, "-P", "-c", ENTRY, *args]


def short_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="tpd", dir="/tmp"))


class Served:
    """A running ``turnpool serve``: its process, endpoint, env, ready line and stderr file."""

    def __init__(
        self, proc: subprocess.Popen[bytes], endpoint: str, env: dict[str, str], home: Path, ready: str
    ) -> None:
        self.proc = proc
        self.endpoint = endpoint
        self.env = env
        self.home = home
        self.ready = ready

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def metrics_url(self) -> str:
        return self.ready.split(" metrics ", 1)[1].split()[0]

    @property
    def http_url(self) -> str:
        """The HTTP front end's base URL (``serve --http``), ending in ``/``."""
        return self.ready.split(" http ", 1)[1].split()[0]

    def stderr(self) -> str:
        return (self.home / "stderr.log").read_text(errors="replace")

    def cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a ``turnpool`` command against this daemon (through the environment)."""
        return subprocess.run(
            turnpool_argv(*args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout=timeout)


def env_for(home: Path, endpoint: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["XDG_RUNTIME_DIR"] = str(home)
    env["XDG_STATE_HOME"] = str(home / "state")  # the default journal lives here
    if endpoint is None:
        env.pop("TURNPOOL_ENDPOINT", None)
    else:
        env["TURNPOOL_ENDPOINT"] = endpoint
    return env


def start(
    *args: str,
    home: Path | None = None,
    endpoint: str | None = "default",
    check_ready: bool = True,
    paths: tuple[str, ...] = (ROOT,),
    cwd: str | Path | None = None,
    stderr_pipe: bool = False,
    env_extra: dict[str, str | None] | None = None,
    limit_fds: int | None = None,
    wrap: Sequence[str] = (),
    preexec_fn: Callable[[], None] | None = None,
) -> Served:
    """Start ``turnpool serve`` and wait (bounded) for its ready line.

    ``paths`` become ``--path`` flags; ``cwd`` is the daemon's working directory; with
    ``stderr_pipe`` its stderr is a pipe the caller may leave unread (``proc.stderr``);
    ``env_extra`` overrides variables (``None`` removes one); ``limit_fds`` sets the daemon's soft
    and hard ``RLIMIT_NOFILE`` (so it cannot raise it); ``wrap`` is a command that execs the
    daemon (``unshare --net``: the pid stays the daemon's); ``preexec_fn`` runs in the child
    before the exec (e.g. to lower a resource limit)."""
    home = home or short_dir()
    if endpoint == "default":
        endpoint = f"ipc://{home}/s.sock"
    env = env_for(home, endpoint)
    for key, value in (env_extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    flags = [flag for p in paths for flag in ("--path", p)]
    err = subprocess.PIPE if stderr_pipe else open(home / "stderr.log", "ab")  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            [*wrap, *turnpool_argv("serve", *flags, *args)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            preexec_fn=_before_exec(limit_fds, preexec_fn),
        )
    finally:
        if not isinstance(err, int):
            err.close()
    if not check_ready:
        return Served(proc, endpoint or "", env, home, "")
    line = _read_line(proc, READY_TIMEOUT)
    if not line.startswith(READY_PREFIX):
        stop_process(proc)
        log = home / "stderr.log"
        raise AssertionError(f"serve did not get ready: {line!r}\n{log.read_text() if log.exists() else ''}")
    actual = line[len(READY_PREFIX) :].split(" ", 1)[0]
    return Served(proc, actual, env, home, line)


def _before_exec(limit_fds: int | None, then: Callable[[], None] | None) -> Callable[[], None] | None:
    if limit_fds is None:
        return then

    def run() -> None:
        _limit_fds(limit_fds)
        if then is not None:
            then()

    return run


def _limit_fds(n: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return ""
        readable, _, _ = select.select([proc.stdout], [], [], left)
        if readable:
            return proc.stdout.readline().decode(errors="replace").strip()


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """SIGTERM, wait (bounded), SIGKILL if it must; always reaped."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    if proc.stdout is not None:
        proc.stdout.close()
    if proc.stderr is not None:
        proc.stderr.close()


def wait_journal_released(journal: str | Path, bound: float = 60.0) -> None:
    """Wait (bounded) until nothing holds ``journal``'s lock. A SIGKILLed daemon's journal writer dies of
    its parent-death signal a moment after the daemon (later on a loaded machine, or once a write stuck
    on a frozen disk returns); until then a daemon started on the journal is refused (JOURNAL-ONE-DAEMON),
    so a test restarting on it waits for that first."""
    name = lock_name(Path(journal))
    deadline = time.monotonic() + bound
    while True:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(name)
        except ConnectionRefusedError:
            return  # nothing listens on the lock's name: released
        except OSError:
            pass  # (a full backlog times out: still held)
        finally:
            probe.close()
        assert time.monotonic() < deadline, f"journal {journal} still locked after {bound} s"
        time.sleep(0.01)  # allowed: bounded poll of a lock another process holds (no event to wait on)


@contextlib.contextmanager
def serving(*args: str, **kwargs: object) -> Iterator[Served]:
    """``turnpool serve`` for the duration of the block; stopped (SIGTERM, drained) and cleaned after."""
    served = start(*args, **kwargs)  # type: ignore[arg-type]
    try:
        yield served
    finally:
        stop_process(served.proc)
        shutil.rmtree(served.home, ignore_errors=True)


# ``serve --http`` on a free loopback port (read the URL from ``Served.http_url``).
HTTP = ("--http", "127.0.0.1:0")
FAST = ("--workers", "2", "--spares", "0", "--grace", "0.5", "--kill-after", "0.5", "--drain", "0")


async def status(served: Served) -> dict[str, Any]:
    """The daemon's ``status()``, over a connection of its own."""
    async with Client.connect(served.endpoint) as client:
        return dict(await client.status())


async def wait_status(
    served: Served, check: Callable[[dict[str, Any]], Any], limit: float = 30
) -> dict[str, Any]:
    """Poll the daemon's status (a request per loop, bounded by ``limit``) until ``check`` holds."""
    with anyio.fail_after(limit):
        while True:
            st = await status(served)
            if check(st):
                return st
            await anyio.sleep(0.05)  # allowed: polling the daemon's status, bounded by fail_after
