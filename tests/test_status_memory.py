"""MEM-STATUS-SAMPLE: ``status()`` of a large pool reports each worker's memory from a background sample
instead of reading /proc for every process on every call; a small pool is measured on every call."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import anyio
import pytest

from supervisor import Supervisor
from supervisor.lowlevel import treemem

pytestmark = pytest.mark.anyio


def test_a_large_pool_is_sampled_once_per_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(treemem, "SYNC_WORKERS", 1)
    now = [100.0]
    memory = treemem.TreeMemory(clock=lambda: now[0])
    spawned: list[Any] = []
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # allowed: it only exists
    try:
        pids = [os.getpid(), child.pid]
        first = memory.figures(pids, lambda fn, *args: spawned.append((fn, args)))
        assert first == {pid: treemem.UNKNOWN for pid in pids}  # not sampled yet: nothing read on this call
        assert len(spawned) == 1  # a sample is due (none taken yet)
        again = memory.figures(pids, lambda fn, *args: spawned.append((fn, args)))
        assert again == first and len(spawned) == 1  # one sample at a time
        fn, args = spawned.pop()
        anyio.run(fn, *args)  # the sample, in a thread
        sampled = memory.figures(pids, lambda fn, *args: spawned.append((fn, args)))
        assert all(rss > 0 and pss > 0 for rss, _, pss, _ in sampled.values()), sampled
        assert spawned == []
        now[0] += treemem.REFRESH / 2
        memory.figures(pids, lambda fn, *args: spawned.append((fn, args)))
        assert spawned == []  # fresh enough
        now[0] += treemem.REFRESH
        memory.figures(pids, lambda fn, *args: spawned.append((fn, args)))
        assert len(spawned) == 1
    finally:
        child.kill()
        child.wait()


def test_a_whole_sample_takes_at_most_its_share_of_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """MEM-STATUS-SHARE: a sample that took 1 s of CPU is taken again only 1 / SHARE s later, however often
    status() asks (fails before: again after REFRESH, so a 1,000-worker daemon sampled without a pause); a
    worker new since is measured alone meanwhile."""
    monkeypatch.setattr(treemem, "SYNC_WORKERS", 1)
    now = [100.0]
    cpu = [0.0]

    def cpu_clock() -> float:
        cpu[0] += 0.5  # each reading 0.5 s later: a sample reads it twice, so it costs 1 s
        return cpu[0]

    memory = treemem.TreeMemory(clock=lambda: now[0], cpu_clock=cpu_clock)
    spawned: list[Any] = []

    def spawn(fn: Any, *args: Any) -> None:
        spawned.append((fn, args))

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # allowed: it only exists
    try:
        pids = [os.getpid(), child.pid]
        memory.figures(pids, spawn)
        fn, args = spawned.pop()
        anyio.run(fn, *args)
        assert set(memory.figures(pids, spawn)) == set(pids) and spawned == []
        now[0] += 3 * treemem.REFRESH
        memory.figures(pids, spawn)
        assert spawned == []  # past REFRESH, but within 1 s / SHARE
        new = [*pids, os.getppid()]
        first = memory.figures(new, spawn)
        assert first[os.getppid()] == treemem.UNKNOWN
        fn, args = spawned.pop()
        assert args[0] == [os.getppid()]  # only the new one
        anyio.run(fn, *args)
        got = memory.figures(new, spawn)
        assert spawned == [] and got[os.getppid()][0] > 0 and got[os.getpid()][0] > 0
        now[0] += 1 / treemem.SHARE
        memory.figures(new, spawn)
        assert len(spawned) == 1 and sorted(spawned[0][1][0]) == sorted(new)
    finally:
        child.kill()
        child.wait()


def test_the_sample_carries_the_mib_figures_status_shows() -> None:
    """Rounded once per sample, not for every worker on every status() call (fails before: the sample held
    bytes only, and each call rounded 2 figures per worker, 2.3 ms of CPU at 1,000 workers)."""
    rss, rss_mb, pss, pss_mb = treemem.measure(os.getpid())
    assert rss > 0 and pss > 0
    assert rss_mb == round(rss / 2**20, 1) and pss_mb == round(pss / 2**20, 1)


def test_a_small_pool_is_measured_on_every_call() -> None:
    memory = treemem.TreeMemory()
    spawned: list[Any] = []
    got = memory.figures([os.getpid()], lambda fn, *args: spawned.append(fn))
    assert got[os.getpid()][0] > 0 and spawned == []


async def test_status_of_a_sampled_pool_reports_every_workers_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every worker's figures are there once the first background sample has landed (a bounded
    poll: the sample is another thread's work, with no event to wait on)."""
    monkeypatch.setattr(treemem, "SYNC_WORKERS", 1)
    with anyio.fail_after(60):
        async with Supervisor(workers=3, spares=0) as sup:
            while True:
                workers = (await sup.status())["workers"]
                assert len(workers) == 3
                if all(w["rss"] > 0 and w["pss"] > 0 for w in workers):
                    break
                await anyio.sleep(0.05)  # allowed: a bounded poll for the background sample


async def test_a_status_right_after_a_change_shows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sampled pool's status shows each worker's state and turn as they are at the call."""
    monkeypatch.setattr(treemem, "SYNC_WORKERS", 1)
    with anyio.fail_after(60):
        async with Supervisor(workers=2, spares=0) as sup:
            before = (await sup.status())["workers"]
            assert sorted(w["state"] for w in before) == ["idle", "idle"]
            handle = await sup.submit("tests.agents.http:emit_then_wait", {"count": 1})
            async for _ in handle.events():
                break  # it runs
            running = [w for w in (await sup.status())["workers"] if w["turn_id"] == handle.turn_id]
            assert len(running) == 1 and running[0]["state"] == "busy" and running[0]["turns_run"] == 0
            await handle.cancel()
            await handle.result()
            after = {w["id"]: w for w in (await sup.status())["workers"]}[running[0]["id"]]
            assert after["turn_id"] is None and after["turns_run"] == 1 and after["state"] != "busy"
