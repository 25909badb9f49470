"""Running out of file descriptors never kills the daemon or empties the pool (P-FD, D-FD).

* The pool: a worker that dies while the process has no descriptor left is replaced once there
  are descriptors again, by itself (the failed start is backed off and retried, counted in
  ``status()['fd_shortage']``).
* The daemon: under a lowered ``RLIMIT_NOFILE``, floods of half-open HTTP connections and of raw
  TCP connections to its CURVE endpoint are cut at each front end's share; the daemon lives, an
  ordinary client's turn completes, and the pool refills.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from supervisor import Supervisor

pytestmark = pytest.mark.anyio


async def until(check: Callable[[], Any], bound: float = 30.0) -> Any:
    """Poll ``check`` (bounded) until it returns something true; returns it (fails the test if never)."""
    with anyio.fail_after(bound):
        while True:
            got = check()
            if got:
                return got
            await anyio.sleep(0.02)  # allowed: pacing a bounded poll of state that has no event


@contextlib.contextmanager
def exhausted(headroom: int = 24) -> Iterator[list[int]]:
    """Lower this process's soft descriptor limit to what it uses plus ``headroom``, then take every
    descriptor left (``/dev/null`` opened until ``EMFILE``); everything is given back after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = len(os.listdir("/proc/self/fd"))
    taken: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + headroom, hard))
    try:
        while True:
            try:
                taken.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        yield taken
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_the_pool_refills_by_itself_after_running_out_of_descriptors() -> None:
    """P-FD: the only worker dies while no descriptor is free; its replacement cannot start (the
    shortage is counted and shown), and once descriptors are free again the pool refills by itself
    and the next turn runs. (Before: the ``EMFILE`` escaped from a loop callback, nothing retried
    it, and ``workers`` stayed empty for good.)"""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(30):
            first = await sup.run("examples.agents:echo", 1)
        assert first.outcome == "completed"
        with exhausted():
            os.kill(first.worker_pid, signal.SIGKILL)
            await until(lambda: sup.status_now()["fd_shortage"].get("worker_start", 0) >= 1)
            status = sup.status_now()
            assert not [w for w in status["workers"] if w["state"] in ("idle", "busy")]
            assert "file descriptors" in (status["last_start_error"] or "") or "Too many open files" in (
                status["last_start_error"] or ""
            )
        await until(lambda: [w for w in sup.status_now()["workers"] if w["state"] == "idle"])
        with anyio.fail_after(30):
            after = await sup.run("examples.agents:echo", 2)
        assert after.outcome == "completed" and after.worker_pid != first.worker_pid
