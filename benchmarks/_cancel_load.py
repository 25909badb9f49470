"""Cancels and kills under N streaming turns, alone: the cancel rows of the hundreds section
(``_hundreds``: N ``benchmarks._agents:ticker`` turns at 20 events/s, K cooperative cancels, K kills,
the bare spinner's SIGTERM → reaped), for iterating on them without the whole section.

``--hops`` also stamps each hop on ``CLOCK_MONOTONIC`` (the supervisor's process and the workers
share it) and prints the median time of each, from the cancel:

* cooperative: ``cancel()`` called → ``Abort`` flushed to the socket → read in the worker → the
  agent's task cancelled → its ``End`` decoded in the supervisor → the turn finished (result set) →
  the caller's ``await result()`` resumed;
* kill: the grace timer fired (its lateness) → SIGTERM step signalled → the worker's handler
  entered → (``--trace``: its own SIGTERM, its threads' exits) → its exit (seen by an observer
  process at once, on a pidfd) → the supervisor's exit handler → its tree reaped → ``killed``
  finished → the caller resumed.

The wrappers call the real code unchanged; the workers run ``benchmarks._hop_agents`` (the same
agents with a stamp per hop). The floor: a bare spinner's SIGTERM → reaped (``bench_kill``), alone
after the load as in ``_hundreds``, and (``--hops``) the same from a process in the supervisor's
session while the load runs.

Run: ``setsid -w .venv/bin/python -m benchmarks._cancel_load [--hops|--trace]
[N] [K]`` (``setsid``: the supervisor leads its session, as a service's does, so that where it may
(root) it weighs what its pool weighs: WORKER-SUPERVISOR-WEIGHT; ``--trace`` needs root and tracefs).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

import anyio

from . import _hops, _stream_rows
from ._common import med, ms, pct

WATCH: dict[str, dict[str, float]] = {}  # turn id -> hop -> time (``--hops``)
SPANS: dict[str, list[tuple[float, float]]] = defaultdict(list)  # label -> (wall, thread CPU) per call
KILLING: list[str] = []  # the turn being killed now (kills run one at a time): spans go to it


def _mark(turn_id: str, hop: str) -> None:
    hops = WATCH.get(turn_id)
    if hops is not None and hop not in hops:
        hops[hop] = time.monotonic()


def _instrument(sup: Any) -> None:
    """Stamp the supervisor's hops for the turns in ``WATCH``: wrappers on ``sup``'s own parts (the link,
    the pool, its reaper, the exit handler), on the policy's classes and on the modules the reaper calls,
    each calling the real code unchanged."""
    from supervisor import lowlevel, policy
    from wire import worker_link
    from wire.worker_link import Abort, End
    from worker import proctree

    link, pool = sup.link, sup.pool
    flush = link.flush

    def flush_stamped() -> None:
        aborts = [
            m.turn_id for s in link._dirty for m in s.out if isinstance(m, Abort) and m.turn_id in WATCH
        ]
        flush()
        for turn_id in aborts:
            _mark(turn_id, "s_abort_sent")

    decode = worker_link.decode_from_worker

    def decode_stamped(body: bytes) -> Any:
        msgs = decode(body)
        if WATCH:
            for m in msgs:
                if isinstance(m, End) and m.turn_id in WATCH:
                    _mark(m.turn_id, "s_end_read")
        return msgs

    finish = policy.Finisher.finish

    @functools.wraps(finish)
    def finish_stamped(self: Any, turn: Any, *a: Any, **kw: Any) -> None:
        _mark(turn.id, "s_finish")
        finish(self, turn, *a, **kw)
        _mark(turn.id, "s_result_set")

    escalate = policy.Escalation.escalate

    @functools.wraps(escalate)
    def escalate_stamped(self: Any, turn: Any, slot: Any, step: int) -> None:
        _mark(turn.id, f"s_step{step}")
        escalate(self, turn, slot, step)
        _mark(turn.id, f"s_step{step}_signalled")

    on_exit = pool.on_exit

    async def on_exit_stamped(slot: Any) -> None:
        if slot.turn is not None:
            _mark(slot.turn.id, "s_exit_seen")
        await on_exit(slot)

    reap = pool.reap_exit

    async def reap_stamped(slot: Any) -> Any:
        turn_id = slot.turn.id if slot.turn is not None else None
        if turn_id:
            _mark(turn_id, "s_reap_start")
        code = await reap(slot)
        if turn_id:
            _mark(turn_id, "s_reaped")
        return code

    def span(owner: Any, name: str, label: str) -> None:
        """Stamp the start and the end of ``owner.name`` (a function or a coroutine function)
        into the turn being killed, and (synchronous ones) its wall and thread CPU time."""
        fn = getattr(owner, name)

        def into(hop: str) -> None:
            if KILLING:
                _mark(KILLING[0], hop)

        if asyncio.iscoroutinefunction(fn):

            async def wrapped_async(*a: Any, **kw: Any) -> Any:
                into(f"{label}<")
                try:
                    return await fn(*a, **kw)
                finally:
                    into(f"{label}>")

            setattr(owner, name, wrapped_async)
        else:

            def wrapped(*a: Any, **kw: Any) -> Any:
                into(f"{label}<")
                w0, c0 = time.monotonic(), time.thread_time()
                try:
                    return fn(*a, **kw)
                finally:
                    if KILLING:
                        SPANS[label].append((time.monotonic() - w0, time.thread_time() - c0))
                    into(f"{label}>")

            setattr(owner, name, wrapped)

    span(lowlevel.procs, "reap", "r_waitpid")
    span(lowlevel.procs, "kill_cgroup", "r_kill_cgroup")
    span(pool.reaper, "_sweep", "r_sweep")
    span(pool.reaper.orphans, "of_any", "r_orphans")
    span(lowlevel.orphans, "adopted", "r_list_children")
    span(lowlevel.procs, "kill_and_reap", "r_kill_and_reap")
    span(proctree, "cgroup_remove", "r_cgroup_remove")
    read = link._read

    def read_stamped(*, fair: bool) -> None:
        if fair:  # the reader callback; the exit handler's drain reads unfairly (all that is there)
            return read(fair=fair)
        w0, c0 = time.monotonic(), time.thread_time()
        if KILLING:
            _mark(KILLING[0], "r_drain<")
        read(fair=fair)
        if KILLING:
            SPANS["r_drain"].append((time.monotonic() - w0, time.thread_time() - c0))
            _mark(KILLING[0], "r_drain>")
        return None

    link._read = read_stamped
    link.flush = flush_stamped
    worker_link.decode_from_worker = decode_stamped
    policy.Finisher.finish = finish_stamped  # type: ignore[method-assign]
    policy.Escalation.escalate = escalate_stamped  # type: ignore[method-assign]
    pool.on_exit = on_exit_stamped
    pool.reap_exit = reap_stamped


_OBSERVER = r"""
import os, select, sys, time
for line in sys.stdin:
    pid = int(line)
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        print(pid, "gone", flush=True); continue
    print(pid, "watching", flush=True)
    select.select([fd], [], [])
    print(pid, repr(time.monotonic()), flush=True)
    os.close(fd)
