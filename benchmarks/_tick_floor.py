"""The machine's floor for many streaming turns at once, measured in the same run as the
200-streams row: ``n`` bare Python processes (asyncio, one ZeroMQ DEALER each, nothing of
turnpool) each sending ``time.monotonic()`` ``rate`` times a second, one ROUTER reading them all
in a plain blocking loop. Emit → receive latency and the senders' CPU per event: what any design
built on these parts pays on this machine before doing anything else.

``sessions``: the floor weighed as turnpool's pool is. By default every sender is a forked child in
the benchmark's session, so with autogroups (``sched_autogroup_enabled=1``) the senders and the reader
are one scheduling group; a turnpool worker leads a session of its own (an autogroup each, at the
pool's niceness: WORKER-CPU-SHARE) and its supervisor weighs its own session's group (raised where it
leads it and may: WORKER-SUPERVISOR-WEIGHT). With ``sessions`` each sender calls ``setsid`` and sets
its autogroup to that niceness, and the reader's session is raised as a supervisor's would be."""

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


def _autogroup_nice() -> int | None:
    try:
        with open("/proc/self/autogroup") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _sender(endpoint: str, rate: float, seconds: float, nice: int | None) -> None:
    if nice is not None:  # ``sessions``: a session and an autogroup of its own, as a worker has
        os.setsid()
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))

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


def tickers(n: int, rate: float, seconds: float, *, sessions: bool = False) -> dict[str, Any]:
    """``lat``: emit → receive seconds of every event; ``cpu_us``: the senders' mean CPU per event
    (µs, all their threads); ``reader_us``: the reader's CPU per event (µs, its loop and ZeroMQ's I/O
    thread, from the go to the last event); ``rate``: events received per second over that time;
    ``start_s``: until every sender was up; ``reader_nice``: the reader's autogroup niceness while
    it read (``sessions``: raised where this process leads its session and may)."""
    from supervisor.lowlevel import OwnWeight, autogroup_nice, own_nice, pool_weight

    own = OwnWeight()
    if sessions:
        own.hold(0, own_nice(pool_weight(n)))
    d = tempfile.mkdtemp(prefix="tp-tick-")
    endpoint = f"ipc://{d}/s"
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    r.bind(endpoint)
    t0 = time.monotonic()
    mp = multiprocessing.get_context("fork")
    nice = autogroup_nice(n) if sessions else None
    procs = [mp.Process(target=_sender, args=(endpoint, rate, seconds, nice)) for _ in range(n)]
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
        reader_nice = _autogroup_nice()
    finally:
        own.release(0)
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        r.close(0)
        ctx.term()
        shutil.rmtree(d, ignore_errors=True)
    cpu_us = sum(cpu) / len(cpu) / 1e3
    return {
        "lat": lat,
        "cpu_us": cpu_us,
        "start_s": start_s,
        "reader_us": reader_us,
        "rate": delivered,
        "reader_nice": reader_nice,
    }
