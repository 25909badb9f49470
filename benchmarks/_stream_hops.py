"""Where one streamed event's time goes, hop by hop, under N ticking turns (the streaming rows of the
hundreds section: ``benchmarks._agents:ticker``, 20 events/s each). Every hop is stamped on
``CLOCK_MONOTONIC`` (the agents' payload is their ``time.monotonic()`` at the emit):

* ``s_wake``: the supervisor's reader callback that read the event's frame began (the event loop woke
  for the socket, or went on reading it: LINK-FAIR);
* ``s_read``: the event decoded and handed to the turn table (the turn's followers woken);
* ``d_sent`` (``--daemon``): the daemon sent it to the client;
* ``follower``: ``handle.events()`` (embedded) or the ``Client``'s follower (daemon) got it.

``--trace`` (root, tracefs) adds the kernel's side from the scheduler's events: the worker's ZeroMQ
I/O thread on a CPU after the emit (``w_io_on_cpu``) and off it again (the frame written,
``w_io_off_cpu``), the supervisor's I/O thread on a CPU after that (``s_io_on_cpu``), its event
loop's thread woken (``s_loop_woken``) and on a CPU (``s_loop_on_cpu``) for the read; and how long
each kind of thread waited for a CPU when woken.

Also: the supervisor's loop thread's time on a CPU and waiting for one (``/proc/self/task``), its
loop iterations, the CPU per event of the supervisor's process.

Run: ``[setsid -w] .venv/bin/python -m benchmarks._stream_hops [--daemon] [--trace] [N] [SECONDS]``
(``setsid``: the supervisor, or the daemon, leads its session, as a service's does: where it may
it raises its weight, WORKER-SUPERVISOR-WEIGHT; without, as embedded in a program run from a shell).
"""

from __future__ import annotations

import atexit
import bisect
import json
import os
import sys
import time
from collections import defaultdict
from typing import Any

import anyio

from . import _hops, _stream_rows
from ._common import med, ms, pct

# emit time -> hop -> time, for every event that passed this process's instrumented parts
STAMPS: dict[float, dict[str, float]] = defaultdict(dict)
WAKE = [0.0]  # when the reader callback now running began


def _emitted(raw: Any) -> float | None:
    import wire

    value = wire.decode_payload(raw)
    return value if isinstance(value, float) else None


def instrument_link(link: Any) -> None:
    """Wrap a running supervisor's worker link (its reader and its message handler), each calling the
    real code unchanged."""
    from wire import worker_link

    read = link._read
    on_message = link.on_message

    def read_stamped(*, fair: bool) -> None:
        if fair:
            WAKE[0] = time.monotonic()
        read(fair=fair)

    def on_message_stamped(slot: Any, msg: Any) -> None:
        if type(msg) is worker_link.Event:
            emitted = _emitted(msg.data)
            if emitted is not None:
                hops = STAMPS[emitted]
                hops["s_wake"] = WAKE[0]
                hops["s_read"] = time.monotonic()
                hops["pid"] = slot.pid
        on_message(slot, msg)

    link._read = read_stamped
    link.on_message = on_message_stamped


def instrument_daemon() -> None:
    """Every ``Supervisor`` started from now on gets ``instrument_link``; the daemon's replies carrying
    events are stamped as they are sent."""
    from supervisor import Supervisor
    from supervisor.daemon.requests import Requests
    from wire import client_link

    start = Supervisor.start

    async def start_stamped(self: Any) -> Any:
        got = await start(self)
        instrument_link(self.link)
        return got

    req_init = Requests.__init__

    def req_init_stamped(self: Any, *a: Any, **kw: Any) -> None:
        req_init(self, *a, **kw)
        for name in ("send", "send_alone"):
            send = getattr(self, name)

            def send_stamped(ident: bytes, msg: Any, send: Any = send) -> bool:
                ok = send(ident, msg)
                if type(msg) is client_link.Events:
                    now = time.monotonic()
                    for raw in msg.data:
                        emitted = _emitted(raw)
                        if emitted is not None:
                            STAMPS[emitted]["d_sent"] = now
                return bool(ok)

            setattr(self, name, send_stamped)

    Supervisor.start = start_stamped  # type: ignore[method-assign]
    Requests.__init__ = req_init_stamped  # type: ignore[method-assign]


def serve(argv: list[str]) -> None:
    """``--serve ARGV...``: run ``turnpool serve`` (argv as daemonkit builds it) instrumented, and write
    its stamps and its loop thread's schedstat to ``$STREAM_HOPS_OUT`` when it exits."""
    instrument_daemon()
    out = os.environ["STREAM_HOPS_OUT"]
    s0 = _hops.thread_schedstat()
    t0 = time.monotonic()

    def dump() -> None:
        s1 = _hops.thread_schedstat()
        with open(out, "w") as f:
            json.dump({"stamps": list(STAMPS.items()), "sched": [s0, s1, t0, time.monotonic()]}, f)

    atexit.register(dump)
    i = argv.index("serve")
    sys.argv = ["turnpool", *argv[i:]]
    from supervisor.cli.main import entry

    entry()


