"""Event streaming: one turn emitting 200k small events, followed by an embedded follower.

The agent (``benchmarks._agents:burst``) awaits ``turn.emit({"i": i})`` 200,000 times as fast as
it can; a follower iterates ``handle.events()`` from the submit on. Timed from the submit until
the follower's iteration ends (the turn ended and every event it kept was read). The follower
counts the events it got, checks they come in order, and counts ``EventsDropped`` markers: a
follower that keeps up must get every event and no marker.

In the same run: the floor (ZeroMQ alone: a forked process sends the same 200,000 frames
DEALER → ROUTER over ipc, one event per frame as the worker does, and this process receives
them) and a follower that stops reading after the first event until the turn has ended (it
must get one marker saying exactly how many events it lost, then the rest in order).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

import anyio
import zmq

import wire
from supervisor import EventsDropped, Supervisor
from wire import worker_link

from ._common import command, log, med, rate, table

TARGET = 150_000


def _count(events: list[Any], n: int) -> tuple[int, int, int, bool]:
    """(events got, events lost, markers, in order) of one follower's list."""
    got = markers = 0
    expected = 0
    in_order = True
    for e in events:
        if isinstance(e, EventsDropped):
            markers += 1
            if e.first != expected:
                in_order = False
            expected = e.first + e.count
            continue
        if e["i"] != expected:
            in_order = False
        expected = e["i"] + 1
        got += 1
    return got, n - got, markers, in_order


async def _follow(n: int, repeats: int) -> list[tuple[float, int, int, int, bool]]:
    out = []
    async with Supervisor(workers=2, spares=0) as sup:
        await sup.run("benchmarks._agents:burst", {"n": 100})  # warm: the agent imported
        for _ in range(repeats):
            t0 = time.perf_counter()
            handle = await sup.submit("benchmarks._agents:burst", {"n": n})
            events = [e async for e in handle.events()]
            t1 = time.perf_counter()
            result = await handle.result()
            assert result.outcome == "completed", result
            out.append((t1 - t0, *_count(events, n)))
    return out


async def _stopped_reading(n: int) -> tuple[int, int, int, bool, Any]:
    """A follower that reads the first event, then nothing until the turn has ended."""
    async with Supervisor(workers=1, spares=0) as sup:
        handle = await sup.submit("benchmarks._agents:burst", {"n": n})
        events = handle.events()
        first = await events.__anext__()
        await handle.result()
        rest = [e async for e in events]
    got, lost, markers, ordered = _count([first, *rest], n)
    marker = next((e for e in rest if isinstance(e, EventsDropped)), None)
    return got, lost, markers, ordered, marker


def _zmq_floor(n: int) -> float:
    """Events per second ZeroMQ alone carries one way here: a forked sender, this process reads."""
    tmp = tempfile.mkdtemp(prefix="tp-bench-stream-")
    endpoint = f"ipc://{tmp}/floor.sock"
    frames = [
        worker_link.encode_frame([worker_link.Event("t-1", wire.encode_payload({"i": i}))]) for i in range(64)
    ]
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the sender: its own context, created after the fork
        try:
            os.close(ready_r)
            ctx = zmq.Context()
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.IDENTITY, b"w1")
            s.connect(endpoint)
            os.write(ready_w, b"r")
            noblock = int(zmq.NOBLOCK)
            for i in range(n):
                s.send(frames[i & 63], noblock)
            s.close(linger=-1)
            ctx.term()
        finally:
            os._exit(0)
    os.close(ready_w)
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.RCVHWM, 0)
    r.bind(endpoint)
    try:
        os.read(ready_r, 1)
        got = 0
        r.recv()  # the first frame starts the clock (connection set-up is not carried load)
        r.recv()
        t0 = time.perf_counter()
        recv = r.recv
        while got < n - 1:
            recv()
            recv()
            got += 1
        dt = time.perf_counter() - t0
    finally:
        os.close(ready_r)
        os.waitpid(pid, 0)
        r.close(linger=0)
        ctx.term()
        os.rmdir(tmp) if not os.listdir(tmp) else None
    return (n - 1) / dt


def run(quick: bool) -> str:
    n, repeats = (20_000, 2) if quick else (200_000, 5)
    floors = []
    samples: list[tuple[float, int, int, int, bool]] = []
    for _ in range(repeats):  # the floor and turnpool back to back, each repeat
        floors.append(_zmq_floor(n))
        samples += anyio.run(_follow, n, 1)
    rates = [n / s[0] for s in samples]
    lost = sum(s[2] for s in samples)
    markers = sum(s[3] for s in samples)
    ordered = all(s[4] for s in samples)
    log(
        f"follower: median {med(rates):,.0f} events/s, lost {lost}, markers {markers}; "
        f"zmq {med(floors):,.0f}/s"
    )
    got, slost, smarkers, sordered, marker = anyio.run(_stopped_reading, n)
    rows = [
        [
            "**turnpool**: `handle.events()` of the turn, reading the whole time",
            f"{n:,} × {repeats}",
            rate(med(rates)),
            rate(min(rates)),
            f"{lost} lost, {markers} markers, {'in order' if ordered else 'OUT OF ORDER'}",
        ],
        [
            "floor: ZeroMQ alone, DEALER → ROUTER over ipc, one event per frame",
            f"{n:,} × {repeats}",
            rate(med(floors)),
            rate(min(floors)),
            "—",
        ],
        [
            "turnpool, a follower that stops reading after the first event until the turn ends",
            f"{n:,}",
            "—",
            "—",
            f"got {got:,}, {smarkers} marker ({marker!r}), {slost:,} lost = the marker's count: "
            f"{'yes' if marker is not None and marker.count == slost else 'NO'}; "
            f"{'in order' if sordered else 'OUT OF ORDER'}",
        ],
    ]
    ok = med(rates) >= TARGET and lost == 0 and markers == 0 and ordered
    return (
        "## Event streaming: one turn, 200k small events, an embedded follower\n\n"
        f'One turn awaits `turn.emit({{"i": i}})` {n:,} times as fast as it can (2 workers); a '
        "follower iterates `handle.events()` from the submit until the iteration ends. Events/s = "
        "events ÷ (submit → the follower's last event); median and slowest of the repeats, each "
        "back to back with the floor. `emit` puts each event on the wire before it returns (one "
        "frame per event), so the floor sends one event per frame too.\n\n"
        + table(["follower", "events", "events/s (median)", "slowest", "lost / markers"], rows)
        + f"\n\nTurnpool ÷ ZeroMQ floor: **{med(rates) / med(floors):.2f}×**.\n\n"
        f"Target: ≥ {TARGET:,} events/s to an embedded follower, 0 lost for a follower that keeps up — "
        f"{rate(med(rates))}, {lost} lost {'met' if ok else 'MISSED'}."
        f"\n\nCommand: {command('stream', quick)}"
    )


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
