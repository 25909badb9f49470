"""Cooperative cancel latency: ``cancel()`` → ``result()`` of a turn awaiting in a loop."""

from __future__ import annotations

import time
from contextlib import aclosing

import anyio

from supervisor import Supervisor

from . import _peers
from ._common import command, heavy_peers_reason, log, med, ms, pct, ratio, run_peer, skipped_lines, table


async def _turnpool(n: int) -> list[float]:
    out = []
    async with Supervisor(workers=1, spares=0, grace=5.0) as sup:
        for _ in range(n):
            handle = await sup.submit("benchmarks._agents:awaiting")
            async with aclosing(handle.events()) as events:
                async for _ in events:
                    break
            t0 = time.perf_counter()
            await handle.cancel()
            result = await handle.result()
            out.append(time.perf_counter() - t0)
            assert result.outcome == "aborted", result
    return out


def run(quick: bool) -> str:
    n = 100 if quick else 500
    skipped: dict[str, str] = {}
    results: dict[str, tuple[str, list[float]]] = {}
    results["turnpool"] = (
        "Abort → agent's scope cancelled → `aborted`, same worker",
        anyio.run(_turnpool, n),
    )
    log(f"turnpool: p50 {ms(med(results['turnpool'][1]))}")
    npeb = 5 if quick else 20
    r = run_peer("pebble", lambda: _peers.pebble_kill(npeb, 0.05)[1], skipped)
    if r:
        results["pebble"] = ("`future.cancel()` → worker process gone (pebble kills; no cooperative stop)", r)
    for peer in ("ProcessPoolExecutor", "loky"):
        skipped[peer] = "cannot stop a running task (`cancel()` returns False once it runs)"
    skipped["Celery"] = (
        "`revoke()` without terminate does not stop a running task (with terminate it kills: see kill "
        "overshoot)"
    )
    heavy = heavy_peers_reason(quick)
    if heavy:
        skipped["Ray"] = heavy
    else:
        r = run_peer("Ray", lambda: _peers.ray_cancel(30, force=False), skipped)
        if r:
            results["Ray"] = (
                "`ray.cancel(force=False)` (KeyboardInterrupt in the task) → `ray.get` raises",
                r,
            )
    tp = results["turnpool"][1]
    rows = []
    for name, (what, xs) in results.items():
        rows.append(
            [
                f"**{name}**" if name == "turnpool" else name,
                what,
                len(xs),
                ms(med(xs)),
                ms(pct(xs, 99)),
                "1.0×" if name == "turnpool" else ratio(med(xs) / med(tp)),
            ]
        )
    p50, p99 = med(tp), pct(tp, 99)
    return (
        "## Cooperative cancel latency\n\n"
        "A turn that awaits in a loop (1 ms sleeps) is cancelled once it has started; timed from `cancel()` "
        "until `result()` returns (the worker reported the end).\n\n"
        + table(["system", "what is timed", "samples", "p50", "p99", "peer ÷ turnpool (p50)"], rows)
        + f"\n\nTargets: p50 ≤ 0.3 ms — {ms(p50)} {'met' if p50 <= 0.3e-3 else 'MISSED'}; "
        f"p99 ≤ 1 ms — {ms(p99)} {'met' if p99 <= 1e-3 else 'MISSED'}."
        + skipped_lines(skipped)
        + f"\n\nCommand: {command('cancel', quick)}"
    )
