"""The production paths through the daemon against the embedded core, in one run (issue 16).

* throughput: N no-op turns submitted concurrently (every submit in flight at once, then every
  result), 2 workers — the embedded ``Supervisor``, then ``turnpool serve`` with 1 and with 50
  ``Client``\\ s, journal off and on; Ray and Celery (from the bench extra) in the same run;
* ``run()`` latency, one at a time: ``Client`` → daemon vs the embedded ``Supervisor``, interleaved;
* event streaming: one turn emitting 200k small events, followed live by a ``Client`` (events/s,
  events received, gap markers seen);
* 200 concurrent turns each emitting 50 events/s, each followed by a ``Client`` task: emit →
  delivery latency (the agent stamps ``time.monotonic()``, the follower subtracts it from its
  own clock: one machine, one clock) and the daemon's CPU (``/proc/PID/stat``, all its threads).

Each ratio comes from figures of this one run; pairs are measured back to back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import time
from typing import Any

import anyio

from ._common import Skip, have

WORKERS = 2
NOOP = "examples.agents:noop"


def _cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _serve_opts(n: int) -> tuple[str, ...]:
    return (
        "--workers",
        str(WORKERS),
        "--spares",
        "0",
        "--drain",
        "0",
        "--max-queue",
        str(max(n, 100_000)),
        "--keep-results",
        str(n + 1000),
    )


# ---- throughput ---------------------------------------------------------------------------


async def _embedded(n: int) -> float:
    from supervisor import Supervisor

    async with Supervisor(workers=WORKERS, spares=0, max_queue=max(n, 100_000), keep_results=n + 10) as sup:
        await sup.run(NOOP)
        t0 = time.perf_counter()
        handles = [await sup.submit(NOOP) for _ in range(n)]
        for h in handles:
            await h.result()
        return n / (time.perf_counter() - t0)


async def _daemon(endpoint: str, clients: int, n: int, *, gather: bool = False) -> tuple[float, float]:
    """``clients`` clients, each submitting its share at once, then awaiting every result at once:
    (acks/s, turns/s). Each client's share goes through ``submit_many`` and ``results`` (API-MANY:
    no task per call); with ``gather``, through one ``submit`` and one ``result`` task per turn
    (``asyncio.gather``), as an asyncio application without ``submit_many`` would write it."""
    from supervisor import Client

    per = n // clients
    conns = [await Client.connect(endpoint, timeout=60, request_timeout=300) for _ in range(clients)]
    try:
        for c in conns:
            await c.run(NOOP)
        t0 = time.perf_counter()
        if gather:
            shares = await asyncio.gather(
                *(asyncio.gather(*(c.submit(NOOP) for _ in range(per))) for c in conns)
            )
        else:
            shares = await asyncio.gather(*(c.submit_many(NOOP, [None] * per) for c in conns))
        t_ack = time.perf_counter() - t0
        if gather:
            results = await asyncio.gather(*(h.result() for share in shares for h in share))
        else:
            got = await asyncio.gather(*(c.results(share) for c, share in zip(conns, shares, strict=True)))
            results = [r for share in got for r in share]
        total = time.perf_counter() - t0
        assert len(results) == clients * per and all(r.outcome == "completed" for r in results)
    finally:
        for c in reversed(conns):  # task groups close in the reverse order of their opening
            await c.aclose()
    return clients * per / t_ack, clients * per / total


async def _throughput(quick: bool) -> dict[str, Any]:
    from tests.support import daemonkit

    n, reps = (5_000, 2) if quick else (20_000, 3)
    out: dict[str, list[Any]] = {
        "embedded": [],
        "gather1": [],
        "off1": [],
        "off50": [],
        "on1": [],
        "on50": [],
    }
    for _ in range(reps):
        out["embedded"].append(await _embedded(n))
        with daemonkit.serving(*_serve_opts(n), "--no-journal") as served:
            out["gather1"].append(await _daemon(served.endpoint, 1, n, gather=True))
            out["off1"].append(await _daemon(served.endpoint, 1, n))
            out["off50"].append(await _daemon(served.endpoint, 50, n))
        home = daemonkit.short_dir()
        with daemonkit.serving(*_serve_opts(n), "--journal", str(home / "j.sqlite3")) as served:
            out["on1"].append(await _daemon(served.endpoint, 1, n))
            out["on50"].append(await _daemon(served.endpoint, 50, n))
        shutil.rmtree(home, ignore_errors=True)
    return {"n": n, "reps": reps, **out}


def _peers(quick: bool) -> dict[str, Any]:
    from . import _peers

    found: dict[str, Any] = {}
    for name, fn, n, reps in (
        ("Ray", _peers.ray_throughput, 1000 if quick else 5000, 2),
        ("Celery", _peers.celery_throughput, 500 if quick else 2000, 2),
    ):
        if not have(name.lower()):
            found[name] = "not installed (pip install -e '.[bench]')"
            continue
        try:
            found[name] = (n, fn(n, reps))
        except Skip as exc:
            found[name] = str(exc)
    return found


# ---- latency ------------------------------------------------------------------------------


async def _lat(backend: Any, n: int) -> list[float]:
    for _ in range(20):
        await backend.run(NOOP)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        await backend.run(NOOP)
        ts.append(time.perf_counter() - t0)
    return ts


async def _latency(quick: bool) -> dict[str, list[float]]:
    from supervisor import Client, Supervisor
    from tests.support import daemonkit

    n, reps = (300, 3) if quick else (1000, 5)
    out: dict[str, list[float]] = {"daemon": [], "embedded": [], "hop": []}
    with daemonkit.serving(*_serve_opts(n), "--no-journal") as served:
        for _ in range(reps):
            async with Client.connect(served.endpoint) as client:
                out["daemon"] += await _lat(client, n)
                for _ in range(n):  # the bare client ↔ daemon round trip: no turn, no worker
                    t0 = time.perf_counter()
                    await client.exists("no-such-turn")
                    out["hop"].append(time.perf_counter() - t0)
            async with Supervisor(workers=WORKERS, spares=0) as sup:
                out["embedded"] += await _lat(sup, n)
    return out


# ---- event streams ------------------------------------------------------------------------


async def _follow_count(handle: Any) -> tuple[int, int, int]:
    """(events received, gap markers, events the markers say were dropped)."""
    import supervisor

    gap_type = getattr(supervisor, "EventsDropped", None)
    got = gaps = dropped = 0
    try:
        async for ev in handle.events():
            if gap_type is not None and isinstance(ev, gap_type):
                gaps += 1
                dropped += ev.count
            else:
                got += 1
    except supervisor.FollowerDropped:
        gaps += 1  # the stream ended instead (a client speaking protocol 2 or less)
    return got, gaps, dropped


async def _flood(quick: bool) -> dict[str, Any]:
    from supervisor import Client, Supervisor
    from tests.support import daemonkit

    count = 50_000 if quick else 200_000
    agent = "benchmarks._agents:flood"
    out: dict[str, Any] = {"count": count, "client": [], "embedded": []}
    out["big"] = []
    out["replay"] = []
    for _ in range(2 if quick else 3):
        with daemonkit.serving(*_serve_opts(10), "--no-journal") as served:
            async with Client.connect(served.endpoint) as client:
                await client.run(agent, {"count": 10})
                t0 = time.perf_counter()
                handle = await client.submit(agent, {"count": count})
                got = await _follow_count(handle)
                out["client"].append((got, count / (time.perf_counter() - t0)))
                await handle.result()
        # The same turn with a buffer that holds all its events (nothing can be dropped), and then
        # followed again once it has ended: the daemon → client path alone, at full speed.
        with daemonkit.serving(*_serve_opts(10), "--no-journal", "--max-events", str(count + 10)) as served:
            async with Client.connect(served.endpoint) as client:
                await client.run(agent, {"count": 10})
                t0 = time.perf_counter()
                handle = await client.submit(agent, {"count": count})
                got = await _follow_count(handle)
                out["big"].append((got, count / (time.perf_counter() - t0)))
                await handle.result()
                t0 = time.perf_counter()
                got = await _follow_count(client.handle(handle.turn_id))
                out["replay"].append((got, count / (time.perf_counter() - t0)))
        async with Supervisor(workers=WORKERS, spares=0) as sup:
            await sup.run(agent, {"count": 10})
            t0 = time.perf_counter()
            handle = await sup.submit(agent, {"count": count})
            got = await _follow_count(handle)
            out["embedded"].append((got, count / (time.perf_counter() - t0)))
            await handle.result()
    return out


def _wait_s(pid: int) -> float:
    """Seconds the threads of process ``pid`` spent runnable but waiting for a CPU (schedstat)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except OSError:
            pass  # a thread that ended meanwhile
    return total / 1e9