async def _follow_all(sup: Any, n: int, seconds: float) -> tuple[dict[float, float], float, float]:
    """N ticking turns on ``sup``, each followed: emit time -> the follower's time; and the window."""
    got: dict[float, float] = {}

    async def one(inp: dict[str, float], keep: bool) -> None:
        handle = await sup.submit(_stream_rows.AGENT, inp)
        async for ev in handle.events():
            if keep and isinstance(ev, float):
                got[ev] = time.monotonic()

    async with anyio.create_task_group() as tg:  # every worker imports the agent first
        for _ in range(n):
            tg.start_soon(one, {"rate": 100, "seconds": 0.02}, False)
    await anyio.sleep(1.0)  # allowed: the warm-up's exits settle
    t0 = time.monotonic()
    _hops.RECORD_LOOP[0] = True
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one, {"rate": _stream_rows.RATE, "seconds": seconds}, True)
    _hops.RECORD_LOOP[0] = False
    return got, t0, time.monotonic()


def _trace() -> _hops.KernelTrace:
    """The scheduling of every ZeroMQ I/O thread (the workers' and the supervisor's) and of this
    process's main thread."""
    import threading

    me = threading.get_native_id()
    io = '"ZMQbg/IO/0"'
    return _hops.KernelTrace(
        "streamhops",
        ("sched/sched_switch", "sched/sched_waking"),
        {
            "sched/sched_switch": (
                f"prev_comm == {io} || next_comm == {io} || prev_pid == {me} || next_pid == {me}"
            ),
            "sched/sched_waking": f"comm == {io} || pid == {me}",
        },
    )


class _Sched:
    """The trace's switches and wake-ups, by thread: when each thread went on and off a CPU, when it was
    woken, and of which process each thread is."""

    def __init__(self, lines: list[str]) -> None:
        self.on: dict[int, list[float]] = defaultdict(list)
        self.off: dict[int, list[float]] = defaultdict(list)
        self.woken: dict[int, list[float]] = defaultdict(list)
        self.tgid: dict[int, int] = {}
        self.comm: dict[int, str] = {}
        self.waits: dict[int, list[float]] = defaultdict(list)  # woken → on a CPU, per thread
        pending: dict[int, float] = {}
        for tid, tgid, t, event, f in _hops.parsed(lines):
            if tgid.isdigit():
                self.tgid.setdefault(int(tid), int(tgid))
            if event == "sched_waking":
                w = int(f["pid"])
                self.woken[w].append(t)
                pending.setdefault(w, t)
            elif event == "sched_switch":
                prev, nxt = int(f["prev_pid"]), int(f["next_pid"])
                self.off[prev].append(t)
                self.on[nxt].append(t)
                self.comm.setdefault(nxt, f.get("next_comm", ""))
                if nxt in pending:
                    self.waits[nxt].append(t - pending.pop(nxt))
                if f.get("prev_state", "").startswith("R"):
                    pending[prev] = t  # preempted: runnable, waiting

    @staticmethod
    def after(times: list[float], t: float) -> float | None:
        i = bisect.bisect_left(times, t)
        return times[i] if i < len(times) else None

    @staticmethod
    def before(times: list[float], t: float) -> float | None:
        i = bisect.bisect_right(times, t)
        return times[i - 1] if i else None


def _kernel_hops(rows: list[dict[str, float]], sched: _Sched, loop_tid: int, loop_pid: int) -> None:
    """Add the kernel's hops to each row (times relative to the emit, as the rows are)."""
    # pid -> its ZeroMQ I/O thread
    io_of = {tgid: tid for tid, tgid in sched.tgid.items() if sched.comm.get(tid) == "ZMQbg/IO/0"}
    s_io = io_of.get(loop_pid)
    for r in rows:
        emit = r["emit_abs"]
        w_io = io_of.get(int(r.get("pid", 0)))
        if w_io is not None:
            on = sched.after(sched.on[w_io], emit)
            if on is not None:
                r["w_io_on_cpu"] = on - emit
                off = sched.after(sched.off[w_io], on)
                if off is not None:
                    r["w_io_off_cpu"] = off - emit
                    if s_io is not None:
                        s_on = sched.after(sched.on[s_io], off)
                        s_off_before = sched.before(sched.off[s_io], off)
                        s_on_before = sched.before(sched.on[s_io], off)
                        running = s_on_before is not None and (
                            s_off_before is None or s_on_before > s_off_before
                        )
                        if running:
                            r["s_io_on_cpu"] = off - emit  # it was on a CPU already
                        elif s_on is not None:
                            r["s_io_on_cpu"] = s_on - emit
        wake = r.get("s_wake")
        if wake is not None:
            on = sched.before(sched.on[loop_tid], emit + wake)
            if on is not None and on >= emit:
                r["s_loop_on_cpu"] = on - emit
                woken = sched.before(sched.woken[loop_tid], on)
                if woken is not None and woken >= emit:
                    r["s_loop_woken"] = woken - emit


