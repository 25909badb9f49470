"""Turns handed to a worker ahead of time (prefetch), revoking them, and workers forked from the zygote.

SPEC "Precise points": a turn handed ahead still counts as queued until the worker reports it
started; cancelling it ends ``aborted`` with ``started`` false; if that worker dies it goes back
to the queue unharmed; it never waits behind a busy worker while another worker is idle.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from typing import Any

import anyio
import psutil
import pytest

from supervisor import Supervisor
from tests.support.events import first_event

pytestmark = pytest.mark.anyio


def handed_to(sup: Supervisor, turn_id: str) -> Any:
    """The worker slot a turn was handed ahead to, or None."""
    return next((s for s in sup.pool.slots.values() if any(t.id == turn_id for t in s.ahead)), None)


# Hand turns ahead whatever the turn times: a window of an hour, seeded by one quick turn (the
# mean turn time starts at the window, i.e. "too long to prefetch").
EAGER = {"prefetch_window": 3600.0}


async def seed(sup: Supervisor) -> None:
    """One quick turn, so the supervisor's mean turn time drops below the window."""
    with anyio.fail_after(30):
        assert (await sup.run("examples.agents:echo", 0)).outcome == "completed"


async def test_handed_turn_counts_as_queued_and_cancels_unstarted() -> None:
    """A turn handed ahead behind a busy worker is reported as queued; cancelling it ends ``aborted``
    with ``started`` false and no worker pid, and the running turn is untouched."""
    async with Supervisor(workers=1, spares=0, grace=20, **EAGER) as sup:
        await seed(sup)
        blocker = await sup.submit("tests.agents:wait_signal")
        await first_event(blocker)
        queued = await sup.submit("examples.agents:echo", "never")
        assert handed_to(sup, queued.turn_id) is not None
        assert (await sup.status())["queue"] == 1 and (await sup.status())["running"] == 1
        assert await queued.cancel() == {"kind": "user"}
        with anyio.fail_after(30):
            result = await queued.result()
        assert result.outcome == "aborted" and result.started is False and result.worker_pid is None
        await blocker.cancel({"kind": "deadline"})
        with anyio.fail_after(30):
            done = await blocker.result()
    assert done.outcome == "completed" and done.output == {"saw": "deadline"}


async def test_handed_turn_goes_back_to_the_queue_when_its_worker_dies() -> None:
    """The worker holding a handed-ahead turn is killed from outside: the running turn is ``crashed``,
    the handed one runs unharmed on the replacement worker."""
    async with Supervisor(workers=1, spares=0, **EAGER) as sup:
        await seed(sup)
        blocker = await sup.submit("examples.agents:slow", {"seconds": 60})
        info = await first_event(blocker)
        nxt = await sup.submit("examples.agents:echo", "after")
        assert handed_to(sup, nxt.turn_id) is not None
        os.kill(info["pid"], signal.SIGKILL)
        with anyio.fail_after(30):
            crashed = await blocker.result()
            result = await nxt.result()
    assert crashed.outcome == "crashed"
    assert result.outcome == "completed" and result.output == "after" and result.started
    assert result.worker_pid not in (None, info["pid"])


async def test_handed_turn_is_revoked_to_an_idle_worker() -> None:
    """Two workers busy, a third turn handed ahead behind one of them; when the *other* worker frees
    up, the handed turn is revoked and runs there while the first worker is still busy."""
    async with Supervisor(workers=2, spares=0, grace=20, **EAGER) as sup:
        await seed(sup)
        a = await sup.submit("examples.agents:slow", {"seconds": 60})
        b = await sup.submit("examples.agents:slow", {"seconds": 60})
        info = {a.turn_id: await first_event(a), b.turn_id: await first_event(b)}
        c = await sup.submit("examples.agents:echo", "moved")
        holder = handed_to(sup, c.turn_id)
        assert holder is not None
        stuck = a if holder.turn is not None and holder.turn.id == a.turn_id else b
        other = b if stuck is a else a
        await other.cancel()
        with anyio.fail_after(30):
            assert (await other.result()).outcome == "aborted"
            result = await c.result()
        assert result.outcome == "completed" and result.output == "moved"
        assert result.worker_pid == info[other.turn_id]["pid"]
        assert sup.record(stuck.turn_id).state == "running"  # it never waited for the busy worker
        await stuck.cancel()
        with anyio.fail_after(30):
            assert (await stuck.result()).outcome == "aborted"