def _cpus(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += _cpu(pid)
    return total


async def _tickers(quick: bool, nice: int | None = None) -> dict[str, Any]:
    """200 ticking turns through the daemon: the pool's start-up and each fresh worker's first
    turn (what a user submitting 200 turns to a fresh 200-worker pool waits for), then the steady
    state (every worker warm): emit → delivery, submit → first event, the CPU the daemon and the
    workers used and how long the daemon waited for a CPU; then the same load on bare processes
    (``_tick_floor``), back to back."""
    from supervisor import Client
    from tests.support import daemonkit

    from . import _tick_floor

    turns, rate, seconds = (50, 50, 2.0) if quick else (200, 50, 4.0)
    agent = "benchmarks._agents:ticker"
    lat: list[float] = []
    first: list[float] = []
    fresh: list[float] = []
    lost = 0
    opts = (*_serve_opts(turns), "--no-journal")
    opts = tuple(o if o != str(WORKERS) else str(turns) for o in opts)  # one worker per streaming turn
    if nice is not None:
        opts = (*opts, "--worker-nice", str(nice))  # WORKER-NICE: the workers below the daemon

    async def follow(
        client: Any, inp: dict[str, float], firsts: list[float], into: list[float] | None
    ) -> int:
        t0 = time.monotonic()
        handle = await client.submit(agent, inp)
        got = 0
        async for ev in handle.events():
            if isinstance(ev, float):
                now = time.monotonic()
                if got == 0:
                    firsts.append(now - t0)
                if into is not None:
                    into.append(now - ev)
                got += 1
        return got

    t_start = time.monotonic()
    with daemonkit.serving(*opts) as served:
        pid = served.pid
        async with Client.connect(served.endpoint, timeout=60) as client:
            # Start-up, reported on its own: every worker started and idle...
            with anyio.fail_after(120):
                while True:
                    workers = (await client.status())["workers"]
                    if len(workers) >= turns and all(w["state"] == "idle" and w["pid"] for w in workers):
                        break
                    await anyio.sleep(0.05)
            start_s = time.monotonic() - t_start
            pids = [w["pid"] for w in workers]
            # ... then one short turn on each fresh worker: submit → first event.
            async with anyio.create_task_group() as tg:
                for _ in range(turns):
                    tg.start_soon(follow, client, {"rate": 100, "seconds": 0.02}, fresh, None)
            await anyio.sleep(1)  # let the exits and reaps of start-up settle

            async def one() -> None:
                nonlocal lost
                got = await follow(client, {"rate": rate, "seconds": seconds}, first, lat)
                lost += int(rate * seconds) - got

            cpu0, wcpu0, wait0, t0 = _cpu(pid), _cpus(pids), _wait_s(pid), time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(turns):
                    tg.start_soon(one)
            dt = time.perf_counter() - t0
            cpu = (_cpu(pid) - cpu0) / dt
            wcpu_us = (_cpus(pids) - wcpu0) / (turns * rate * seconds) * 1e6
            wait = (_wait_s(pid) - wait0) / dt
    floor = await anyio.to_thread.run_sync(_tick_floor.tickers, turns, rate, seconds) if nice is None else {}
    return {
        "turns": turns,
        "rate": rate,
        "seconds": seconds,
        "lat": lat,
        "lost": lost,
        "cpu": cpu,
        "start_s": start_s,
        "fresh": fresh,
        "first": first,
        "worker_us": wcpu_us,
        "wait": wait,
        "floor": floor,
        "load": os.getloadavg(),
    }


# ---- report -------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


async def _main(quick: bool) -> str:
    tp = await _throughput(quick)
    lat = await _latency(quick)
    flood = await _flood(quick)
    tick = await _tickers(quick)
    tick["nice19"] = await _tickers(quick, nice=19)
    return _report(quick, tp, lat, flood, tick, _peers(quick))


def _report(
    quick: bool,
    tp: dict[str, Any],
    lat: dict[str, list[float]],
    flood: dict[str, Any],
    tick: dict[str, Any],
    peers: dict[str, Any],
) -> str:
    med = statistics.median
    n = tp["n"]
    emb = med(tp["embedded"])
    rows = []
    fig: dict[str, tuple[float, float]] = {}
    for key, what in (
        (
            "gather1",
            "daemon, journal off, 1 client, a `submit` and a `result` task per turn (`asyncio.gather`)",
        ),
        ("off1", "daemon, journal off, 1 client"),
        ("off50", "daemon, journal off, 50 clients"),
        ("on1", "daemon, journal on, 1 client"),
        ("on50", "daemon, journal on, 50 clients"),
    ):
        acks = med(a for a, _ in tp[key])
        turns = med(t for _, t in tp[key])
        slow = min(t for _, t in tp[key])
        fig[key] = (acks, turns)
        runs = ", ".join(f"{t:,.0f}" for _, t in tp[key])
        rows.append(
            f"| {what} | {acks:,.0f}/s | {turns:,.0f}/s | {slow:,.0f}/s | {turns / emb:.2f}× | {runs} |"
        )
    peer_rows = []
    peer_ratio: dict[str, float] = {}
    for name, got in peers.items():
        if isinstance(got, str):
            peer_rows.append(f"| {name} | — | not measured: {got} | | | |")
            continue
        pn, rates = got
        peer_ratio[name] = fig["off50"][1] / med(rates)
        peer_rows.append(
            f"| {name} ({pn:,} turns) | — | {med(rates):,.0f}/s | {min(rates):,.0f}/s | "
            f"{med(rates) / emb:.2f}× | {', '.join(f'{r:,.0f}' for r in rates)} |"
        )
    d50, e50, hop50 = med(lat["daemon"]), med(lat["embedded"]), med(lat["hop"])
    d99, e99 = _pct(lat["daemon"], 0.99), _pct(lat["embedded"], 0.99)
    cl = flood["client"]
    cl_rate = med(r for _, r in cl)
    cl_min_got = min(g[0] for g, _ in cl)
    cl_gaps = sum(g[1] for g, _ in cl)
    cl_dropped = sum(g[2] for g, _ in cl)
    em = flood["embedded"]
    em_rate = med(r for _, r in em)
    big_rate = med(r for _, r in flood["big"])
    replay_rate = med(r for _, r in flood["replay"])
    tl = tick["lat"]
    fl = tick["floor"]
    n19 = tick["nice19"]
    p50, p99 = (_pct(tl, 0.5), _pct(tl, 0.99)) if tl else (float("nan"), float("nan"))
    r_off1, r_off50 = fig["off1"][1] / emb, fig["off50"][1] / emb
    j1, j50 = fig["on1"][0] / fig["off1"][0], fig["on50"][0] / fig["off50"][0]
    jt1, jt50 = fig["on1"][1] / fig["off1"][1], fig["on50"][1] / fig["off50"][1]
    lat_ratio = d50 / e50
    verdicts = [
        f"daemon 1 client ≥ 0.5× embedded — {r_off1:.2f}× {_verdict(r_off1 >= 0.5)} (a task per call "
        f"instead of `submit_many`: {fig['gather1'][1] / emb:.2f}×)",
        f"daemon 50 clients ≥ 0.5× embedded — {r_off50:.2f}× {_verdict(r_off50 >= 0.5)}",
    ]
    for name, r in peer_ratio.items():
        verdicts.append(f"50 clients ≥ 5× {name} — {r:.1f}× {_verdict(r >= 5)}")
    verdicts += [
        f"journal on ≥ 0.7× off (acks, 1 / 50 clients) — {j1:.2f}× / {j50:.2f}× "
        f"{_verdict(min(j1, j50) >= 0.7)}",
        f"daemon run() p50 ≤ 1.5× embedded — {lat_ratio:.2f}× {_verdict(lat_ratio <= 1.5)}",
        f"Client follower ≥ 100k events/s, 0 lost — live {cl_rate:,.0f}/s, fewest received "
        f"{cl_min_got:,} of {flood['count']:,} "
        f"{_verdict(cl_rate >= 100_000 and cl_min_got == flood['count'])} (the daemon → client path "
        f"alone: {replay_rate:,.0f}/s {_verdict(replay_rate >= 100_000)})",
        f"{tick['turns']} streams × {tick['rate']:.0f} ev/s: p99 ≤ 5 ms — {p99 * 1e3:.2f} ms "
        f"{_verdict(p99 <= 0.005)} (the floor of bare processes in the same run: "
        f"{_pct(fl['lat'], 0.99) * 1e3:.2f} ms; with `--worker-nice 19`: "
        f"{_pct(n19['lat'], 0.99) * 1e3:.2f} ms {_verdict(_pct(n19['lat'], 0.99) <= 0.005)}); "
        f"daemon CPU ≤ 1 core — {tick['cpu']:.2f} "
        f"{_verdict(tick['cpu'] <= 1)}",
    ]
    cmd = "`.venv/bin/python -m benchmarks --only production" + (" --quick`" if quick else "`")
    return (
        "## Production paths: daemon, journal and event streams vs the embedded core\n\n"
        f"{n:,} no-op turns, {WORKERS} workers. Embedded: `await sup.submit(...)` in a loop, then every "
        "`result()`. Daemon: each client submits its share at once (`submit_many`: every request in flight, "
        "no task per call), then waits for every result at once (`results`). *acks/s*: until every submit "
        "is acknowledged (journal on: after its row is committed); *turns/s*: until every result is in. "
        "Median of "
        f"{tp['reps']} repeats, the embedded and daemon runs back to back in each repeat.\n\n"
        "| path | acks/s | turns/s (median) | slowest | ÷ embedded | runs (turns/s) |\n"
        "| --- | ---: | ---: | ---: | ---: | --- |\n"
        f"| embedded `Supervisor` | — | {emb:,.0f}/s | {min(tp['embedded']):,.0f}/s | 1.00× | "
        f"{', '.join(f'{r:,.0f}' for r in tp['embedded'])} |\n" + "\n".join(rows + peer_rows) + "\n\n"
        f"Journal on ÷ off: acks {j1:.2f}× (1 client), {j50:.2f}× (50 clients); turns {jt1:.2f}× / "
        f"{jt50:.2f}×. Daemon (50 clients) ÷ peer: "
        + (", ".join(f"{k} {v:.1f}×" for k, v in peer_ratio.items()) or "no peer measured")
        + ".\n\n"
        f"`run()` one at a time ({len(lat['daemon']):,} samples each, interleaved): `Client` → daemon "
        f"p50 {d50 * 1e6:.0f} µs, p99 {d99 * 1e6:.0f} µs; embedded p50 {e50 * 1e6:.0f} µs, p99 "
        f"{e99 * 1e6:.0f} µs; ratio (p50) **{lat_ratio:.2f}×**. The bare `Client` ↔ daemon round trip "
        f"(`exists()` of an unknown id: no turn, no worker) p50 {hop50 * 1e6:.0f} µs; embedded + that "
        f"hop = {(e50 + hop50) * 1e6:.0f} µs.\n\n"
        f"One turn emitting {flood['count']:,} small events, followed live from its submit: `Client` "
        f"follower **{cl_rate:,.0f} events/s** (runs "
        + ", ".join(f"{r:,.0f}/s, {g[0]:,} received" for g, r in cl)
        + f"; gap markers {cl_gaps}, {cl_dropped:,} events reported dropped); embedded follower "
        f"{em_rate:,.0f} events/s (runs " + ", ".join(f"{r:,.0f}/s, {g[0]:,} received" for g, r in em) + "). "
        f"With `--max-events {flood['count'] + 10:,}` (the buffer holds the whole turn): live `Client` "
        f"follower {big_rate:,.0f} events/s (runs "
        + ", ".join(f"{r:,.0f}/s, {g[0]:,} received" for g, r in flood["big"])
        + "); the same turn followed again after it ended (the daemon → client path alone): "
        f"**{replay_rate:,.0f} events/s** (runs "
        + ", ".join(f"{r:,.0f}/s, {g[0]:,} received" for g, r in flood["replay"])
        + ").\n\n"
        f"{tick['turns']} concurrent turns emitting {tick['rate']:.0f} events/s each for "
        f"{tick['seconds']:.0f} s, "
        f"each followed by a `Client` task (one client, {tick['turns']} workers, every worker started and "
        f"warm first): emit → delivery p50 "
        f"{p50 * 1e3:.2f} ms, p99 **{p99 * 1e3:.2f} ms** ({len(tl):,} events, {tick['lost']} not received); "
        f"submit → first event p50 {_pct(tick['first'], 0.5) * 1e3:.1f} ms, p99 "
        f"{_pct(tick['first'], 0.99) * 1e3:.1f} ms; "
        f"daemon CPU **{tick['cpu']:.2f} cores** over the run, and it waited for a CPU "
        f"{tick['wait']:.2f} s per second (its threads together); the workers used "
        f"{tick['worker_us']:.0f} µs of CPU per event "
        f"({tick['worker_us'] * tick['turns'] * tick['rate'] / 1e6:.2f} cores). "
        f"Load average at the end {tick['load'][0]:.1f}.\n\n"
        f"Start-up, apart: `turnpool serve` to {tick['turns']} workers idle {tick['start_s']:.2f} s; then "
        f"{tick['turns']} turns submitted at once, one to each fresh worker: submit → first event p50 "
        f"{_pct(tick['fresh'], 0.5) * 1e3:.1f} ms, p99 {_pct(tick['fresh'], 0.99) * 1e3:.1f} ms (what a user "
        f"submitting {tick['turns']} turns to a fresh pool waits for).\n\n"
        f"With `--worker-nice 19` (WORKER-NICE: the workers below the daemon), right after: "
        f"emit → delivery p50 "
        f"{_pct(n19['lat'], 0.5) * 1e3:.2f} ms, p99 **{_pct(n19['lat'], 0.99) * 1e3:.2f} ms**; daemon CPU "
        f"{n19['cpu']:.2f} cores, waiting for a CPU {n19['wait']:.2f} s per second; workers "
        f"{n19['worker_us']:.0f} µs per event. Load average at the end {n19['load'][0]:.1f}.\n\n"
        f"The floor, same load right after: {tick['turns']} bare Python processes (asyncio and one "
        f"ZeroMQ DEALER each, nothing of turnpool) sending `time.monotonic()` {tick['rate']:.0f} times a "
        f"second to one ROUTER read in a blocking loop: emit → receive p50 "
        f"{_pct(fl['lat'], 0.5) * 1e3:.2f} ms, p99 **{_pct(fl['lat'], 0.99) * 1e3:.2f} ms**; "
        f"{fl['cpu_us']:.0f} µs of CPU per event in the senders "
        f"({fl['cpu_us'] * tick['turns'] * tick['rate'] / 1e6:.2f} cores).\n\n"
        "Targets: " + "; ".join(verdicts) + ".\n\n"
        f"Command: {cmd}"
    )


def run(quick: bool) -> str:
    return anyio.run(_main, quick, backend="asyncio")


if __name__ == "__main__":
    import sys

    print(run("--quick" in sys.argv))