async def embedded(n: int, seconds: float, trace: bool) -> dict[str, Any]:
    import threading

    from supervisor import Supervisor

    async with Supervisor(workers=n, spares=0, start_timeout=600, max_queue=max(1000, 4 * n)) as sup:
        instrument_link(sup.link)
        kernel = _trace() if trace else None
        tid = threading.get_native_id()
        s0, c0 = _hops.thread_schedstat(), _stream_rows._cpu_s(os.getpid())
        nice = _stream_rows._autogroup_nice(os.getpid())
        try:
            got, t0, t1 = await _follow_all(sup, n, seconds)
        finally:
            lines = kernel.stop() if kernel is not None else []
        s1, c1 = _hops.thread_schedstat(), _stream_rows._cpu_s(os.getpid())
    rows = _rows(got, dict(STAMPS))
    if lines:
        _kernel_hops(rows, _Sched(lines), tid, os.getpid())
    return {
        "rows": rows,
        "loop_run": (s1[0] - s0[0]) / (t1 - t0),
        "loop_wait": (s1[1] - s0[1]) / (t1 - t0),
        "cpu_us": (c1 - c0) / max(1, len(got)) * 1e6,
        "nice": nice,
        "lines": len(lines),
    }


async def daemon(n: int, seconds: float) -> dict[str, Any]:
    import shutil
    import tempfile

    from supervisor import Client
    from tests.support import daemonkit

    out = tempfile.mktemp(prefix="streamhops-", suffix=".json")
    opts = ("--workers", str(n), "--spares", "0", "--drain", "0", "--no-journal", "--start-timeout", "600")
    wrap = (sys.executable, "-m", "benchmarks._stream_hops", "--serve")
    leads = os.getsid(0) == os.getpid()
    served = daemonkit.start(
        *opts, wrap=(("setsid",) if leads else ()) + wrap, env_extra={"STREAM_HOPS_OUT": out}
    )
    try:
        nice = _stream_rows._autogroup_nice(served.pid)
        async with Client.connect(served.endpoint, timeout=600) as client:
            got, _, _ = await _follow_all(client, n, seconds)
            nice = _stream_rows._autogroup_nice(served.pid)
    finally:
        daemonkit.stop_process(served.proc)
        shutil.rmtree(served.home, ignore_errors=True)
    dumped = json.loads(await anyio.Path(out).read_text())
    os.unlink(out)
    stamps = {float(k): v for k, v in dumped["stamps"]}
    s0, s1, d0, d1 = dumped["sched"]
    return {
        "rows": _rows(got, stamps),
        "loop_run": (s1[0] - s0[0]) / (d1 - d0),  # over the daemon's whole life: a lower bound
        "loop_wait": (s1[1] - s0[1]) / (d1 - d0),
        "nice": nice,
    }


def _rows(got: dict[float, float], stamps: dict[float, dict[str, float]]) -> list[dict[str, float]]:
    rows = []
    for emit, follower in got.items():
        r = {"emit_abs": emit, "follower": follower - emit}
        for name, t in stamps.get(emit, {}).items():
            r[name] = t if name == "pid" else t - emit
        rows.append(r)
    return rows


def _print(what: str, got: dict[str, Any]) -> None:
    rows = got["rows"]
    shown = [{k: v for k, v in r.items() if k not in ("emit_abs", "pid")} for r in rows]
    print(_hops.hop_table(shown, f"{what}: hops of each event, origin: the agent's emit"))
    fol = [r["follower"] for r in rows]
    print(f"  emit → follower p50 {ms(med(fol))} p90 {ms(pct(fol, 90))} p99 {ms(pct(fol, 99))} ({len(fol)})")
    print(
        f"  the supervisor's loop thread: on a CPU {got['loop_run']:.2f} s/s, runnable but waiting "
        f"{got['loop_wait']:.2f} s/s; its autogroup niceness {got['nice']}"
        + (f"; CPU per event (process) {got['cpu_us']:.0f} µs" if "cpu_us" in got else "")
    )


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--serve":
        serve(argv[1:])
        return
    trace = "--trace" in argv
    args = [a for a in argv if not a.startswith("--")]
    n = int(args[0]) if args else 256
    seconds = float(args[1]) if len(args) > 1 else 5.0
    _hops.instrument_loop()
    before = _hops.loadavg()
    leads = os.getsid(0) == os.getpid()
    print(f"loadavg before: {before}; leads its session: {leads}; {n} turns × 20/s, {seconds} s")
    if "--daemon" in argv:
        _print("daemon", anyio.run(daemon, n, seconds))
    else:
        _print("embedded", anyio.run(embedded, n, seconds, trace))
        if _hops.LOOP:
            print("  " + _hops.loop_summary())
    print(f"loadavg after: {_hops.loadavg()}")


if __name__ == "__main__":
    main(sys.argv[1:])