async def test_long_turns_get_nothing_handed_behind_them() -> None:
    """With the default window (2 ms of work), once turns are seen to be long a queued turn stays in
    the queue instead of being handed ahead behind a running one; trivial turns are prefetched."""
    async with Supervisor(workers=1, spares=0, grace=20) as sup:
        with anyio.fail_after(60):
            await sup.run("examples.agents:slow", {"seconds": 0.05})  # a "long" turn: 50 ms > 2 ms
            blocker = await sup.submit("examples.agents:slow", {"seconds": 60})
            await first_event(blocker)
            waiting = await sup.submit("examples.agents:echo", "later")
            assert handed_to(sup, waiting.turn_id) is None and (await sup.status())["queue"] == 1
            await blocker.cancel()
            assert (await blocker.result()).outcome == "aborted"
            assert (await waiting.result()).outcome == "completed"
            # Trivial turns bring the mean down: a burst is handed ahead several at a time again.
            results = [
                await h.result() for h in [await sup.submit("examples.agents:noop") for _ in range(200)]
            ]
        assert all(r.outcome == "completed" for r in results)
        assert sup.prefetch_depth > 1


async def test_zygote_workers_are_our_children_in_their_own_session() -> None:
    """Workers forked by the zygote are re-parented to the supervisor (a child subreaper) and lead
    their own session, like spawned ones; the zygote is gone after disposal."""
    async with Supervisor(workers=2, spares=0) as sup:
        assert sup.pool.zygote is not None
        zygote_pid = sup.pool.zygote.pid
        with anyio.fail_after(30):
            results = [await sup.run("examples.agents:echo", i) for i in range(4)]
        pids = {w["pid"] for w in (await sup.status())["workers"]}
        for pid in pids:
            assert psutil.Process(pid).ppid() == os.getpid()
            assert os.getsid(pid) == pid
    assert all(r.outcome == "completed" for r in results)
    assert not psutil.pid_exists(zygote_pid)
    assert not any(psutil.pid_exists(p) for p in pids)


async def test_pool_recovers_without_the_zygote() -> None:
    """If the zygote dies, replacement workers start as fresh interpreters and turns keep running."""
    async with Supervisor(workers=1, spares=0, max_turns_per_worker=1) as sup:
        assert sup.pool.zygote is not None
        with anyio.fail_after(60):
            first = await sup.run("examples.agents:echo", 1)
            os.kill(sup.pool.zygote.pid, signal.SIGKILL)
            rest = [await sup.run("examples.agents:echo", i) for i in range(2)]
    assert first.outcome == "completed" and all(r.outcome == "completed" for r in rest)
    assert len({first.worker_pid, *(r.worker_pid for r in rest)}) == 3


async def test_zygote_can_be_switched_off() -> None:
    """``zygote=False`` starts every worker as a fresh interpreter."""
    async with Supervisor(workers=1, spares=0, zygote=False) as sup:
        assert sup.pool.zygote is None
        with anyio.fail_after(30):
            result = await sup.run("examples.agents:echo", "plain")
    assert result.outcome == "completed" and result.output == "plain"


_CHILD = """
import json, os, sys, anyio
from supervisor import Supervisor
async def main():
    async with Supervisor(workers=1, spares=1) as sup:
        h = await sup.submit("examples.agents:forker", {"children": 1, "cooperative": True})
        async for ev in h.events():
            break
        pids = [*ev["children"], ev["daemon"], ev["worker"], sup.pool.zygote.pid]
        pids += [w["pid"] for w in (await sup.status())["workers"]]
        print(json.dumps(sorted(set(pids))), flush=True)
        await anyio.sleep_forever()
anyio.run(main)
"""


