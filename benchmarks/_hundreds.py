"""The "hundreds of turns on one host" part of ``bench_scale``: the scale curve (``_scale_curve``),
streaming rows, cancels and kills under load and a daemon's shutdown (``_stream_rows``)."""

from __future__ import annotations

import os
from typing import Any

import anyio

from . import _close_cost, _scale_curve, _stream_rows
from ._common import log, med, ms, pct, table

_NAMES = {
    "turnpool": "turnpool",
    "turnpool-preload": "turnpool, agent module preloaded",
    "ppe-fork": "ProcessPoolExecutor (fork)",
    "ppe-forkserver": "ProcessPoolExecutor (forkserver)",
    "pebble": "pebble",
    "forked": "floor: forked children of the same imports",
}


def _curve(sizes: tuple[int, ...]) -> tuple[str, dict[tuple[str, int], dict[str, Any]]]:
    rows = []
    got: dict[tuple[str, int], dict[str, Any]] = {}
    for n in sizes:
        for system in _scale_curve.SYSTEMS:
            r = _scale_curve.fresh(system, n)
            got[(system, n)] = r
            log(f"scale {system} {n}: {r}")
            if "error" in r:
                rows.append([n, _NAMES[system], f"failed: {r['error']}", "", "", "", "", "", ""])
                continue
            rows.append(
                [
                    n,
                    _NAMES[system],
                    f"{r['start_s']:.2f} s" + ("" if r["distinct"] == n else f" ({r['distinct']} distinct)"),
                    f"{r['cpu_ms']:.1f} ms",
                    f"{r['pss_mib']:.2f} MiB",
                    f"{r['pool_mib']:.0f} MiB",
                    r["procs"],
                    f"{r['sup_rss_mib']:.0f} MiB",
                    f"{r['close_s']:.2f} s",
                ]
            )
    head = [
        "workers",
        "system",
        "start → a task on each",
        "CPU per worker",
        "PSS per worker",
        "pool PSS",
        "processes",
        "parent RSS",
        "close",
    ]
    return table(head, rows), got


def _ratio(
    got: dict[tuple[str, int], dict[str, Any]], key: str, n: int, peer: str, system: str = "turnpool"
) -> str:
    a, b = got.get((system, n), {}), got.get((peer, n), {})
    if key not in a or key not in b or not b[key]:
        return "—"
    return f"{a[key] / b[key]:.2f}×"