"""


class _Observer:
    """A process that stamps a worker's exit as soon as its pidfd says so (its own session: not
    weighed with the workers, and not the supervisor's busy loop)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _OBSERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def watch(self, pid: int) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{pid}\n")
        self.proc.stdin.flush()
        self.proc.stdout.readline()  # "watching" (or "gone")

    def exited(self) -> float:
        assert self.proc.stdout is not None
        return float(self.proc.stdout.readline().split()[1])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(5)


_EVENTS = (
    "signal/signal_generate",
    "signal/signal_deliver",
    "sched/sched_process_exit",
    "sched/sched_process_free",
    "sched/sched_switch",
    "sched/sched_waking",
)


def _kernel_trace() -> _hops.KernelTrace:
    """``--trace``: the signals 15 and 9, the threads' exits and the reaps; the scheduling of the
    threads ``_follow`` names."""
    trace = _hops.KernelTrace(
        "cancelload", _EVENTS, {ev: "sig == 15 || sig == 9" for ev in _EVENTS if ev.startswith("signal/")}
    )
    _follow(trace, [])
    return trace


def _follow(trace: _hops.KernelTrace, tids: list[int]) -> None:
    """Record the scheduling (switches, wake-ups) of these threads only (a doomed worker's)."""
    tids = tids or [0x7FFFFFFF]
    trace.filter("sched/sched_switch", " || ".join(f"prev_pid == {t} || next_pid == {t}" for t in tids))
    trace.filter("sched/sched_waking", " || ".join(f"pid == {t}" for t in tids))


