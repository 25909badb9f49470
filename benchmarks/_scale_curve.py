"""The scale curve: N workers (8 … 512) started until a first task runs on each, what they cost
in CPU and memory, and how long shutting them down takes - turnpool beside ProcessPoolExecutor
(fork and forkserver), pebble and the floor (forked children of the same imports, nothing else).

Each (system, N) runs in a fresh interpreter (``python -m benchmarks._scale_curve SYSTEM N``,
one JSON line), so no run inherits another's processes or memory:

* ``start_s``: from creating the pool until the last of N tasks, submitted at once and each
  holding its process ``hold(N)`` seconds (0.5 s, N/100 s past 50), has started (its own
  ``time.monotonic()``); every task must have run in a distinct process (``distinct``);
* ``cpu_ms``: the CPU that start cost, per worker - this process and every descendant, with what
  they reaped (``/proc/PID/stat`` utime + stime + cutime + cstime), from before the pool to the
  last task's end;
* ``pss_mib``: proportional set size of every process below this one (workers, guardians,
  zygote; ``smaps_rollup``) once idle, per worker and in total; ``sup_rss_mib``: this process;
* ``close_s``: shutting the idle pool down until every process is gone (``aclose()``, or the
  peer's shutdown and join).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil

HOLD = 0.5


def hold(n: int) -> float:
    """How long each task holds its process: long enough that all N run at once, however slowly
    the pool starts its processes (forkserver's come one at a time)."""
    return max(HOLD, n / 100)


TICK = os.sysconf("SC_CLK_TCK")
SYSTEMS = ("turnpool", "turnpool-preload", "ppe-fork", "ppe-forkserver", "pebble", "forked")


def _cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return 0
    fields = data[data.rfind(b")") + 2 :].split()
    return sum(int(x) for x in fields[11:15])  # utime stime cutime cstime


def _tree() -> list[int]:
    return [p.pid for p in psutil.Process().children(recursive=True)]


def tree_cpu_s() -> float:
    return sum(_cpu_ticks(p) for p in [os.getpid(), *_tree()]) / TICK


def pss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


def _measure(
    n: int, start: Callable[[], tuple[list[tuple[int, float]], Callable[[], None]]]
) -> dict[str, Any]:
    cpu0 = tree_cpu_s()
    t0 = time.monotonic()
    stamps, close = start()
    cpu = tree_cpu_s() - cpu0
    start_s = max(t for _, t in stamps) - t0
    time.sleep(1.0)  # allowed: let the pool go idle before its memory is read
    pids = _tree()
    pss = pss_bytes(pids)
    rss = psutil.Process().memory_info().rss
    t1 = time.monotonic()
    close()
    close_s = time.monotonic() - t1
    return {
        "n": n,
        "start_s": start_s,
        "distinct": len({p for p, _ in stamps}),
        "cpu_ms": cpu / n * 1e3,
        "pss_mib": pss / n / 2**20,
        "pool_mib": pss / 2**20,
        "procs": len(pids),
        "sup_rss_mib": rss / 2**20,
        "close_s": close_s,
        "left": len(_tree()),
    }


def _turnpool(n: int, preload: tuple[str, ...] = ()) -> dict[str, Any]:
    import anyio

    from supervisor import Supervisor

    box: dict[str, Any] = {}

    async def main() -> None:
        sup = Supervisor(workers=n, spares=0, start_timeout=600, max_queue=max(1000, 2 * n), preload=preload)
        stamps: list[tuple[int, float]] = []

        def start() -> tuple[list[tuple[int, float]], Callable[[], None]]:
            return stamps, lambda: None

        cpu0 = tree_cpu_s()
        t0 = time.monotonic()
        await sup.start()
        handles = [await sup.submit("benchmarks._agents:held_stamp", {"hold": hold(n)}) for _ in range(n)]
        for h in handles:
            out = (await h.result()).output
            stamps.append((out["pid"], out["t"]))
        cpu = tree_cpu_s() - cpu0
        await anyio.sleep(1.0)  # allowed: let the pool go idle before its memory is read
        pids = _tree()
        pss = pss_bytes(pids)
        rss = psutil.Process().memory_info().rss
        t1 = time.monotonic()
        await sup.aclose()
        close_s = time.monotonic() - t1
        box.update(
            n=n,
            start_s=max(t for _, t in stamps) - t0,
            distinct=len({p for p, _ in stamps}),
            cpu_ms=cpu / n * 1e3,
            pss_mib=pss / n / 2**20,
            pool_mib=pss / 2**20,
            procs=len(pids),
            sup_rss_mib=rss / 2**20,
            close_s=close_s,
            left=len(_tree()),
        )

    anyio.run(main)
    return box


def _ppe(n: int, method: str) -> dict[str, Any]:
    import concurrent.futures as cf
    import multiprocessing

    from . import _tasks

    def start() -> tuple[list[tuple[int, float]], Callable[[], None]]:
        ex = cf.ProcessPoolExecutor(n, mp_context=multiprocessing.get_context(method))
        futs = [ex.submit(_tasks.held_stamp, hold(n)) for _ in range(n)]
        return [f.result() for f in futs], lambda: ex.shutdown(wait=True)

    return _measure(n, start)


def _pebble(n: int) -> dict[str, Any]:
    import pebble

    from . import _tasks

    def start() -> tuple[list[tuple[int, float]], Callable[[], None]]:
        pool = pebble.ProcessPool(max_workers=n)
        futs = [pool.schedule(_tasks.held_stamp, args=(hold(n),)) for _ in range(n)]
        stamps = [f.result() for f in futs]

        def close() -> None:
            pool.close()
            pool.join()

        return stamps, close

    return _measure(n, start)


def _forked(n: int) -> dict[str, Any]:
    """The floor: this process imported what a worker imports, then forks N children that each
    report their start and wait for EOF on a pipe - no pool, no protocol, no guardian."""
    import anyio  # noqa: F401
    import msgspec  # noqa: F401
    import zmq  # noqa: F401

    import supervisor  # noqa: F401
    import worker  # noqa: F401

    def start() -> tuple[list[tuple[int, float]], Callable[[], None]]:
        stop_r, stop_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pids = []
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(stop_w)
                    os.close(rep_r)
                    os.write(rep_w, f"{os.getpid()} {time.monotonic()}\n".encode())
                    os.read(stop_r, 1)
                finally:
                    os._exit(0)
            pids.append(pid)
        os.close(rep_w)
        os.close(stop_r)
        buf = b""
        while buf.count(b"\n") < n:
            buf += os.read(rep_r, 65536)
        os.close(rep_r)
        stamps = [(int(a), float(b)) for a, b in (ln.split() for ln in buf.decode().splitlines())]

        def close() -> None:
            os.close(stop_w)
            for pid in pids:
                os.waitpid(pid, 0)

        return stamps, close

    return _measure(n, start)


def one(system: str, n: int) -> dict[str, Any]:
    if system == "turnpool":
        out = _turnpool(n)
    elif system == "turnpool-preload":
        # The agent's module imported once, in the zygote: what a worker of a peer gets by fork.
        out = _turnpool(n, preload=("benchmarks._agents",))
    elif system.startswith("ppe-"):
        out = _ppe(n, system[4:])
    elif system == "pebble":
        out = _pebble(n)
    elif system == "forked":
        out = _forked(n)
    else:
        raise ValueError(system)
    out["system"] = system
    return out


def fresh(system: str, n: int, timeout: float = 900) -> dict[str, Any]:
    """``one(system, n)`` in a fresh interpreter; ``{"error": ...}`` if it failed."""
    from ._common import fresh_json

    try:
        return fresh_json("_scale_curve", system, str(n), timeout=timeout)
    except RuntimeError as exc:
        return {"system": system, "n": n, "error": str(exc)}


if __name__ == "__main__":
    print(json.dumps(one(sys.argv[1], int(sys.argv[2]))), flush=True)