def section(quick: bool) -> str:
    sizes = (8, 32) if quick else (8, 32, 128, 256, 512)
    streams = (32, 64) if quick else (128, 256, 384, 512)
    seconds = 3.0 if quick else 5.0
    loaded = os.getloadavg()
    curve, got = _curve(sizes)
    top = sizes[-1]
    mid = 256 if 256 in sizes else sizes[-1]
    low = 128 if 128 in sizes else sizes[0]
    close_lin = "—"
    if ("turnpool", top) in got and ("turnpool", low) in got and "close_s" in got[("turnpool", low)]:
        close_lin = f"{got[('turnpool', top)]['close_s'] / got[('turnpool', low)]['close_s']:.1f}×"
    serve = []
    for n in (low, top):
        try:
            s = _stream_rows.serve_sigterm(n)
            serve.append(f"{n} idle workers {s['close_s']:.2f} s")
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            serve.append(f"{n} workers: failed ({exc!r:.100})")
    costs = []
    for n in (low, top):
        try:
            c = _close_cost.fresh(n)
            costs.append(
                f"{n} idle workers {c['close_s']:.2f} s, the supervisor's CPU "
                f"{c['supervisor_ms_per_worker']:.2f} ms and each worker's "
                f"{c['worker_exit_ms']:.2f} ms (median) per worker, load {c['load'][0]:.0f}"
            )
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            costs.append(f"{n} workers: failed ({exc!r:.100})")
    rows = []
    for n in streams:
        fl = _stream_rows.floor(n, seconds)
        apart = _stream_rows.floor(n, seconds, sessions=True)
        emb = anyio.run(_stream_rows.embedded, n, seconds)
        dae = anyio.run(_stream_rows.daemon, n, seconds)
        log(f"streams {n}: floor {fl} floor, a session each {apart} embedded {emb} daemon {dae}")
        for what, f in (
            ("floor: bare processes → one ZeroMQ reader", fl),
            ("floor, a session each (weighed as turnpool's workers)", apart),
        ):
            rows.append(
                [
                    n,
                    what,
                    ms(f["p50"]),
                    ms(f["p99"]),
                    "—",
                    f"{f['rate']:,.0f} of {n * _stream_rows.RATE:,.0f}/s",
                    f"{f['cpu_us']:.0f} µs (reader)",
                ]
            )
        for what, r in (("turnpool embedded", emb), ("turnpool daemon", dae)):
            rows.append(
                [
                    n,
                    what,
                    ms(r["p50"]) + f" ({r['p50'] / fl['p50']:.1f}×)",
                    ms(r["p99"]) + f" ({r['p99'] / fl['p99']:.1f}×)",
                    r["lost"],
                    f"{r['rate']:,.0f} of {r['want']:,.0f}/s",
                    f"{r['cpu_us']:.0f} µs ({r['cpu_us'] / fl['cpu_us']:.1f}×)",
                ]
            )
    load_n = 64 if quick else 256
    k = 10 if quick else 30
    under = anyio.run(_stream_rows.cancels_under_load, load_n, k)
    spin = _stream_rows.spinner_floor(k)
    return (
        "## Hundreds of workers on one host\n\n"
        f"Load average when this part began: {' / '.join(f'{x:.1f}' for x in loaded)}, when it ended: "
        f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} — other engineers' test runs shared these "
        "2 cores: "
        "compare rows of one run (ratios), not runs.\n\n"
        "Scale curve: N tasks submitted at once to a fresh pool of N workers, each holding its process "
        "0.5 s (N/100 s past 50 workers) so every worker gets one (each (system, N) in a fresh "
        "interpreter; `spares=0`). Start = pool "
        "created → the last task started; CPU = that start's CPU, every process counted, per worker; PSS = "
        "every process below the parent once idle (turnpool: workers, the zygote and its one watcher; "
        '"agent module preloaded": `preload=("benchmarks._agents",)`, so the workers inherit the agent\'s '
        "module from the zygote as the peers' workers inherit their task's from their parent); "
        "close = "
        "`aclose()` / shutdown and join:\n\n"
        + curve
        + f"\n\nturnpool ÷ ProcessPoolExecutor (fork) at {mid}: start "
        f"{_ratio(got, 'start_s', mid, 'ppe-fork')}, "
        f"CPU per worker {_ratio(got, 'cpu_ms', mid, 'ppe-fork')}, PSS per worker "
        f"{_ratio(got, 'pss_mib', mid, 'ppe-fork')} (agent module preloaded: start "
        f"{_ratio(got, 'start_s', mid, 'ppe-fork', 'turnpool-preload')}, CPU per worker "
        f"{_ratio(got, 'cpu_ms', mid, 'ppe-fork', 'turnpool-preload')}, PSS per worker "
        f"{_ratio(got, 'pss_mib', mid, 'ppe-fork', 'turnpool-preload')}). `aclose()` {top} ÷ {low} workers: "
        f"{close_lin}. "
        f"`turnpool serve` SIGTERM → exited: {'; '.join(serve)}. What `aclose()` costs "
        f"(`benchmarks._close_cost`: CPU from the close to each reap): {'; '.join(costs)}.\n\n"
        f"Streaming: N turns each emitting `time.monotonic()` {_stream_rows.RATE:.0f} times a second for "
        f"{seconds:.0f} s (`benchmarks._agents:ticker`), every event followed (embedded: "
        "`handle.events()` in "
        "the supervisor's process; daemon: a `Client`); the floor is N bare processes sending the same "
        "over ZeroMQ to one reader (`_tick_floor`), all in this program's session: with autogroups one "
        "scheduling group, where each turnpool worker leads a session of its own at the pool's light weight "
        '(WORKER-CPU-SHARE); the floor "a session each" is weighed as turnpool\'s processes are (each sender '
        "its own session at that weight, the reader raised as a supervisor leading its session would be). "
        "Ratios are to the first floor. Latency = emit → follower; rate = events delivered per "
        "second (what the agents got out); CPU per event = the supervisor's or the daemon's process (the "
        "floor: its reader, with ZeroMQ's I/O thread):\n\n"
        + table(["turns", "who", "p50", "p99", "lost", "rate", "CPU per event"], rows)
        + f"\n\nUnder {load_n} such streaming turns: a cooperative cancel (an awaiting agent: cancel → "
        f"`aborted`) p50 {ms(med(under['coop']))}, p99 {ms(pct(under['coop'], 99))}; a kill (a spinning "
        "agent, "
        f"the SIGTERM step → `killed`) p50 {ms(med(under['kill']))}, p99 {ms(pct(under['kill'], 99))}; "
        "a bare "
        f"spinner's SIGTERM → reaped, same run: p50 {ms(med(spin))} ({k} each)."
    )
