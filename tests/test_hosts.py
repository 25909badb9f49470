"""The async API under every event-loop host a user brings (issue 15, item 1; design rule API-ASYNCIO).

Each host runs as a user's script in a subprocess (``tests/support/hosts.py``), bounded, so a
hang fails instead of hanging: plain ``asyncio.run``, uvloop, a loop already running in another
thread (Jupyter's and uvicorn's situation), tasks created with ``asyncio.create_task`` that
open and close the backend in different tasks, and trio, which is refused at once.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.support.daemonkit import FAST, ROOT, serving

HOSTS = ["asyncio_run", "uvloop", "thread_loop", "nested_tasks"]
BOUND = 90.0


def _script(host: str, target: str, endpoint: str = "", env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.hosts", host, target, *([endpoint] if endpoint else [])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (
        f"{host}/{target} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


@pytest.mark.parametrize("host", HOSTS)
def test_embedded_supervisor_under_every_asyncio_host(host: str) -> None:
    """An embedded ``Supervisor`` runs, follows, cancels (to a kill), crashes, reports status and
    goes idle under each asyncio host; the script exits within the bound."""
    if host == "uvloop":
        pytest.importorskip("uvloop", reason="uvloop does not install on this machine")
    out = _script(host, "supervisor")
    assert out.startswith("OK "), out
    assert '"cancelled": "killed"' in out, out


@pytest.mark.parametrize("host", HOSTS)
def test_client_under_every_asyncio_host(host: str) -> None:
    """``Client`` does the same against a daemon under each asyncio host."""
    if host == "uvloop":
        pytest.importorskip("uvloop", reason="uvloop does not install on this machine")
    with serving(*FAST) as d:
        out = _script(host, "client", d.endpoint, env=d.env)
    assert out.startswith("OK "), out


@pytest.mark.parametrize("target", ["supervisor", "client"])
def test_trio_is_refused_at_once_with_the_way_out(target: str) -> None:
    """Under trio, ``Supervisor`` and ``Client`` raise a ``RuntimeError`` at once that says asyncio
    only and names the way out (the blocking twin in a thread, or anyio's asyncio backend);
    nothing is started (no raw error from deep inside, no 30 s wait)."""
    started = time.monotonic()
    out = _script("trio", target, "ipc:///nonexistent/s.sock" if target == "client" else "")
    assert out.startswith("REFUSED "), out
    assert "asyncio only" in out and "trio.to_thread.run_sync" in out, out
    assert time.monotonic() - started < 30, "refused, but not at once"


def test_one_status_contract_async_on_async_classes_blocking_on_the_twins() -> None:
    """Item 16: ``status()`` is a coroutine function on ``Supervisor`` and ``Client`` (as every other
    method there) and a plain blocking method on ``SyncSupervisor`` and ``SyncClient``."""
    import inspect

    from supervisor import Client, Supervisor, SyncClient, SyncSupervisor

    assert inspect.iscoroutinefunction(Supervisor.status) and inspect.iscoroutinefunction(Client.status)
    assert not inspect.iscoroutinefunction(SyncSupervisor.status)
    assert not inspect.iscoroutinefunction(SyncClient.status)
