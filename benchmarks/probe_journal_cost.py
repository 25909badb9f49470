"""What the journal costs the daemon, per turn: journal off vs on, back to back (issue 16).

20,000 no-op turns (``--n``), 1 ``Client`` through ``submit_many`` + ``results``, 2 workers,
``benchmarks.bench_production._daemon`` against ``turnpool serve --no-journal`` and then
``--journal PATH``, ``--rounds`` times. Besides acks/s and turns/s it reads the CPU (``/proc``)
of the daemon, of its journal writer process, of the workers and of this client over each
measured run, per turn, and how busy the machine's cores were (all of them together). Prints each
round and the medians with the on/off ratios.

    .venv/bin/python -m benchmarks.probe_journal_cost --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import time
from typing import Any

import psutil

from .bench_production import _cpu, _daemon, _serve_opts


def _writer(pid: int) -> int | None:
    for child in psutil.Process(pid).children():
        if any("journal/writer.py" in part for part in child.cmdline()):
            return child.pid
    return None


async def _one(n: int, journal: bool) -> dict[str, float]:
    from tests.support import daemonkit

    home = daemonkit.short_dir()
    flag = ("--journal", str(home / "j.sqlite3")) if journal else ("--no-journal",)
    try:
        with daemonkit.serving(*_serve_opts(n), *flag) as served:
            writer = _writer(served.pid) if journal else None
            await _daemon(served.endpoint, 1, 200)  # warm: workers up, imports done
            workers = [c.pid for c in psutil.Process(served.pid).children() if c.pid != writer]
            d0 = _cpu(served.pid)
            w0 = _cpu(writer) if writer else 0.0
            k0 = sum(_cpu(p) for p in workers)
            c0 = _cpu(os.getpid())
            t0 = time.perf_counter()
            acks, turns = await _daemon(served.endpoint, 1, n)
            wall = time.perf_counter() - t0
            d1 = _cpu(served.pid)
            w1 = _cpu(writer) if writer else 0.0
            k1 = sum(_cpu(p) for p in workers)
            c1 = _cpu(os.getpid())
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return {
        "acks": acks,
        "turns": turns,
        "daemon_us": (d1 - d0) / n * 1e6,
        "writer_us": (w1 - w0) / n * 1e6,
        "workers_us": (k1 - k0) / n * 1e6,
        "client_us": (c1 - c0) / n * 1e6,
        "busy": ((d1 - d0) + (w1 - w0) + (k1 - k0) + (c1 - c0)) / (wall * (os.cpu_count() or 1)),
    }


async def main(n: int, rounds: int) -> None:
    rows: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for r in range(rounds):
        for mode in ("off", "on"):
            got = await _one(n, mode == "on")
            rows[mode].append(got)
            print(
                f"round {r} {mode:3}: acks {got['acks']:9.0f}/s turns {got['turns']:8.0f}/s"
                f" daemon {got['daemon_us']:5.1f} us/turn writer {got['writer_us']:5.1f} us/turn"
                f" workers {got['workers_us']:5.1f} client {got['client_us']:5.1f}"
                f" cores busy {100 * got['busy']:3.0f}%",
                flush=True,
            )

    def med(mode: str, key: str) -> float:
        return statistics.median(x[key] for x in rows[mode])

    out: dict[str, Any] = {m: {k: med(m, k) for k in rows[m][0]} for m in rows}
    for m in ("off", "on"):
        v = out[m]
        print(
            f"median {m:3}: acks {v['acks']:9.0f}/s turns {v['turns']:8.0f}/s"
            f" daemon {v['daemon_us']:5.1f} us/turn writer {v['writer_us']:5.1f} us/turn"
            f" workers {v['workers_us']:5.1f} client {v['client_us']:5.1f} cores busy {100 * v['busy']:3.0f}%"
        )
    ratios_a = [on["acks"] / off["acks"] for on, off in zip(rows["on"], rows["off"], strict=True)]
    ratios_t = [on["turns"] / off["turns"] for on, off in zip(rows["on"], rows["off"], strict=True)]
    print(
        f"on/off (median of per-round ratios): acks {statistics.median(ratios_a):.2f}x"
        f" turns {statistics.median(ratios_t):.2f}x"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.rounds))
