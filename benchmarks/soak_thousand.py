"""A thousand concurrent turns held for minutes: ``python -m benchmarks.soak_thousand`` (``make
soak-thousand``; ``--turns`` and ``--minutes`` to change the defaults, 1,000 and 5).

A ``turnpool serve`` daemon with one worker per turn and its HTTP front end; one ``Client`` submits
every turn at once, each an I/O-bound agent emitting ``time.monotonic()`` once a second for the
whole soak (``benchmarks._agents:ticker``), and follows every event. Every ``SAMPLE`` seconds, while
they run: the daemon's RSS, a ``status()`` round trip, and the dashboard (its page, and the first
page of ``GET /v1/live`` it polls). At the end: events lost (expected − followed), each figure's
worst and p99, and every turn's outcome. Printed as Markdown and appended to
``benchmarks/SOAK.md``. The scaled-down check is ``tests/test_thousand_soak.py``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil

from supervisor import Client

from ._common import pct

AGENT = "benchmarks._agents:ticker"
SAMPLE = 5.0
TARGETS = {"rss_mib": 200.0, "status_s": 0.020}


def serve_options(workers: int) -> tuple[str, ...]:
    """``turnpool serve``'s options for the soak's pool: ``workers`` workers, no spares, journal or drain."""
    return (
        "--workers",
        str(workers),
        "--spares",
        "0",
        "--drain",
        "0",
        "--no-journal",
        "--start-timeout",
        "600",
    )


async def soak(turns: int, seconds: float, *, sample: float = SAMPLE, rate: float = 1.0) -> dict[str, Any]:
    """Run the soak; returns its figures (no verdicts: the caller compares)."""
    from tests.support import daemonkit

    daemonkit.READY_TIMEOUT = max(daemonkit.READY_TIMEOUT, 60.0 + turns * 0.5)  # the pool starts first
    opts = (*serve_options(turns), *daemonkit.HTTP)
    out: dict[str, Any] = {"turns": turns, "seconds": seconds, "rate": rate}
    rss: list[float] = []
    status_s: list[float] = []
    page_s: list[float] = []
    live_s: list[float] = []
    live_rows: list[int] = []
    outcomes: dict[str, int] = {}
    got = 0
    t_start = time.monotonic()
    with daemonkit.serving(*opts) as served:
        out["start_s"] = time.monotonic() - t_start
        proc = psutil.Process(served.pid)
        async with (
            Client.connect(served.endpoint, timeout=600) as client,
            httpx.AsyncClient(base_url=served.http_url, timeout=60) as http,
        ):
            running = anyio.Event()
            submitted = 0

            async def one() -> None:
                nonlocal got, submitted
                handle = await client.submit(AGENT, {"rate": rate, "seconds": seconds})
                submitted += 1
                if submitted == turns:
                    running.set()
                async for ev in handle.events():
                    if isinstance(ev, float):
                        got += 1
                result = await handle.result()
                outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1

            async def sampler() -> None:
                await running.wait()
                while True:
                    await anyio.sleep(sample)  # allowed: the sampling period
                    rss.append(proc.memory_info().rss / 2**20)
                    t0 = time.perf_counter()
                    await client.status()
                    status_s.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    r = await http.get("/")
                    page_s.append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.status_code
                    t0 = time.perf_counter()
                    r = await http.get("/v1/live")
                    live_s.append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.text[:200]
                    body = r.json()
                    rows = body.get("turns", body.get("items", [])) if isinstance(body, dict) else body
                    live_rows.append(len(rows) if isinstance(rows, list) else -1)

            t0 = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(sampler)
                async with anyio.create_task_group() as turns_tg:
                    for _ in range(turns):
                        turns_tg.start_soon(one)
                tg.cancel_scope.cancel()
            out["wall_s"] = time.monotonic() - t0
    expected = turns * int(rate * seconds)
    out.update(
        expected=expected,
        followed=got,
        lost=expected - got,
        outcomes=outcomes,
        samples=len(rss),
        rss_mib_max=max(rss, default=float("nan")),
        status_s_p50=pct(status_s, 50),
        status_s_p99=pct(status_s, 99),
        status_s_max=max(status_s, default=float("nan")),
        page_s_max=max(page_s, default=float("nan")),
        live_s_p99=pct(live_s, 99),
        live_s_max=max(live_s, default=float("nan")),
        live_rows=max(live_rows, default=0),
        load=os.getloadavg(),
    )
    return out


def report(r: dict[str, Any]) -> str:
    ok_rss = r["rss_mib_max"] <= TARGETS["rss_mib"]
    ok_status = r["status_s_p99"] <= TARGETS["status_s"]
    return (
        f"## {r['turns']:,} concurrent turns for {r['seconds'] / 60:.1f} minutes "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
        f"`python -m benchmarks.soak_thousand --turns {r['turns']} --minutes {r['seconds'] / 60:g}`: "
        "a daemon with "
        f"{r['turns']:,} workers (started in {r['start_s']:.1f} s), every turn I/O-bound emitting once a "
        "second, "
        f"all followed by one `Client`; sampled every {SAMPLE:.0f} s ({r['samples']} samples). "
        "Load average at the "
        f"end {' / '.join(f'{x:.1f}' for x in r['load'])} (shared machine).\n\n"
        f"- events: {r['followed']:,} followed of {r['expected']:,} — **{r['lost']} lost**; "
        f"outcomes {r['outcomes']}\n"
        f"- daemon RSS, worst: {r['rss_mib_max']:.0f} MiB "
        f"(target ≤ 200 MiB: {'met' if ok_rss else 'MISSED'})\n"
        f"- `status()`: p50 {r['status_s_p50'] * 1e3:.1f} ms, p99 {r['status_s_p99'] * 1e3:.1f} ms, "
        f"worst {r['status_s_max'] * 1e3:.1f} ms "
        f"(target ≤ 20 ms: {'met' if ok_status else 'MISSED'})\n"
        f"- dashboard: page worst {r['page_s_max'] * 1e3:.1f} ms; `GET /v1/live` p99 "
        f"{r['live_s_p99'] * 1e3:.1f} ms, "
        f"worst {r['live_s_max'] * 1e3:.1f} ms ({r['live_rows']} rows on its first page)\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak_thousand")
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=5.0)
    args = parser.parse_args()
    text = report(anyio.run(soak, args.turns, args.minutes * 60))
    print(text)
    path = Path(__file__).with_name("SOAK.md")
    with path.open("a") as f:
        f.write("\n" + text)


if __name__ == "__main__":
    main()
