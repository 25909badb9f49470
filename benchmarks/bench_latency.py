"""Submit → result latency: one no-op turn at a time."""

from __future__ import annotations

import time

import anyio

from supervisor import Supervisor

from . import _floor, _peers
from ._common import command, heavy_peers_reason, log, med, ms, pct, ratio, run_peer, skipped_lines, table


async def _turnpool(n: int) -> list[float]:
    out = []
    async with Supervisor(workers=2, spares=0) as sup:
        for _ in range(50):
            await sup.run("examples.agents:noop")
        for _ in range(n):
            t0 = time.perf_counter()
            await sup.run("examples.agents:noop")
            out.append(time.perf_counter() - t0)
    return out


def run(quick: bool) -> str:
    n = 500 if quick else 3_000
    skipped: dict[str, str] = {}
    results: dict[str, list[float]] = {"turnpool": []}
    # Three rounds, turnpool and each process-pool peer back to back in each, so the ratios
    # compare figures taken under the same load (the machine is shared).
    for _ in range(3):
        results["turnpool"] += anyio.run(_turnpool, n // 3)
        for peer in _peers.FUTURE_PEERS:
            if peer in skipped:
                continue
            r = run_peer(peer, lambda p=peer: _peers.futures_latency(p, n // 3), skipped)
            if r:
                results.setdefault(peer, []).extend(r[1:])  # the first starts the peer's pool
    log(f"turnpool: p50 {ms(med(results['turnpool']))}")
    heavy = heavy_peers_reason(quick)
    if heavy:
        skipped["Celery"] = skipped["Ray"] = heavy
    else:
        r = run_peer("Celery", lambda: _peers.celery_latency(300), skipped)
        if r:
            results["Celery"] = r
        r = run_peer("Ray", lambda: _peers.ray_latency(500), skipped)
        if r:
            results["Ray"] = r
    floor = _floor.asyncio_zmq_rtt(n)
    results["floor: asyncio + ZeroMQ ipc echo"] = floor
    tp = results["turnpool"]
    rows = []
    for name, xs in results.items():
        rows.append(
            [
                f"**{name}**" if name == "turnpool" else name,
                len(xs),
                ms(med(xs)),
                ms(pct(xs, 99)),
                "1.0×" if name == "turnpool" else ratio(med(xs) / med(tp)),
            ]
        )
    p50, p99 = med(tp), pct(tp, 99)
    peers = {k: med(results[k]) for k in _peers.FUTURE_PEERS if k in results}
    best = min(peers, key=lambda k: peers[k]) if peers else None
    return (
        "## Submit → result latency\n\n"
        "One no-op turn at a time, 2 workers, after a warm-up: `await sup.run(...)` (peers: "
        "`submit(...).result()`).\n\n"
        + table(["system", "samples", "p50", "p99", "peer ÷ turnpool (p50)"], rows)
        + "\n\nThe floor row is a bare round trip on turnpool's stack (ROUTER/DEALER over ipc, an asyncio "
        "FD reader on each side, no turn logic), measured in the same run: what is left above it is "
        "turnpool's own work per turn (submit, dispatch, run, end, result) on both sides."
        + (
            f"\n\nWhere a miss comes from: the floor alone is {med(floor) / peers[best]:.2f}× {best}'s "
            f"p50 (each ZeroMQ message crosses an I/O thread on both sides; the peers write to a pipe), and "
            f"turnpool's own work per turn above it is {ms(p50 - med(floor))} (on the supervisor: submit, "
            "dispatch, the result; in the worker: the start marker, the End log, the end-of-turn sweep, "
            "the agent's cancel scope)."
            if best is not None
            else ""
        )
        + "\n\nTargets: "
        + (
            f"p50 ≤ the best of pebble / ProcessPoolExecutor / loky p50 in the same run ({best}, "
            f"{ms(peers[best])}) — {ms(p50)} = {p50 / peers[best]:.2f}× "
            f"{'met' if p50 <= peers[best] else 'MISSED'}; "
            if best is not None
            else ""
        )
        + f"p50 ≤ 200 µs — {ms(p50)} {'met' if p50 <= 200e-6 else 'MISSED'}; "
        f"p99 ≤ 1 ms — {ms(p99)} {'met' if p99 <= 1e-3 else 'MISSED'}."
        + skipped_lines(skipped)
        + f"\n\nCommand: {command('latency', quick)}"
    )