def _kernel_hops(lines: list[str], pid: int) -> dict[str, float]:
    """The kernel's hops of worker ``pid``'s kill: the supervisor's SIGTERM generated, delivered in
    the worker, the worker's own SIGTERM (its handler's last act) generated, its first and last
    thread's exit, its reap (free)."""
    out: dict[str, float] = {}
    for tid, tgid, t, event, fields in _hops.parsed(lines):
        if event == "signal_generate" and fields.get("pid") == str(pid) and fields.get("sig") == "15":
            if tgid == str(pid):
                out.setdefault("k_self_sigterm", t)
            else:
                out.setdefault("k_sigterm_generated", t)
        elif event == "signal_deliver" and tgid == str(pid) and fields.get("sig") == "15":
            out.setdefault("k_sigterm_delivered", t)
        elif event == "sched_process_exit" and tgid == str(pid):
            out.setdefault("k_first_thread_exit", t)
            out["k_last_thread_exit"] = t
            if tid == str(pid):
                out["k_leader_exit"] = t
        elif event == "sched_process_free" and fields.get("pid") == str(pid):
            out.setdefault("k_freed", t)
    return out


def _read_stamps(path: str) -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        with open(path) as f:
            for line in f:
                name, t = line.split()
                out.setdefault(name, float(t))
    except FileNotFoundError:
        pass
    return out


async def _first(handle: Any) -> Any:
    async for event in handle.events():
        return event


_FLOOR_UNDER_LOAD = (
    "from benchmarks.bench_kill import _stop_floor; import json; print(json.dumps(_stop_floor(%d)))"
)


_SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None


async def run(n: int, k: int, *, hops: bool, trace: bool = False, grace: float = 0.05) -> dict[str, Any]:
    """``_stream_rows.cancels_under_load`` with the hops stamped (``hops``)."""
    coop: list[float] = []
    kill: list[float] = []
    coop_hops: list[dict[str, float]] = []
    kill_hops: list[dict[str, float]] = []
    floor_loaded: list[float] = []
    tmp = tempfile.mkdtemp(prefix="cl-", dir=_SHM)
    observer = _Observer() if hops and os.environ.get("CANCEL_LOAD_OBSERVER") else None
    kernel = None
    pids: list[tuple[int, float]] = []
    follows: list[tuple[set[int], float, float]] = []
    sched: list[dict[str, float]] = []
    coop_agent = "benchmarks._hop_agents:awaiting" if hops else "benchmarks._agents:awaiting"
    kill_agent = "benchmarks._hop_agents:spin" if hops else "benchmarks._agents:spin"
    try:
        async with _stream_rows.streaming(n, grace) as sup:
            if hops:
                _instrument(sup)
            if hops:
                got = await anyio.to_thread.run_sync(
                    functools.partial(
                        subprocess.run,
                        [sys.executable, "-c", _FLOOR_UNDER_LOAD % k],
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                )
                floor_loaded = json.loads(got.stdout)
            s0, w0 = _hops.thread_schedstat()
            c0 = time.monotonic()
            _hops.RECORD_LOOP[0] = hops
            for i in range(k):
                path = os.path.join(tmp, f"c{i}")
                handle = await sup.submit(coop_agent, {"stamps": path}, grace=10.0)  # the abort, not a kill
                await _first(handle)
                if hops:
                    WATCH[handle.turn_id] = {}
                t0 = time.monotonic()
                await handle.cancel()
                t_cancel = time.monotonic()
                result = await handle.result()
                t1 = time.monotonic()
                coop.append(t1 - t0)
                assert result.outcome == "aborted", result
                if hops:
                    h = WATCH.pop(handle.turn_id)
                    h.update(_read_stamps(path))
                    h.update(s_cancel_returned=t_cancel, resumed=t1)
                    coop_hops.append({name: t - t0 for name, t in h.items()})
            _hops.RECORD_LOOP[0] = False
            s1, w1 = _hops.thread_schedstat()
            phase = time.monotonic() - c0
            loop_share = {"run": (s1 - s0) / phase, "wait": (w1 - w0) / phase}
            if trace:
                kernel = _kernel_trace()
            for i in range(k):
                path = os.path.join(tmp, f"k{i}")
                handle = await sup.submit(kill_agent, {"stamps": path})
                first = await _first(handle)
                if kernel is not None:
                    tids = [int(t) for t in os.listdir(f"/proc/{first['pid']}/task")]
                    _follow(kernel, tids)
                if observer is not None:
                    await anyio.to_thread.run_sync(observer.watch, first["pid"])
                if hops:
                    WATCH[handle.turn_id] = {}
                    KILLING[:] = [handle.turn_id]
                t0 = time.monotonic()
                await handle.cancel()
                result = await handle.result()
                t1 = time.monotonic()
                KILLING.clear()
                kill.append(t1 - t0 - grace)
                assert result.outcome == "killed", result
                if hops:
                    h = WATCH.pop(handle.turn_id)
                    h.update(_read_stamps(path))
                    if observer is not None:
                        h["x_exited"] = await anyio.to_thread.run_sync(observer.exited)
                    h["resumed"] = t1
                    pids.append((first["pid"], t0 + grace))
                    if kernel is not None:
                        follows.append((set(tids), t0 + grace, t1))
                    kill_hops.append({name: t - t0 - grace for name, t in h.items()})
            if kernel is not None:
                lines, kernel = kernel.stop(), None
                if os.environ.get("CANCEL_LOAD_TRACE_TO"):  # the raw trace, for a closer look
                    with open(os.environ["CANCEL_LOAD_TRACE_TO"], "w") as f:  # noqa: ASYNC230 - after the timing
                        f.write(
                            json.dumps({"pids": pids, "follows": [(sorted(a), b, c) for a, b, c in follows]})
                        )
                        f.write("\n" + "\n".join(lines))
                for (pid, origin), h, (tids, _t_a, t_b) in zip(pids, kill_hops, follows, strict=True):
                    k = _kernel_hops(lines, pid)
                    h.update({name: t - origin for name, t in k.items()})
                    if "k_sigterm_generated" in k and "k_self_sigterm" in k and "k_last_thread_exit" in k:
                        a = _hops.kernel_sched(lines, tids, k["k_sigterm_generated"], k["k_self_sigterm"])
                        b = _hops.kernel_sched(lines, tids, k["k_self_sigterm"], t_b)
                        sched.append(
                            {"handler_" + n: v for n, v in a.items()} | {"exit_" + n: v for n, v in b.items()}
                        )
    finally:
        if kernel is not None:
            kernel.stop()
        if observer is not None:
            observer.close()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "coop": coop,
        "kill": kill,
        "coop_hops": coop_hops,
        "kill_hops": kill_hops,
        "floor_loaded": floor_loaded,
        "sched": sched,
        "loop_share": loop_share,
    }


