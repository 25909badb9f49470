"""Hundreds of workers on one host: the guarantees that name the pool's watcher, the subreaper and the
reap path hold at 256 workers. A host running an embedded ``Supervisor`` with 256 busy workers, each
turn having left a setsid daemon and a plain child, is SIGKILLed: every worker, daemon, child, the
zygote and the watcher are gone within the bound, and (with cgroups) every worker's group is
emptied. (Timings of hundreds of workers are in benchmarks/, not here.)"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import psutil
import pytest

from tests.support import hostproc, leftovers
from worker import proctree

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

N = 256
BOUND = 10.0  # seconds from the host's death until the last process it left is gone (guarantees.md)

HOST = r"""
import json, sys
import anyio
from supervisor import Supervisor

async def main():
    files = sys.argv[2:]
    async with Supervisor(workers=len(files), spares=0, grace=60, kill_after=60,
                          cgroups=sys.argv[1] == "1") as sup:
        handles = [await sup.submit("tests.agents.tree:daemonize_then_wait", {"pid_file": f}) for f in files]
        for h in handles:
            async for _ in h.events():
                break
        workers = [w["pid"] for w in (await sup.status())["workers"]]
        pool = sup.pool.cgroups.path if sup.pool.cgroups else None
        print(json.dumps({"workers": workers, "pool": pool}), flush=True)
        await anyio.sleep_forever()  # allowed: the host lives until the test SIGKILLs it

anyio.run(main)
"""


def _pids(files: list[str]) -> list[int]:
    return [int(p) for f in files for p in Path(f).read_text().split()]


def _ppid(p: psutil.Process) -> int | None:
    try:
        return p.ppid()
    except psutil.Error:
        return None


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p)]


MODES = [
    pytest.param(
        True,
        id="cgroup",
        marks=pytest.mark.skipif(
            not proctree.cgroups_usable(),
            reason="no writable cgroup hierarchy on this machine (the fallback is tested)",
        ),
    ),
    pytest.param(False, id="fallback"),
]


@pytest.mark.parametrize("cgroups", MODES)
async def test_sigkill_of_a_supervisor_with_256_busy_workers_leaves_nothing(
    tmp_path: Path, cgroups: bool
) -> None:
    files = [str(tmp_path / f"pids{i}") for i in range(N)]
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    async with hostproc.host(HOST, "1" if cgroups else "0", *files, ready_s=300) as (proc, seen):
        assert len(seen["workers"]) == N
        left = await anyio.to_thread.run_sync(_pids, files)  # each turn's daemon and plain child
        assert len(left) == 2 * N and _alive(left) == left
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with anyio.fail_after(60):
            assert await anyio.to_thread.run_sync(proc.wait) == -signal.SIGKILL
        # What the host left is re-parented to this process (a child subreaper, see conftest): wait
        # on all of it, reaping as it goes.
        rest = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        _, alive = await anyio.to_thread.run_sync(lambda: psutil.wait_procs(rest, timeout=BOUND))
        took = time.monotonic() - t0
        print(f"{N} workers, host SIGKILL -> {len(rest)} left processes gone in {took * 1000:.0f} ms")
        # What it was (a worker, its daemon, the zygote, the watcher...) says which cleaner missed it.
        what = [f"{p.pid} ppid={_ppid(p)} {leftovers.cmd(p)}" for p in alive][:20]
        assert alive == [], f"left behind after {BOUND} s: {what}"
        assert _alive(left) == [] and _alive(seen["workers"]) == []
        if cgroups:
            assert proctree.cgroup_procs(seen["pool"]) == []
