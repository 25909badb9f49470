"""WORKER-CPU-SHARE: a pool of workers weighs a few programs against its supervisor, not one per worker.

Each worker leads its own session, and the kernel's autogroups weigh each session as one program:
without this, hundreds of streaming workers had hundreds of shares of the CPUs against their
supervisor's one, and it fell seconds behind delivering their events. By default each worker's
autogroup gets a niceness from the pool's size; its threads keep their own.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import anyio
import pytest

from supervisor import Supervisor
from supervisor.lowlevel import AutogroupShare, autogroup_nice

pytestmark = pytest.mark.anyio

HAVE_AUTOGROUP = os.path.exists("/proc/self/autogroup")


def test_the_pool_weighs_about_four_programs() -> None:
    assert [autogroup_nice(n) for n in (0, 1, 2, 4)] == [0, 0, 0, 0]
    assert autogroup_nice(5) == 2  # 820 × 5 > 4 × 1024 ≥ 655 × 5
    assert autogroup_nice(24) == 9
    assert autogroup_nice(64) == 13
    assert autogroup_nice(384) == autogroup_nice(10_000) == 19
    values = [autogroup_nice(n) for n in range(1, 600)]
    assert values == sorted(values)


def test_what_the_rate_limit_refuses_is_retried_in_order() -> None:
    """Without CAP_SYS_ADMIN the kernel takes one autogroup change per 100 ms machine-wide and
    refuses the others (EAGAIN): those are retried one per tick, oldest first; a worker gone
    meanwhile is dropped; other errors (no autogroups, the process gone) are not retried."""
    written: list[tuple[int, int]] = []
    refuse = {"next": 0}
    later: list[Any] = []

    def write(pid: int, nice: int) -> int:
        if refuse["next"] > 0:
            refuse["next"] -= 1
            return errno.EAGAIN
        if pid == 99:
            return errno.ESRCH
        written.append((pid, nice))
        return 0

    share = AutogroupShare(lambda delay, fn: later.append(fn), write=write)
    share.apply(1, 64)
    refuse["next"] = 1
    share.apply(2, 64)  # refused: waits
    share.apply(3, 64, 15)  # behind it; worker_nice 15 is above the pool's 13
    share.apply(4, 64)
    share.forget(4)
    share.apply(99, 64)
    assert written == [(1, 13)] and len(later) == 1
    while later:
        later.pop(0)()
    assert written == [(1, 13), (2, 13), (3, 15)]
    assert share.set == 3


@pytest.mark.skipif(not HAVE_AUTOGROUP, reason="this kernel has no autogroups")
async def test_each_worker_of_a_pool_runs_in_a_lighter_autogroup_its_threads_untouched() -> None:
    with anyio.fail_after(120):
        async with Supervisor(workers=24, spares=0, start_timeout=60) as sup:
            got = (await sup.run("tests.agents.stream_load:niceness")).output
        async with Supervisor(workers=1, spares=0) as sup:
            one = (await sup.run("tests.agents.stream_load:niceness")).output
    assert got["autogroup"] == autogroup_nice(24) == 9, got
    assert got["nice"] == os.getpriority(os.PRIO_PROCESS, 0), got
    assert one["autogroup"] == 0, one


def _autogroup_nice(pid: int) -> int:
    with open(f"/proc/{pid}/autogroup") as f:
        return int(f.read().split()[-1])


@pytest.mark.skipif(not HAVE_AUTOGROUP, reason="this kernel has no autogroups")
@pytest.mark.skipif(os.geteuid() != 0, reason="one autogroup change per 100 ms without CAP_SYS_ADMIN")
async def test_a_closing_pool_gives_its_workers_their_weight_back() -> None:
    """WORKER-SHARE-AT-CLOSE: once ``aclose()`` begins, every worker's autogroup is at niceness 0 again
    (its exit is all it has left to do), here while a turn that ignores its cancel holds the close."""
    n = 8
    with anyio.fail_after(120):
        sup = Supervisor(workers=n, spares=0, grace=5.0, start_timeout=60)
        await sup.start()
        try:
            handle = await sup.submit("examples.agents:stubborn")
            async for _ in handle.events():
                break
            pids = [w["pid"] for w in (await sup.status())["workers"]]
            assert sorted(_autogroup_nice(p) for p in pids) == [autogroup_nice(n)] * n
            async with anyio.create_task_group() as tg:
                tg.start_soon(sup.aclose)
                # the close waits on the stubborn turn's grace meanwhile
                while any(_autogroup_nice(p) != 0 for p in pids):  # noqa: ASYNC110 - /proc: no event to wait on
                    await anyio.sleep(0.01)  # allowed: a bounded poll of /proc, no event to wait on
                assert (await handle.result()).outcome == "killed"
        finally:
            await sup.aclose()


def test_release_gives_the_weight_back_until_the_first_refusal() -> None:
    written: list[tuple[int, int]] = []

    def write(pid: int, nice: int) -> int:
        if pid == 3:
            return errno.EAGAIN
        written.append((pid, nice))
        return 0

    share = AutogroupShare(lambda delay, fn: None, write=write)
    assert share.release([1, 2, 3, 4]) == 2
    assert written == [(1, 0), (2, 0)]
    assert share.release([5], worker_nice=7) == 1 and written[-1] == (5, 7)


@pytest.mark.skipif(not HAVE_AUTOGROUP, reason="this kernel has no autogroups")
@pytest.mark.skipif(os.geteuid() != 0, reason="one autogroup change per 100 ms without CAP_SYS_ADMIN")
async def test_a_cancelled_turns_worker_weighs_a_program_until_it_is_idle() -> None:
    """WORKER-SHARE-AT-CANCEL: the cancel sets the turn's worker's autogroup to niceness 0 (stopping is
    all it has left to do); once the turn ended and the worker is idle, it is at the pool's again."""
    n = 8
    with anyio.fail_after(120):
        async with Supervisor(workers=n, spares=0, start_timeout=60) as sup:
            handle = await sup.submit("examples.agents:slow", {"seconds": 600})
            async for _ in handle.events():
                break
            pid = next(w["pid"] for w in (await sup.status())["workers"] if w["turn_id"] == handle.turn_id)
            assert _autogroup_nice(pid) == autogroup_nice(n)
            await handle.cancel()
            assert _autogroup_nice(pid) == 0
            assert (await handle.result()).outcome == "aborted"
            while next(w["state"] for w in (await sup.status())["workers"] if w["pid"] == pid) != "idle":  # noqa: ASYNC110 - a slot's state: no event to wait on
                await anyio.sleep(0.01)  # allowed: bounded poll, no event
            assert _autogroup_nice(pid) == autogroup_nice(n)
