"""The machine's floor for many streaming turns at once, measured in the same run as the
200-streams row: ``n`` bare Python processes (asyncio, one ZeroMQ DEALER each, nothing of
turnpool) each sending ``time.monotonic()`` ``rate`` times a second, one ROUTER reading them all
in a plain blocking loop. Emit → receive latency and the senders' CPU per event: what any design
built on these parts pays on this machine before doing anything else."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import tempfile
import time
from typing import Any

import zmq


def _cpu_ns() -> int:
    """CPU time of every thread of this process, in ns (``/proc/self/task/*/schedstat``)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


def _sender(endpoint: str, rate: float, seconds: float) -> None:
    async def main() -> None:
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.connect(endpoint)
        s.send(b"hi")
        s.recv()  # go: every sender is up
        cpu0 = _cpu_ns()
        period, n = 1.0 / rate, int(rate * seconds)
        start = time.monotonic()
        for i in range(n):
            delay = start + i * period - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            s.send(repr(time.monotonic()).encode(), zmq.NOBLOCK)
        s.send(b"cpu " + str((_cpu_ns() - cpu0) / n).encode())
        s.close(linger=1000)
        ctx.term()

    asyncio.run(main())


def tickers(n: int, rate: float, seconds: float) -> dict[str, Any]:
    """``lat``: emit → receive seconds of every event; ``cpu_us``: the senders' mean CPU per event
    (µs, all their threads); ``reader_us``: the reader's CPU per event (µs, its loop and ZeroMQ's I/O
    thread, from the go to the last event); ``rate``: events received per second over that time;
    ``start_s``: until every sender was up."""
    d = tempfile.mkdtemp(prefix="tp-tick-")
    endpoint = f"ipc://{d}/s"
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    r.bind(endpoint)
    t0 = time.monotonic()
    mp = multiprocessing.get_context("fork")
    procs = [mp.Process(target=_sender, args=(endpoint, rate, seconds)) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        idents = [r.recv_multipart()[0] for _ in range(n)]
        start_s = time.monotonic() - t0
        for ident in idents:
            r.send_multipart([ident, b"go"])
        lat: list[float] = []
        cpu: list[float] = []
        go = time.monotonic()
        reader0 = time.thread_time()  # the reader's own CPU: this loop (and its ZeroMQ I/O thread's below)
        io0 = _cpu_ns() - int(reader0 * 1e9)
        while len(cpu) < n:
            _, body = r.recv_multipart()
            now = time.monotonic()
            if body.startswith(b"cpu "):
                cpu.append(float(body[4:]))
            else:
                lat.append(now - float(body))
        delivered = len(lat) / (time.monotonic() - go)
        reader_s = time.thread_time() - reader0
        io_s = (_cpu_ns() - io0) / 1e9 - time.thread_time()  # the other threads: ZeroMQ's I/O thread
        reader_us = (reader_s + max(0.0, io_s)) / max(1, len(lat)) * 1e6
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        r.close(0)
        ctx.term()
        shutil.rmtree(d, ignore_errors=True)
    cpu_us = sum(cpu) / len(cpu) / 1e3
    return {"lat": lat, "cpu_us": cpu_us, "start_s": start_s, "reader_us": reader_us, "rate": delivered}
