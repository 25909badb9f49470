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
from supervisor.lowlevel import AutogroupShare, OwnWeight, autogroup_nice, own_nice, pool_weight

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


def _autogroup_nice(pid: int) -> int | None:
    """``pid``'s autogroup niceness; None when it is in the kernel's root autogroup (a session never
    started since boot, as a container's first process's can be: the file is then empty)."""
    with open(f"/proc/{pid}/autogroup") as f:
        text = f.read().split()
    return int(text[-1]) if text else None


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


def test_the_supervisor_weighs_what_its_pool_weighs() -> None:
    """WORKER-SUPERVISOR-WEIGHT: the niceness at which one autogroup weighs at least a pool of N workers."""
    assert pool_weight(1) == 1024 and pool_weight(256) == 256 * 15
    assert own_nice(pool_weight(1)) == 0  # one worker: one program against one
    assert own_nice(pool_weight(2)) == -4  # 2,048 ≤ 2,501 (niceness -4; -3 is 1,991)
    assert own_nice(pool_weight(4)) == -7  # four programs at niceness 0: 4,096 ≤ 4,904
    assert own_nice(pool_weight(256)) == -6  # 3,840 ≤ 3,906
    assert own_nice(10**9) == -10  # never past -10
    assert own_nice(pool_weight(512)) == -10  # past 273 workers the pool outweighs four programs: 7,680
    values = [own_nice(pool_weight(n)) for n in range(1, 274)]
    assert min(values) == -7 and values[0] == 0


def test_one_stopping_worker_at_a_time_weighs_what_the_supervisor_weighs() -> None:
    """WORKER-SUPERVISOR-WEIGHT: ``hurry`` raises one worker at a time; a second gets nothing from it (the
    pool gives it a program's weight instead); once the first is settled or gone, the next one may."""
    written: list[tuple[int, int]] = []

    def write(pid: int | str, nice: int) -> int:
        assert isinstance(pid, int)
        written.append((pid, nice))
        return 0

    share = AutogroupShare(lambda delay, fn: None, write=write)
    assert share.hurry(1, -6) and share.hurry(1, -6)
    assert not share.hurry(2, -6)
    assert share.boost(2) and written == [(1, -6), (2, 0)]
    share.settle(1, 8)
    assert share.hurry(3, -6)
    share.forget(3)
    assert share.hurry(4, -6) and written[-1] == (4, -6)
    refused = AutogroupShare(lambda delay, fn: None, write=lambda pid, nice: errno.EPERM)
    assert not refused.hurry(1, -6) and not refused.raised


