"""Supervisor death: SIGKILL the supervisor process; timed until the last worker and descendant is gone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from worker import proctree

from ._common import ROOT, command, log, med, ms, pct, table


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return True
    return data[data.rfind(b")") + 2 : data.rfind(b")") + 3] == b"Z"


def _reap_any() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def one(workers: int) -> tuple[float, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks._death_child", str(workers)],
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    info = json.loads(proc.stdout.readline())
    pids = [p for p in info["pids"] if p != proc.pid]
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = t0 + 30
    left = set(pids)
    while left and time.monotonic() < deadline:
        left = {p for p in left if not _gone(p)}
        if left:
            time.sleep(0.0005)
    t1 = time.monotonic()
    _reap_any()  # the orphans were re-parented to us (a child subreaper): collect them
    for p in left:  # never leave anything behind, even on a failure
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    _reap_any()
    if left:
        raise RuntimeError(f"processes survived the supervisor by 30 s: {sorted(left)}")
    return t1 - t0, len(pids)


def run(quick: bool) -> str:
    proctree.set_child_subreaper()  # orphans come to us, so we can tell "gone" from "a zombie nobody reaps"
    n = 3 if quick else 12
    samples, sizes = [], []
    for _ in range(n):
        dt, size = one(2)
        samples.append(dt)
        sizes.append(size)
    log(f"turnpool: p50 {ms(med(samples))}")
    p99 = pct(samples, 99)
    rows = [["**turnpool**", f"{min(sizes)}–{max(sizes)}", len(samples), ms(med(samples)), ms(p99)]]
    return (
        "## Supervisor death\n\n"
        "A supervisor process (2 workers + 1 spare + the zygote) whose two running turns each started two "
        "grandchildren and a double-forked `setsid` daemon is killed with SIGKILL; timed until every one "
        "of those processes is gone (exited; polled every 0.5 ms). Each worker learns of the death from its "
        "parent-death signal (SIGUSR2, caught) and the life pipe, kills its own tree and exits.\n\n"
        + table(["system", "processes in the tree", "runs", "p50", "p99"], rows)
        + f"\n\nTarget: p99 ≤ 200 ms — {ms(p99)} {'met' if p99 <= 0.2 else 'MISSED'}. "
        "Peers: not measured — ProcessPoolExecutor, pebble and loky workers are not process-tree owners "
        "(a task's grandchildren outlive any of them by design), so there is no like-for-like figure."
        f"\n\nCommand: {command('death', quick)}"
    )
