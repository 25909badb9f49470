"""What the hop tools share (``_cancel_load --hops``, ``_stream_hops``): stamps on ``CLOCK_MONOTONIC``
(every process of the machine reads the same clock, so a worker's stamp and the supervisor's compare),
a tracefs instance of the tool's own for the kernel's side (signals, wake-ups, switches), a thread's
time on and waiting for a CPU, the asyncio loop's iterations, and the table of hops in order."""

from __future__ import annotations

import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from ._common import med, pct

TRACEFS = "/sys/kernel/tracing"


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


class KernelTrace:
    """A tracefs instance of its own (root, where tracefs is mounted), on ``CLOCK_MONOTONIC``, recording
    ``events`` (``"sched/sched_switch"``...) with the given filters; ``stop`` returns its lines."""

    def __init__(self, name: str, events: Iterable[str], filters: dict[str, str] | None = None) -> None:
        self.events = tuple(events)
        self.dir = os.path.join(TRACEFS, "instances", f"{name}-{os.getpid()}")
        os.mkdir(self.dir)
        self._w("trace_clock", "mono")
        self._w("buffer_size_kb", "32768")
        self._w("options/record-tgid", "1")
        for ev, expr in (filters or {}).items():
            self.filter(ev, expr)
        for ev in self.events:
            self._w(f"events/{ev}/enable", "1")
        self._w("tracing_on", "1")

    def _w(self, name: str, value: str) -> None:
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(value)

    def filter(self, event: str, expr: str) -> None:
        self._w(f"events/{event}/filter", expr)

    def stop(self) -> list[str]:
        self._w("tracing_on", "0")
        with open(os.path.join(self.dir, "trace")) as f:
            lines = f.read().splitlines()
        for ev in self.events:
            self._w(f"events/{ev}/enable", "0")
        os.rmdir(self.dir)
        return lines


# One line of a trace with record-tgid: ``comm-tid (tgid) [cpu] flags time: event: fields``.
TRACE_LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\(\s*(\S+)\)\s+\[\d+\]\s+\S+\s+([\d.]+):\s+(\w+):\s+(.*)$")


def fields(rest: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)


def parsed(lines: Iterable[str]) -> Iterator[tuple[str, str, float, str, dict[str, str]]]:
    """The trace's events: (thread id, process id, time, event name, fields), as text but the time."""
    for line in lines:
        m = TRACE_LINE.match(line)
        if m:
            _comm, tid, tgid, ts, event, rest = m.groups()
            yield tid, tgid, float(ts), event, fields(rest)


def kernel_sched(lines: list[str], tids: set[int], start: float, end: float) -> dict[str, float]:
    """Of threads ``tids`` between ``start`` and ``end``: their time on a CPU, and runnable but
    waiting for one (woken or preempted → switched in), in seconds."""
    on: dict[int, float] = {}
    ready: dict[int, float] = {}
    cpu = wait = 0.0
    for _tid, _tgid, t, event, f in parsed(lines):
        if event not in ("sched_switch", "sched_waking") or t < start or t > end:
            continue
        if event == "sched_waking":
            tid = int(f["pid"])
            if tid in tids and tid not in on:
                ready.setdefault(tid, t)
            continue
        prev, nxt = int(f["prev_pid"]), int(f["next_pid"])
        if prev in tids:
            if prev in on:
                cpu += t - on.pop(prev)
            if f.get("prev_state", "").startswith("R"):
                ready[prev] = t  # preempted: runnable, waiting
        if nxt in tids:
            on[nxt] = t
            if nxt in ready:
                wait += t - ready.pop(nxt)
    return {"on_cpu": cpu, "waiting": wait}


def thread_schedstat(tid: int | None = None) -> tuple[float, float]:
    """A thread of this process (the calling one by default): seconds on a CPU and runnable but
    waiting for one so far."""
    with open(f"/proc/self/task/{tid or threading.get_native_id()}/schedstat") as f:
        run, wait, _ = f.read().split()
    return int(run) / 1e9, int(wait) / 1e9


LOOP: list[tuple[float, int]] = []  # (duration, ready callbacks) of each loop iteration while recording
RECORD_LOOP: list[bool] = [False]


def instrument_loop() -> None:
    """Record each asyncio loop iteration's duration and how many callbacks were ready at its start
    (while ``RECORD_LOOP[0]``)."""
    from asyncio import base_events

    run_once = base_events.BaseEventLoop._run_once

    def run_once_timed(self: Any) -> None:
        if not RECORD_LOOP[0]:
            return run_once(self)
        t = time.monotonic()
        ready = len(self._ready)
        run_once(self)
        LOOP.append((time.monotonic() - t, ready))
        return None

    base_events.BaseEventLoop._run_once = run_once_timed  # type: ignore[method-assign]


def loop_summary() -> str:
    durs = [d for d, _ in LOOP]
    readies = [r for _, r in LOOP]
    return (
        f"loop iterations: {len(LOOP)}, duration p50 {med(durs) * 1e3:.3f} "
        f"p90 {pct(durs, 90) * 1e3:.3f} p99 {pct(durs, 99) * 1e3:.3f} ms; ready callbacks "
        f"p50 {med(readies)} p90 {pct(readies, 90)} p99 {pct(readies, 99)}"
    )


def hop_table(rows: list[dict[str, float]], title: str) -> str:
    """The median time of each hop from the origin, in the order the hops happen, and the step
    from the hop before."""
    at: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for name, t in r.items():
            at[name].append(t)
    order = sorted(at, key=lambda name: med(at[name]))
    lines = [f"{title} (median of {len(rows)}, ms from the origin; Δ: median of the per-row step)"]
    prev: str | None = None
    for name in order:
        step = ""
        if prev is not None:
            deltas = [r[name] - r[prev] for r in rows if name in r and prev in r]
            if deltas:
                step = f"  Δ p50 {med(deltas) * 1e3:7.3f}  p90 {pct(deltas, 90) * 1e3:7.3f}"
        lines.append(f"  {name:24s} {med(at[name]) * 1e3:8.3f}{step}")
        prev = name
    return "\n".join(lines)
