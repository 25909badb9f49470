"""What ``aclose()`` of N idle workers costs, in figures a loaded machine does not bend much: the
supervisor's own CPU, and each worker's CPU from the moment the close began until it was reaped
(its ``schedstat`` before, ``os.wait4``'s rusage at the reap), beside the wall time and the load.

Run one size in a fresh interpreter: ``python -m benchmarks._close_cost 512`` (one JSON line).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

import anyio

from supervisor import Supervisor
from supervisor.lowlevel import procs

from ._common import fresh_json, med


def _thread_cpu_s(pid: int) -> float:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(n: int) -> dict[str, Any]:
    reaped: dict[int, float] = {}

    def reap(pid: int) -> int | None:  # the pool's reap, keeping the child's rusage
        try:
            got, status, usage = os.wait4(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if got == 0:
            return None
        reaped[pid] = usage.ru_utime + usage.ru_stime
        return os.waitstatus_to_exitcode(status)

    procs.reap = reap
    sup = Supervisor(workers=n, spares=0, start_timeout=600)
    await sup.start()
    with anyio.fail_after(600):
        while True:
            workers = (await sup.status())["workers"]
            if sum(1 for w in workers if w["state"] == "idle" and w["pid"]) >= n:
                break
            await anyio.sleep(0.2)  # allowed: a bounded poll until every worker is idle
    await anyio.sleep(1.0)  # allowed: the start's last work settles
    before = {w["pid"]: _thread_cpu_s(w["pid"]) for w in workers}
    load = os.getloadavg()[0]
    cpu0, t0 = _own_cpu_s(), time.monotonic()
    await sup.aclose()
    wall, cpu = time.monotonic() - t0, _own_cpu_s() - cpu0
    exits = [(reaped[p] - before[p]) * 1e3 for p in before if p in reaped]
    return {
        "n": n,
        "close_s": wall,
        "supervisor_ms_per_worker": cpu / n * 1e3,
        "worker_exit_ms": med(exits),
        "load": [load, os.getloadavg()[0]],
    }


def fresh(n: int) -> dict[str, Any]:
    """``measure(n)`` in a fresh interpreter."""
    return fresh_json("_close_cost", str(n))


if __name__ == "__main__":
    print(json.dumps(anyio.run(measure, int(sys.argv[1]))))