def test_supervisor_sigkill_leaves_no_zygote_forked_process() -> None:
    """SIGKILL of a supervisor whose workers came from the zygote: every worker, their descendants
    (including a double-forked setsid daemon) and the zygote itself go away."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert proc.stdout is not None
    try:
        pids = json.loads(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    # Orphans are re-parented to this test process (a child subreaper): wait_procs reaps them.
    _gone, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=5)
    assert [p.pid for p in alive] == []


async def test_preload_imports_agents_once_and_tolerates_a_bad_module() -> None:
    """Agents from a ``preload`` module run as usual; a preload module that cannot be imported is
    reported on the zygote's stderr and changes nothing else (workers still start, turns run)."""
    async with Supervisor(workers=1, spares=0, preload=("tests.agents", "no_such_module_here")) as sup:
        with anyio.fail_after(30):
            result = await sup.run("tests.agents:signal_state")
    assert result.outcome == "completed" and result.output["cancelled"] is False


async def test_a_crash_never_takes_the_end_of_the_turn_before_it() -> None:
    """A turn that reported Started early (a thread agent) is followed, handed ahead on the same
    worker, by one that kills the process at once: the first still ends ``completed`` (its End is
    confirmed before the next handed turn starts), the second ``crashed``. Ten pairs in a row."""
    async with Supervisor(workers=1, spares=0, **EAGER) as sup:
        await seed(sup)
        pairs = []
        for i in range(10):
            first = await sup.submit("examples.agents:echo_sync", {"i": i})
            crash = await sup.submit("examples.agents:crasher", {"code": 3})
            pairs.append((first, crash))
        with anyio.fail_after(120):
            for i, (first, crash) in enumerate(pairs):
                r1, r2 = await first.result(), await crash.result()
                assert (r1.outcome, r1.output) == ("completed", {"i": i}), r1
                assert r2.outcome == "crashed" and r2.exit_code == 3, r2


def _fd_targets(pid: int) -> dict[int, str]:
    targets = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            targets[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
    return targets


async def test_workers_forked_in_one_burst_each_hold_only_their_own_files() -> None:
    """WORKER-FORK-BATCH: a pool started at once has its workers forked in batches (more workers than one
    batch holds here), each by one intermediate child. Every worker is still our child in its own
    session, and holds only its own files: no other worker's output (which would let its agents
    write into another worker's log), start marker or End log (SEC-WORKER-FILES) is among its
    descriptors or mappings."""
    from worker.lowlevel import FORK_BATCH

    n = FORK_BATCH + 4
    async with Supervisor(workers=n, spares=0, start_timeout=120) as sup:
        assert sup.pool.ready_count() == n  # start() waits until every worker is ready
        slots = list(sup.pool.slots.values())
        outputs = {s.pid: _fd_targets(s.pid)[1] for s in slots}
        assert len(set(outputs.values())) == n, outputs  # each its own output
        for slot in slots:
            assert psutil.Process(slot.pid).ppid() == os.getpid()
            assert os.getsid(slot.pid) == slot.pid
            held = set(_fd_targets(slot.pid).values())
            others = {t for pid, t in outputs.items() if pid != slot.pid}
            assert not held & others, (slot.id, held & others)
            # Its own marker and End log are mapped and their descriptors closed; nobody else's is held.
            assert not any(re.match(r"/memfd:turnpool-w\d+-(started|ends)", t) for t in held), (slot.id, held)
            with open(f"/proc/{slot.pid}/maps") as f:  # noqa: ASYNC230 - procfs, never blocks
                mapped = {line.split("/memfd:")[1].split()[0] for line in f if "/memfd:turnpool-w" in line}
            assert mapped == {f"turnpool-{slot.id}-started", f"turnpool-{slot.id}-ends"}, (slot.id, mapped)
        with anyio.fail_after(60):
            results = [await sup.run("examples.agents:echo", i) for i in range(3)]
    assert all(r.outcome == "completed" for r in results)