def main(argv: list[str]) -> None:
    trace = "--trace" in argv
    hops = "--hops" in argv or trace
    args = [a for a in argv if not a.startswith("--")]
    n = int(args[0]) if args else 256
    k = int(args[1]) if len(args) > 1 else 30
    if hops:
        _hops.instrument_loop()
    boost = os.environ.get("CANCEL_LOAD_AUTOGROUP_NICE")  # an experiment: this process's weight (root)
    if boost:
        with open("/proc/self/autogroup", "w") as f:
            f.write(boost)
    before = _hops.loadavg()
    t = time.time()
    got = anyio.run(functools.partial(run, n, k, hops=hops, trace=trace))
    spin = _stream_rows.spinner_floor(k)
    after = _hops.loadavg()
    print(f"loadavg before: {before}")
    print(f"{time.strftime('%H:%M:%S', time.gmtime(t))} UTC, {n} streaming turns, {k} each:")
    print(f"  cooperative cancel → aborted: p50 {ms(med(got['coop']))}, p99 {ms(pct(got['coop'], 99))}")
    print(f"  kill (SIGTERM step → killed): p50 {ms(med(got['kill']))}, p99 {ms(pct(got['kill'], 99))}")
    print(f"  bare spinner SIGTERM → reaped, after the load: p50 {ms(med(spin))}, p99 {ms(pct(spin, 99))}")
    if got["floor_loaded"]:
        fl = got["floor_loaded"]
        print(f"  bare spinner SIGTERM → reaped, under the load: p50 {ms(med(fl))}, p99 {ms(pct(fl, 99))}")
    if hops:
        print(_hops.hop_table(got["coop_hops"], "cooperative hops, origin: cancel() called"))
        print(_hops.hop_table(got["kill_hops"], "kill hops, origin: cancel() called + grace"))
        if got.get("sched"):
            print(
                "the doomed worker's threads: SIGTERM generated → its own SIGTERM, then → gone (median ms):"
            )
            for name in got["sched"][0]:
                vals = [r[name] for r in got["sched"]]
                print(f"  {name:20s} p50 {med(vals) * 1e3:7.3f}  p90 {pct(vals, 90) * 1e3:7.3f}")
        ls = got["loop_share"]
        print(
            f"the supervisor's loop thread during the cooperative cancels: on a CPU {ls['run']:.2f} s/s, "
            f"runnable but waiting {ls['wait']:.2f} s/s"
        )
        if _hops.LOOP:
            print(_hops.loop_summary())
        print("synchronous spans during the kills (median wall / thread CPU, calls):")
        for label, vals in SPANS.items():
            wall, cpu = [v[0] for v in vals], [v[1] for v in vals]
            print(f"  {label:20s} {med(wall) * 1e3:7.3f} / {med(cpu) * 1e3:7.3f} ms  ({len(vals)})")
    print(f"loadavg after: {after}")


if __name__ == "__main__":
    main(sys.argv[1:])
