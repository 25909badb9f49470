"""What a run left behind: the processes descending from this one (children, grandchildren and
orphans re-parented to it, since it is a child subreaper) that were not there before.

Shared by the autouse fixture in ``tests/conftest.py`` (a test that leaves a process fails) and
the hostile-neighbour soak (``tests/support/hostile_soak.py``, which counts them).
"""

from __future__ import annotations

import contextlib
import os
import signal

import psutil


def descendants() -> list[psutil.Process]:
    """This process's live and zombie descendants (orphans come here: it is a subreaper)."""
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:120]
    except psutil.Error:
        return "?"


def clear(left: list[psutil.Process], timeout: float = 5.0) -> tuple[list[str], list[int]]:
    """Wait (bounded) for ``left`` to exit and reap it; SIGKILL and reap what is still alive.
    Returns the ones that were really alive (``pid cmdline``) and the unreaped zombies' pids."""
    if not left:
        return [], []
    # Give exiting processes a bounded moment to finish (waits on their exit, no sleep).
    gone, alive = psutil.wait_procs(left, timeout=timeout)
    zombies = []
    for p in gone:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p.pid, os.WNOHANG)
    for p in alive:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                zombies.append(p.pid)
                os.waitpid(p.pid, os.WNOHANG)
                continue
        except (psutil.Error, ChildProcessError):
            continue
    really = [p for p in alive if p.pid not in zombies]
    desc = [f"{p.pid} {cmd(p)}" for p in really]
    for p in really:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
    psutil.wait_procs(really, timeout=timeout)
    for p in really:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p.pid, os.WNOHANG)
    return desc, zombies
