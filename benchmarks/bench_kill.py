"""Kill overshoot (a turn that never awaits, grace G: time past G until the result says ``killed``,
the worker reaped) and capacity recovery (after a kill, until the next queued turn is running)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from contextlib import aclosing
from typing import Any

import anyio

from supervisor import Supervisor

from . import _peers
from ._common import command, heavy_peers_reason, log, med, ms, pct, ratio, run_peer, skipped_lines, table

GRACE = 0.05

# The stop floor (issue 16): a Python process spinning in a pure-Python loop, with a SIGTERM
# handler that exits; timed from SIGTERM until it is reaped (its pidfd readable, then waitpid).
_SPINNER = r"""
import os, signal
%s
signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
os.write(1, b"r")
while True:
    pass
"""


# The breakdown's "heavy floor": the same spinner after the imports a worker holds (its memory,
# ≈ 20 MB, is what the kernel tears down at the exit).
_WORKER_IMPORTS = "import anyio, anyio._backends._asyncio, msgspec, zmq, zmq.asyncio, psutil"


def _stop_floor(n: int, imports: str = "") -> list[float]:
    out = []
    for _ in range(n):
        p = subprocess.Popen([sys.executable, "-c", _SPINNER % imports], stdout=subprocess.PIPE)
        assert p.stdout is not None
        if p.stdout.read(1) != b"r":
            raise RuntimeError("the spinner did not start")
        fd = os.pidfd_open(p.pid)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGTERM)
        poller.poll()
        os.waitpid(p.pid, 0)
        out.append(time.monotonic() - t0)
        os.close(fd)
        p.returncode = 0
        p.stdout.close()
    return out


async def _worker_exit(n: int) -> list[float]:
    """A turnpool worker's own death, for the breakdown: a worker spinning in a turn is sent
    SIGKILL directly (no ladder, no handler) and timed until it has exited (its pidfd readable).
    What the worker's threads (ZeroMQ's two, the stale flusher, the life-pipe watcher) add to the
    stop floor's single-threaded process."""
    out = []
    async with Supervisor(workers=1, spares=0) as sup:
        for _ in range(n):
            handle = await sup.submit("benchmarks._agents:spin")
            pid = (await _first_event(handle))["pid"]
            fd = os.pidfd_open(pid)
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            t0 = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            poller.poll()
            out.append(time.monotonic() - t0)
            os.close(fd)
            assert (await handle.result()).outcome == "crashed"
            await _ready(sup, 1)
    return out


async def _latency(n: int) -> list[float]:
    """Embedded one-at-a-time latency (as ``bench_latency``), for the recovery ratio."""
    out = []
    async with Supervisor(workers=2, spares=0) as sup:
        for _ in range(50):
            await sup.run("examples.agents:noop")
        for _ in range(n):
            t0 = time.perf_counter()
            await sup.run("examples.agents:noop")
            out.append(time.perf_counter() - t0)
    return out


async def _one_way(n: int) -> tuple[list[float], list[float]]:
    """Submit → the agent's first line on a warm worker (one way): back to back, and after the
    worker sat idle 50 ms, as a warm spare does before it takes over a killed worker's queue."""
    hot, idle = [], []
    async with Supervisor(workers=1, spares=0, preload=("benchmarks._agents",)) as sup:
        for _ in range(20):
            await sup.run("benchmarks._agents:stamp")
        for _ in range(n):
            t0 = time.monotonic()
            hot.append((await sup.run("benchmarks._agents:stamp")).output - t0)
            await anyio.sleep(0.05)  # idle, as a spare is
            t0 = time.monotonic()
            idle.append((await sup.run("benchmarks._agents:stamp")).output - t0)
    return hot, idle


async def _first_event(handle: Any) -> Any:
    async with aclosing(handle.events()) as events:
        async for event in events:
            return event


async def _overshoot(n: int) -> list[float]:
    out = []
    async with Supervisor(workers=1, spares=1, grace=GRACE, kill_after=1.0) as sup:
        for _ in range(n):
            handle = await sup.submit("benchmarks._agents:spin")
            await _first_event(handle)
            t0 = time.monotonic()
            await handle.cancel()
            result = await handle.result()
            out.append(time.monotonic() - t0 - GRACE)
            assert result.outcome == "killed", result
            await _ready(sup, 2)
    return out


