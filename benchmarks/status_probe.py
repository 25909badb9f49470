"""Where one ``status()`` of a daemon with many busy workers goes:
``python -m benchmarks.status_probe --workers 1000 --seconds 60`` (under the bench lock).

A ``turnpool serve`` with ``--workers`` workers, each running ``benchmarks._agents:ticker`` (an event a
second) followed by one ``Client``, as in ``make soak-thousand``. ``status()`` is asked every second by
that client and by a second one on its own connection in another process. The daemon runs with
``benchmarks/_status_site`` on its path, which times its side of each answer (``sitecustomize.py``).
Printed: each leg's wall time (client send → the daemon reads it → its reply flushed → the caller has
it), the daemon's CPU per answer (handler, building, encoding), the memory samples' CPU, and the
daemon's and the client's CPU and time spent waiting for a CPU (``/proc/PID/schedstat``) — so the
daemon's own work shows apart from waiting. Nothing is asserted (figures for benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from supervisor import Client

from ._common import pct
from .soak_thousand import AGENT, serve_options

SITE = str(Path(__file__).with_name("_status_site"))
ROOT = str(Path(__file__).resolve().parents[1])


def _sched(pid: int) -> tuple[float, float, float]:
    """(CPU seconds of its main thread, seconds it waited for a CPU, now)."""
    with open(f"/proc/{pid}/schedstat") as f:
        run, wait, _ = f.read().split()
    return int(run) / 1e9, int(wait) / 1e9, time.monotonic()


async def _poll(endpoint: str, seconds: float) -> list[str]:
    lines = []
    async with Client.connect(endpoint, timeout=600) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            await client.status()
            lines.append(f"t_send={t0:.6f} t_back={time.monotonic():.6f}")
            await anyio.sleep(1.0)  # allowed: the sampling period
    return lines


def _fields(line: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"(\w+)=([-\d.]+)", line)}


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


async def _drive(endpoint: str, workers: int, seconds: float, own: list[tuple[float, float]]) -> None:
    """``workers`` ticker turns followed by one client, which asks ``status()`` every second meanwhile."""
    async with Client.connect(endpoint, timeout=600) as client:

        async def one() -> None:
            handle = await client.submit(AGENT, {"rate": 1.0, "seconds": seconds})
            async for _ in handle.events():
                pass
            await handle.result()

        async def sampler() -> None:
            while True:
                await anyio.sleep(1.0)  # allowed: the sampling period
                t0 = time.monotonic()
                await client.status()
                own.append((t0, time.monotonic()))

        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler)
            async with anyio.create_task_group() as turns:
                for _ in range(workers):
                    turns.start_soon(one)
            tg.cancel_scope.cancel()


def probe(workers: int, seconds: float) -> dict[str, Any]:
    from tests.support import daemonkit

    daemonkit.READY_TIMEOUT = max(daemonkit.READY_TIMEOUT, 60.0 + workers * 0.5)
    work = Path(tempfile.mkdtemp(prefix="tpprobe"))
    answers, polled = work / "daemon.txt", work / "poller.txt"
    env = {"PYTHONPATH": SITE, "TURNPOOL_STATUS_PROBE": str(answers)}
    opts = serve_options(workers)
    own: list[tuple[float, float]] = []
    load = [_loadavg()]
    with daemonkit.serving(*opts, env_extra=env) as served:
        argv = [sys.executable, "-m", "benchmarks.status_probe", "--poll", served.endpoint, str(seconds)]
        with polled.open("w") as sink:
            poller = subprocess.Popen(argv, cwd=ROOT, stdout=sink)
            d0, c0 = _sched(served.pid), _sched(os.getpid())
            anyio.run(_drive, served.endpoint, workers, seconds, own)
            d1, c1 = _sched(served.pid), _sched(os.getpid())
            poller.wait(timeout=120)
    load.append(_loadavg())
    text = answers.read_text().splitlines()
    rows = [_fields(line) for line in text if line.startswith("answer")]
    samples = [_fields(line) for line in text if line.startswith("sample ")]
    theirs = [(f["t_send"], f["t_back"]) for f in map(_fields, polled.read_text().splitlines()) if f]
    shutil.rmtree(work, ignore_errors=True)
    out: dict[str, Any] = {"workers": workers, "seconds": seconds, "load": load, "samples": samples}
    for who, calls in (("follower's client", own), ("a client of its own", theirs)):
        legs: dict[str, list[float]] = {"wall": [], "up": [], "daemon": [], "back": []}
        for t_send, t_back in calls:
            match = [r for r in rows if t_send <= r["t_in"] <= t_back]
            if not match:
                continue
            r = match[0]
            legs["wall"].append(t_back - t_send)
            legs["up"].append(r["t_in"] - t_send)
            legs["daemon"].append(r["t_out"] - r["t_in"])
            legs["back"].append(t_back - r["t_out"])
        out[who] = legs
    for key in ("handle_cpu", "build_cpu", "encode_cpu"):
        out[key] = [r[key] / 1e3 for r in rows]
    out["bytes"] = max((r["bytes"] for r in rows), default=0)
    for who, a, b in (("daemon", d0, d1), ("client", c0, c1)):
        span = b[2] - a[2]
        out[f"{who}_cpu"] = (b[0] - a[0]) / span
        out[f"{who}_wait"] = (b[1] - a[1]) / span
    return out


def report(r: dict[str, Any]) -> str:
    ms = "{:.1f}".format
    lines = [
        f"`python -m benchmarks.status_probe --workers {r['workers']} --seconds {r['seconds']:g}` "
        f"(load {r['load'][0]} → {r['load'][1]}):",
        "",
        "| asked by | n | wall p50 / p99 | client → daemon reads it | read → reply flushed "
        "| flushed → caller |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for who in ("follower's client", "a client of its own"):
        legs = r[who]
        cells = [f"{ms(pct(legs[k], 50) * 1e3)} / {ms(pct(legs[k], 99) * 1e3)} ms" for k in legs]
        lines.append(f"| {who} | {len(legs['wall'])} | " + " | ".join(cells) + " |")
    cpu = ", ".join(
        f"{k.replace('_cpu', '')} p50 {ms(pct(r[k], 50) * 1e3)} ms"
        for k in ("handle_cpu", "build_cpu", "encode_cpu")
    )
    sampled = "; ".join(f"{s['workers']:.0f} workers, {s['cpu'] / 1e3:.2f} s CPU" for s in r["samples"])
    lines += [
        "",
        f"- the daemon's CPU per answer ({r['bytes']:,.0f} bytes): {cpu}",
        f"- memory samples in the run: {sampled or 'none'}",
        f"- the daemon's loop thread: {r['daemon_cpu']:.3f} s of CPU and {r['daemon_wait']:.3f} s waiting "
        f"for a CPU per second; the client's: {r['client_cpu']:.3f} and {r['client_wait']:.3f}",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.status_probe")
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--poll", nargs=2, metavar=("ENDPOINT", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.poll:
        print("\n".join(anyio.run(_poll, args.poll[0], float(args.poll[1]))))
        return
    print(report(probe(args.workers, args.seconds)))


if __name__ == "__main__":
    main()
