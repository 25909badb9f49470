"""TREE-WATCHER: the workers a zygote forks are watched by one process of the pool, not by a guardian
process each (what each guardian promised is proven in test_supervisor_death.py and
test_tree_cleanup.py, which run with the zygote by default)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys

import anyio
import psutil
import pytest

from supervisor import Supervisor

pytestmark = pytest.mark.anyio


async def test_zygote_forked_workers_share_one_watcher_and_fork_no_guardian() -> None:
    with anyio.fail_after(60):
        async with Supervisor(workers=4, spares=0) as sup:
            assert sup.pool.zygote is not None
            workers = [w["pid"] for w in (await sup.status())["workers"]]
            assert len(workers) == 4
            for pid in workers:
                assert psutil.Process(pid).children() == [], "a worker forked a guardian"
            # (Besides it, the zygote may have a short-lived child: the fork of its next embryo.)
            children = {c.pid for c in psutil.Process(sup.pool.zygote.pid).children()}
            watchers = children & sup.pool.zygote.embryos  # reaped with the embryos at the end
            assert len(watchers) == 1, (children, sup.pool.zygote.embryos)
            watcher = watchers.pop()
        assert not psutil.pid_exists(watcher)


async def test_workers_started_as_fresh_interpreters_keep_their_guardian() -> None:
    with anyio.fail_after(60):
        async with Supervisor(workers=2, spares=0, zygote=False) as sup:
            for w in (await sup.status())["workers"]:
                assert len(psutil.Process(w["pid"]).children()) == 1  # its guardian


# ---- the supervisor's death, seen by the watcher alone (real processes, no pool) ---------------------

HAVE_AUTOGROUP = os.path.exists("/proc/self/autogroup")

# A worker as the watcher knows it: it leads its session, that session's autogroup at the pool's lightest
# weight (WORKER-CPU-SHARE: 19 past 205 workers), with a plain child; "stopped": it stops itself, as a worker
# that took its baton and then got no CPU time would never finish killing its tree.
FAKE_WORKER = r"""
import os, signal, sys
with open("/proc/self/autogroup", "w") as f:
    f.write("19")
child = os.fork()
if child == 0:
    while True:
        signal.pause()
print(child, flush=True)
if sys.argv[1] == "stopped":
    os.kill(os.getpid(), signal.SIGSTOP)
while True:
    signal.pause()
"""

# The watcher's reaction to the supervisor's death for that one worker, with ``KILL_WAIT`` given: what it
# does before the sweep is what the tests look at.
RUN_WATCHER = r"""
import json, sys
from worker.lowlevel import watcher_supervisor_gone
read = watcher_supervisor_gone(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
print(json.dumps(read), flush=True)
"""


def _baton(taken: bool) -> int:
    """A baton's read end (non-blocking), as the watcher holds it: empty when the worker took it."""
    r, w = os.pipe()
    os.write(w, b"x")
    os.close(w)
    if taken:
        os.read(r, 1)
    return r


def _until_exited(pid: int, bound: float = 30.0) -> None:
    """Wait (bounded) for ``pid`` (our child) to exit, leaving it a zombie: its /proc entry stays."""
    fd = os.pidfd_open(pid)
    try:
        assert select.select([fd], [], [], bound)[0], f"{pid} still running after {bound} s"
    finally:
        os.close(fd)


def _supervisor_gone(mode: str, *, taken: bool, kill_wait: float) -> tuple[str, list[int]]:
    """Start a fake worker, run the watcher's reaction to the supervisor's death on it; the worker's
    autogroup line, read once it has exited (before it is reaped), and the pids whose tree markers
    the watcher's sweep read. Its plain child must exit too."""
    worker = subprocess.Popen(
        [sys.executable, "-c", FAKE_WORKER, mode], stdout=subprocess.PIPE, start_new_session=True
    )
    assert worker.stdout is not None
    child = int(worker.stdout.readline())
    baton = _baton(taken)
    watcher = subprocess.Popen(
        [sys.executable, "-c", RUN_WATCHER, str(worker.pid), str(baton), str(kill_wait), "no-such-marker"],
        pass_fds=[baton],
        stdout=subprocess.PIPE,
    )
    os.close(baton)
    try:
        _until_exited(worker.pid)
        with open(f"/proc/{worker.pid}/autogroup") as f:  # a zombie still names its session's group
            group = f.read()
        _until_exited(child)  # re-parented to this process (a child subreaper: conftest)
        assert watcher.stdout is not None
        read = json.loads(watcher.stdout.readline())
        return group, read
    finally:
        for proc in (watcher, worker):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        worker.stdout.close()
        if watcher.stdout is not None:
            watcher.stdout.close()
        with contextlib.suppress(OSError):  # (a test that failed left it running)
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)


def test_the_watcher_kills_the_tree_of_a_worker_that_took_its_baton() -> None:
    """TREE-WATCHER: a worker that took its baton first (its parent-death signal ran before the
    watcher's EOF) but gets no CPU time to finish - at the pool's lightest weight on a loaded machine that
    took up to 10.5 s, 256 workers after a host's SIGKILL - is killed by the watcher at once, not only by
    the sweep after ``KILL_WAIT``. (Fails before: the watcher stood by, so the worker lived until the
    sweep, here an hour away.)"""
    assert _supervisor_gone("stopped", taken=True, kill_wait=3600)[0]


@pytest.mark.skipif(not HAVE_AUTOGROUP, reason="no autogroups on this kernel")
def test_a_dead_supervisors_workers_die_at_their_default_weight() -> None:
    """WORKER-SHARE-AT-DEATH: when the supervisor dies, the watcher gives each worker's autogroup niceness 0
    back before it kills the tree: their exits (the kernel's teardown of each process's memory, which runs
    at the process's own weight) must not queue behind a loaded machine at the pool's lightest weight.
    (Fails before: the worker died at niceness 19.)"""
    group, _ = _supervisor_gone("running", taken=False, kill_wait=30)
    assert group.split()[-1] == "0", group


def test_the_sweep_reads_the_markers_only_of_processes_younger_than_its_workers() -> None:
    """TREE-SWEEP-YOUNG: after the supervisor's death the watcher's sweep reads tree markers (environment,
    descriptors, memory map: about 1 ms of CPU a process) only of processes started since its first worker,
    each once. (Fails before: it read every process on the machine, init and this one too, once per
    round: 4.1 s for the two rounds of a daemon's watcher at load 140-280 among 3,300 processes.)"""
    _, read = _supervisor_gone("running", taken=False, kill_wait=30)
    assert 1 not in read and os.getpid() not in read, "it read processes older than the worker"
    assert len(read) == len(set(read)), "it read a process twice"