async def _ready(sup: Supervisor, count: int) -> None:
    """Wait until ``count`` workers are ready again (so each sample starts from a full pool)."""
    while sum(1 for w in (await sup.status())["workers"] if w["state"] in ("idle", "busy")) < count:  # noqa: ASYNC110
        await anyio.sleep(0.002)  # polling the pool between samples, off the timed path


async def _recovery(n: int, spares: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """Returns (killed → next running, cancel → next running, kill decision → next running, the
    doomed worker's exit → next running). "Killed" is the moment the supervisor delivered the
    ``killed`` result: the worker and its tree reaped. The kill decision is the SIGTERM step (grace
    0: right after the cancel). With a spare, the spare is handed the next turn at the decision,
    held, and starts it itself the moment the doomed worker's process is gone (LADDER-HEIR), while the
    tree is reaped: exit → running is how long a free slot stays unused (negative when the spare
    started it before the supervisor saw the exit), and the next turn may start before the
    ``killed`` result."""
    from_kill, from_cancel, from_decision, from_exit = [], [], [], []
    # The agents' module preloaded in the zygote (``preload``, the documented way): a replacement
    # worker then does not import it on its first turn.
    async with Supervisor(
        workers=1, spares=spares, grace=0.0, kill_after=1.0, preload=("benchmarks._agents",)
    ) as sup:
        for _ in range(n):
            handle = await sup.submit("benchmarks._agents:spin")
            await _first_event(handle)
            nxt = await sup.submit("benchmarks._agents:stamp")
            t0 = time.monotonic()
            await handle.cancel()
            started = (await nxt.result()).output
            assert (await handle.result()).outcome == "killed"
            record = sup.record(handle.turn_id)  # the loop clock is time.monotonic on asyncio
            from_kill.append(started - record.ended_at)
            from_cancel.append(started - t0)
            from_decision.append(started - record.escalated_at)
            from_exit.append(started - record.exited_at)
            await _ready(sup, 1 + spares)
    return from_kill, from_cancel, from_decision, from_exit


def run(quick: bool) -> str:
    n = 15 if quick else 60
    nr = 10 if quick else 30
    skipped: dict[str, str] = {}
    over: dict[str, tuple[str, list[float]]] = {}
    recov: dict[str, tuple[str, list[float], list[float]]] = {}
    # The stop floor and the overshoot in chunks, back to back, so both see the same load.
    floor: list[float] = []
    tp_over: list[float] = []
    wexit: list[float] = []
    heavy_floor: list[float] = []
    for _ in range(3):
        floor += _stop_floor(n // 3)
        tp_over += anyio.run(_overshoot, n // 3)
        wexit += anyio.run(_worker_exit, n // 6)
        heavy_floor += _stop_floor(n // 6, _WORKER_IMPORTS)
    over["turnpool"] = (
        f"grace {GRACE * 1e3:.0f} ms then SIGTERM to the tree (worker handles it) → `killed`, reaped",
        tp_over,
    )
    over["floor: SIGTERM → reaped"] = (
        "a Python process spinning in a pure-Python loop, SIGTERM handler `os._exit(0)`: "
        "SIGTERM → reaped (pidfd, waitpid)",
        floor,
    )
    over["breakdown: a turnpool worker's own exit"] = (
        "SIGKILL sent straight to a worker spinning in a turn → exited (pidfd readable): no ladder, "
        "no handler, no reaping; 4 threads (ZeroMQ's I/O and reaper, the watcher: WORKER-ONE-THREAD), "
        "≈ 25 MB",
        wexit,
    )
    over["breakdown: the stop floor with a worker's imports"] = (
        "the floor's spinner after `import anyio, msgspec, zmq, psutil` (≈ 20 MB resident, one thread): "
        "SIGTERM → reaped",
        heavy_floor,
    )
    log(f"turnpool overshoot p50 {ms(med(tp_over))}, stop floor p50 {ms(med(floor))}")
    lat: list[float] = []
    rec_kill: list[float] = []
    rec_cancel: list[float] = []
    rec_decision: list[float] = []
    rec_exit: list[float] = []
    for _ in range(3):  # the latency the recovery is compared with, back to back with it
        lat += anyio.run(_latency, 300 if quick else 1000)
        a, b, c, d = anyio.run(_recovery, nr // 3, 1)
        rec_kill += a
        rec_cancel += b
        rec_decision += c
        rec_exit += d
    recov["turnpool, spare"] = (
        "the doomed worker's exit seen (its slot is free from here) → next queued turn running on "
        "the warm spare, which held it from the kill decision and watched that worker's exit itself "
        "(LADDER-HEIR; the tree is reaped meanwhile)",
        rec_exit,
        rec_cancel,
    )
    hot, idle = anyio.run(_one_way, nr)
    nk, nc, _nd, _ne = anyio.run(_recovery, nr, 0)
    recov["turnpool, no spare"] = (
        "killed (tree reaped) → worker forked from the zygote → next turn running",
        nk,
        nc,
    )
    log(
        f"turnpool recovery p50 {ms(med(recov['turnpool, spare'][1]))} / "
        f"{ms(med(recov['turnpool, no spare'][1]))}"
    )
    npeb = 5 if quick else 20
    r = run_peer("pebble", lambda: _peers.pebble_kill(npeb, GRACE), skipped)
    if r:
        over["pebble (timeout)"] = (f"`schedule(timeout={GRACE})` → worker gone, past start + timeout", r[0])
        over["pebble (cancel)"] = ("`future.cancel()` → worker gone", r[1])
    r = run_peer("pebble ", lambda: _peers.pebble_recovery(npeb), skipped)
    if r:
        recov["pebble"] = ("`future.cancel()`, worker gone → next queued task running (1 worker)", *r)
    for peer in ("ProcessPoolExecutor", "loky"):
        skipped[peer] = "cannot stop a running task, so nothing to overshoot or recover from"
    heavy = heavy_peers_reason(quick)
    if heavy:
        skipped["Celery"] = skipped["Ray"] = heavy
    else:
        r = run_peer("Ray", lambda: _peers.ray_cancel(20, force=True), skipped)
        if r:
            over["Ray"] = ("`ray.cancel(force=True)` → `ray.get` raises", r)
        r = run_peer("Ray ", lambda: _peers.ray_recovery(8), skipped)
        if r:
            recov["Ray"] = ("`ray.cancel(force=True)`, worker gone → next queued task running", *r)
        r = run_peer("Celery", lambda: _peers.celery_kill_and_recovery(10, GRACE), skipped)
        if r:
            over["Celery"] = (f"hard `time_limit={GRACE}` → worker process gone, past start + limit", r[0])
            recov["Celery"] = (
                "`revoke(terminate=True, SIGKILL)`, process gone → next queued task running",
                *r[1],
            )
    tp = over["turnpool"][1]
    rows = [
        [
            f"**{k}**" if k == "turnpool" else k,
            what,
            len(xs),
            ms(med(xs)),
            ms(pct(xs, 90)),
            ms(pct(xs, 99)),
            "1.0×" if k == "turnpool" else ratio(med(xs) / med(tp)),
        ]
        for k, (what, xs) in over.items()
    ]
    ts, tn = recov["turnpool, spare"][1], recov["turnpool, no spare"][1]
    tnc = recov["turnpool, no spare"][2]
    rrows = [
        [
            f"**{k}**" if k.startswith("turnpool") else k,
            what,
            len(xs),
            ms(med(xs)),
            ms(pct(xs, 99)),
            ms(med(cs)),
            "—" if k.startswith("turnpool") else ratio(med(cs) / med(tnc)),
        ]
        for k, (what, xs, cs) in recov.items()
    ]
    return (
        "## Kill overshoot\n\n"
        "A turn that never awaits (a CPU loop) is cancelled; timed past the grace until the result says "
        "`killed` with the worker and its tree reaped (peers: until the worker process is gone).\n\n"
        + table(["system", "what is timed", "kills", "p50", "p90", "p99", "peer ÷ turnpool (p50)"], rows)
        + f"\n\nWhere a miss comes from: a turnpool worker killed outright (the breakdown row) takes "
        f"{med(wexit) / med(floor):.1f}× the stop floor to be gone by itself, and the floor's own "
        f"spinner takes {med(heavy_floor) / med(floor):.1f}× once it has imported what a worker "
        "imports: the kernel's teardown of the process's memory (≈ 25 MB, ≈ 300 mappings, against "
        "the bare interpreter's 11 MB) and of its threads is most of a kill, before any of "
        "turnpool's own steps. On top of it the ladder adds the grace timer's wake-up, the SIGTERM "
        "step (LADDER-TERM-FIRST: the worker is signalled without being frozen), the worker's handler "
        "killing its tree, and reaping the tree before the result (docs/design.md, WORKER-ONE-THREAD to "
        "LADDER-REAP, has the instrumented split)."
        + f"\n\nTargets: p50 ≤ 2.5× the stop floor measured in the same run — {ms(med(tp))} = "
        f"{med(tp) / med(floor):.1f}× {ms(med(floor))} {'met' if med(tp) <= 2.5 * med(floor) else 'MISSED'}; "
        f"p50 ≤ 5 ms — {'met' if med(tp) <= 5e-3 else 'MISSED'}; p90 ≤ 20 ms — {ms(pct(tp, 90))} "
        f"{'met' if pct(tp, 90) <= 20e-3 else 'MISSED'} (over {len(tp)} kills).\n\n"
        "## Capacity recovery\n\n"
        "One worker runs a CPU loop, the next turn is queued behind it; the loop is killed (grace 0) and "
        "timed from the kill (turnpool: the `killed` result, tree reaped; peers: the worker process gone, "
        "polled every 0.5 ms) until the next turn is running (it returns `time.monotonic()` at its start). "
        "The last columns time from `cancel()` instead, which adds the kill itself; the ratio uses them, "
        "since peers differ in when they kill (pebble notices a cancel on a ~100 ms loop, then replaces the "
        "worker at once).\n\n"
        + table(
            [
                "system",
                "what is timed",
                "samples",
                "p50",
                "p99",
                "p50 from cancel",
                "peer ÷ turnpool without spare (p50 from cancel)",
            ],
            rrows,
        )
        + f"\n\nEmbedded one-at-a-time latency in the same run (the recovery's yardstick, 2 workers, "
        f"no-op turns, {len(lat)} samples back to back with the recovery samples): p50 {ms(med(lat))}."
        + "\n\nWith a spare, the spare is handed the next turn at the kill decision and holds it; it "
        "starts it itself the moment the doomed worker's process is gone (its own pidfd on it, "
        "LADDER-HEIR), while the tree is reaped, so the row times from the supervisor seeing that exit: "
        "how long a free slot stays unused (a sample is negative when the spare started before the "
        "supervisor saw the exit). On the same samples: from the `killed` result as before, p50 "
        f"{ms(med(rec_kill))} (negative when the next turn was already running); from the kill "
        f"decision (the SIGTERM step), p50 {ms(med(rec_decision))}, which adds the worker's own "
        "teardown (the kill overshoot's breakdown rows). "
        "Before LADDER-HEIR the takeover was one way (the supervisor's `Run` → agent start) on a worker "
        f"that sat idle; measured in the same run on a warm worker, that one way is p50 {ms(med(hot))} "
        f"back to back and {ms(med(idle))} after 50 ms idle ({len(idle)} samples each): waking an idle "
        "process's threads (ZeroMQ's I/O thread, then the main thread) on a loaded 2-core machine "
        "cost more than the whole hot round trip. With LADDER-HEIR only the spare's main thread wakes, "
        "on the exit itself. WORKER-WARM (no first-turn page faults) and WORKER-SPARE (the replacement's "
        "start held back 10 ms) take out what turnpool added on top."
        + f"\n\nTargets: with a spare p50 ≤ 2× the embedded one-at-a-time latency — {ms(med(ts))} = "
        f"{med(ts) / med(lat):.1f}× {ms(med(lat))} {'met' if med(ts) <= 2 * med(lat) else 'MISSED'}; "
        f"with a spare p50 ≤ 2 ms — {'met' if med(ts) <= 2e-3 else 'MISSED'}; "
        f"without p50 ≤ 20 ms — {ms(med(tn))} {'met' if med(tn) <= 20e-3 else 'MISSED'}."
        + skipped_lines(skipped)
        + f"\n\nCommand: {command('kill', quick)}"
    )
