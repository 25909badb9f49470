"""Where a turnpool pool's start CPU goes, by process: ``python -m benchmarks._start_split N [MODULE ...]``
(one JSON line; MODULEs are preloaded into the zygote).

N workers (``spares=0``) are started and N ``held_stamp`` turns submitted at once; while the turns
hold their workers, every process below this one is read: each process's own run time from
``/proc/PID/schedstat`` (nanoseconds, every thread, load-independent), its page faults and, for the
zygote, what its reaped children cost (``cutime + cstime``, clock ticks: the intermediate children
that fork the workers). The supervisor's own CPU is ``getrusage`` around ``start()`` (its part of
the workers' starts: requests, directories, cgroups, descriptors, pidfds, ``Ready``) and around the
submissions. Compare ``N`` with ``1`` for the per-worker share; the zygote's imports are paid once.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import Any

import anyio
import psutil

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> dict[str, float] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        with open(f"/proc/{pid}/schedstat") as f:
            run_ns = int(f.read().split()[0])
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return {
        "run_ms": run_ns / 1e6,
        "faults": int(fields[7]),
        "children_ms": (int(fields[13]) + int(fields[14])) / TICK * 1e3,
    }


def _cpu_ms() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1e3


async def split(n: int, preload: tuple[str, ...]) -> dict[str, Any]:
    from supervisor import Supervisor

    from ._scale_curve import hold

    sup = Supervisor(workers=n, spares=0, start_timeout=600, max_queue=max(1000, 2 * n), preload=preload)
    c0 = _cpu_ms()
    await sup.start()
    c1 = _cpu_ms()
    handles = [await sup.submit("benchmarks._agents:held_stamp", {"hold": hold(n)}) for _ in range(n)]
    await anyio.sleep(hold(n) * 0.6)  # allowed: read the processes while every turn holds its worker
    c2 = _cpu_ms()
    procs = psutil.Process().children(recursive=True)
    zygote = min((p.pid for p in procs if "worker._zygote" in " ".join(p.cmdline())), default=-1)
    groups: dict[str, list[dict[str, float]]] = {"zygote": [], "watcher": [], "worker": []}
    for p in procs:
        s = _stat(p.pid)
        if s is not None:
            kind = "zygote" if p.pid == zygote else "watcher" if p.ppid() == zygote else "worker"
            groups[kind].append(s)
    for h in handles:
        await h.result()
    await sup.aclose()
    out: dict[str, Any] = {"n": n, "supervisor_start_ms": c1 - c0, "supervisor_submit_ms": c2 - c1}
    for kind, rows in groups.items():
        out[kind] = {
            "count": len(rows),
            **{k: sum(r[k] for r in rows) for k in ("run_ms", "faults", "children_ms")},
        }
    return out


if __name__ == "__main__":
    print(json.dumps(anyio.run(split, int(sys.argv[1]), tuple(sys.argv[2:]))), flush=True)
