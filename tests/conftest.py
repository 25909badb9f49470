"""Shared fixtures. Every test must leave no process behind: ``no_leftover_processes`` is
autouse and fails a test whose children, grandchildren or re-parented orphans outlive it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import psutil
import pytest

from worker import lowlevel

# This test process adopts orphans (like the supervisor does), so a double-forked daemon
# that escaped a kill shows up here as our child instead of vanishing under init.
lowlevel.set_child_subreaper()


def _leftovers() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    before = {p.pid for p in _leftovers()}
    yield
    left = [p for p in _leftovers() if p.pid not in before]
    if not left:
        return
    # Give exiting processes a bounded moment to finish (waits on their exit, no sleep).
    gone, alive = psutil.wait_procs(left, timeout=5)
    zombies = []
    for p in gone:
        try:
            os.waitpid(p.pid, os.WNOHANG)
        except ChildProcessError:
            pass
    for p in alive:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                zombies.append(p.pid)
                os.waitpid(p.pid, os.WNOHANG)
                continue
        except (psutil.Error, ChildProcessError):
            continue
    really = [p for p in alive if p.pid not in zombies]
    desc = [f"{p.pid} {_cmd(p)}" for p in really]
    for p in really:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    psutil.wait_procs(really, timeout=5)
    for p in really:
        try:
            os.waitpid(p.pid, os.WNOHANG)
        except ChildProcessError:
            pass
    if really or zombies:
        pytest.fail(f"test left processes behind: alive={desc} unreaped zombies={zombies}")


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:120]
    except psutil.Error:
        return "?"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