def test_own_weight_is_raised_while_pools_run_and_comes_back_after_the_last() -> None:
    """WORKER-SUPERVISOR-WEIGHT: the first pool raises this process's autogroup, a larger one raises it
    more, the niceness it had comes back once the last closes; where the kernel refuses, nothing is
    retried."""
    state = {"nice": 0}
    writes: list[int] = []

    def write(pid: int | str, nice: int) -> int:
        assert pid == "self"
        writes.append(nice)
        state["nice"] = nice
        return 0

    own = OwnWeight(write=write, read=lambda pid: state["nice"], leads=lambda: True)
    assert own.hold(1, 0) is None and writes == []  # a small pool: nothing to raise
    assert own.hold(2, -3) == -3
    assert own.hold(3, -6) == -6
    own.release(3)
    assert own.nice == -3 and state["nice"] == -3
    own.release(1)
    own.release(2)
    assert state["nice"] == 0 and own.nice is None and writes == [-3, -6, -3, 0]

    refused = OwnWeight(write=lambda pid, nice: errno.EPERM, read=lambda pid: 0, leads=lambda: True)
    assert refused.hold(1, -6) is None
    refused.release(1)
    assert refused.nice is None
    already = OwnWeight(write=lambda pid, nice: 1 // 0, read=lambda pid: -8, leads=lambda: True)
    assert already.hold(1, -6) == -8 and already.nice is None  # raised already: nothing of ours to give back
    already.release(1)
    guest = OwnWeight(write=lambda pid, nice: 1 // 0, read=lambda pid: 0, leads=lambda: False)
    assert guest.hold(1, -6) is None  # another program's session: never written


_LEADER = """
import json, anyio
from supervisor import Supervisor

def nice(pid="self"):
    with open(f"/proc/{pid}/autogroup") as f:
        return int(f.read().split()[-1])

async def main():
    out = {"before": nice()}
    async with Supervisor(workers=8, spares=0, grace=0.05, kill_after=60, start_timeout=60) as sup:
        out["during"] = nice()
        handles = [await sup.submit("examples.agents:slow", {"seconds": 600}) for _ in range(2)]
        pids = []
        for handle in handles:
            async for _ in handle.events():
                break
            workers = (await sup.status())["workers"]
            pids.append(next(w["pid"] for w in workers if w["turn_id"] == handle.turn_id))
        for handle in handles:
            await handle.cancel()
        out["cancelled"] = [nice(pid) for pid in pids]
        for handle in handles:
            await handle.result()
        handle = await sup.submit("examples.agents:sigterm_ignorer")
        async for event in handle.events():
            pid = event["pid"]
            break
        await handle.cancel()
        with anyio.fail_after(10):
            while nice(pid) != out["during"]:
                await anyio.sleep(0.01)  # allowed: bounded poll of /proc (a niceness change has no event)
        out["killed"] = nice(pid)
        sup.kill_now([handle.turn_id])
        out["outcome"] = (await handle.result()).outcome
    out["after"] = nice()
    print(json.dumps(out))

anyio.run(main)
"""


@pytest.mark.skipif(not HAVE_AUTOGROUP, reason="this kernel has no autogroups")
@pytest.mark.skipif(os.geteuid() != 0, reason="a niceness below 0 needs CAP_SYS_NICE")
def test_a_supervisor_leading_its_session_weighs_what_its_pool_weighs() -> None:
    """WORKER-SUPERVISOR-WEIGHT, in a process that leads its session (a service's, ``setsid``'s): while the
    pool of 8 runs, its autogroup is at -6 (3,906 ≥ 8 × 423); the first of two cancelled turns' workers
    weighs the same, the second a program (niceness 0, WORKER-SHARE-AT-CANCEL); a worker killed later weighs
    the supervisor's through its SIGTERM step (its agent ignores SIGTERM: it is there to be looked at until
    ``kill_now``); the niceness is back at 0 after ``aclose()``. Fails before: every autogroup stayed at 0
    (or 4, the pool's)."""
    import json
    import subprocess
    import sys

    got = subprocess.run(
        [sys.executable, "-c", _LEADER], capture_output=True, text=True, timeout=180, start_new_session=True
    )
    assert got.returncode == 0, got.stderr[-2000:]
    out = json.loads(got.stdout.splitlines()[-1])
    assert out["before"] == 0 and out["after"] == 0, out
    assert out["during"] == own_nice(pool_weight(8)) == -6, out
    assert out["cancelled"] == [-6, 0], out
    assert out["killed"] == -6 and out["outcome"] == "killed", out


@pytest.mark.skipif(not HAVE_AUTOGROUP, reason="this kernel has no autogroups")
async def test_a_supervisor_in_another_programs_session_leaves_its_weight_alone() -> None:
    """WORKER-SUPERVISOR-WEIGHT: embedded in a process that does not lead its session (this test's: a
    shell's or a host's session), the session's autogroup is never changed, privileged or not."""
    if os.getsid(0) == os.getpid():
        pytest.skip("this test process leads its session")
    before = _autogroup_nice(os.getpid())
    if before is None:
        pytest.skip("this test process is in the kernel's root autogroup: it has no niceness to change")
    with anyio.fail_after(120):
        async with Supervisor(workers=24, spares=0, start_timeout=60) as sup:
            assert (await sup.run("tests.agents.stream_load:niceness")).outcome == "completed"
            assert _autogroup_nice(os.getpid()) == before
    assert _autogroup_nice(os.getpid()) == before
