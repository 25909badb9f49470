"""What the dashboard costs the daemon: requests per second and daemon CPU while 1,000 turns are in it.

``python -m benchmarks.bench_dashboard [--seconds 20]`` (or ``python -m benchmarks --only dashboard``)
starts ``turnpool serve --http`` (2 workers, 1 spare, its journal), fills it with 1,000 turns (2
running for the whole run, 998 queued in 10 sessions) plus 1,000 ended ones in the journal, then
measures the daemon's CPU time (``utime + stime`` of its process, from ``/proc``) and the HTTP
requests it answered over equal windows: no page open (the baseline), the overview open in a
headless Chromium, then the history view. The page's cost is the difference with the baseline.
Needs Debian's ``chromium`` and ``chromium-driver`` and selenium (as ``tests/test_dashboard.py``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import httpx

from tests.support import browserkit
from tests.support.daemonkit import serving

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def window(http: httpx.Client, pid: int, seconds: float) -> tuple[float, float]:
    """Requests per second answered and CPU seconds per second used by the daemon over ``seconds``
    (this function's own two status requests left out)."""
    r0, c0, t0 = http.get("/v1/status").json()["http"]["requests"], cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)  # allowed: the measuring window itself
    r1, c1, t1 = http.get("/v1/status").json()["http"]["requests"], cpu_seconds(pid), time.monotonic()
    return (r1 - r0 - 1) / (t1 - t0), (c1 - c0) / (t1 - t0)


def measure(seconds: float) -> list[tuple[str, float, float]]:
    """(page, requests/s, daemon CPU in cores) for no page, the overview, then the history."""
    with (
        serving("--workers", "2", "--spares", "1", "--drain", "0", "--http", "127.0.0.1:0") as d,
        httpx.Client(base_url=d.http_url, timeout=60) as http,
    ):
        ended = [http.post("/v1/turns", json={"agent": "examples.agents:echo"}).json() for _ in range(1000)]
        for t in ended:
            http.get(f"/v1/turns/{t['turn_id']}", params={"wait": 60})
        for _ in range(2):
            http.post("/v1/turns", json={"agent": "examples.agents:slow", "input": {"seconds": 3600}})
        for i in range(998):
            http.post("/v1/turns", json={"agent": "examples.agents:echo", "session": f"batch-{i % 10}"})
        rows = [("no page (baseline)", *window(http, d.pid, seconds))]
        with browserkit.chromium(Path("/tmp") / f"bench-dashboard-{os.getpid()}.log") as browser:
            browser.get(d.http_url)
            time.sleep(2)  # allowed: the page's first loads settle before the window
            rows.append(("overview open", *window(http, d.pid, seconds)))
            browser.get(d.http_url + "#/history")
            time.sleep(2)  # allowed: as above
            rows.append(("history open", *window(http, d.pid, seconds)))
    return rows


def run(quick: bool) -> str:
    """The RESULTS.md section (``python -m benchmarks``)."""
    title = "## dashboard: requests and daemon CPU with 1,000 turns\n\n"
    if browserkit.missing():
        return title + f"Not measured in this run: {browserkit.missing()}.\n"
    seconds = 5.0 if quick else 20.0
    rows = measure(seconds)
    base = rows[0][2]
    lines = [
        title + "The dashboard in a headless Chromium against a daemon (2 workers, 1 spare, journal on)"
        " holding 1,000 turns (2 running for the whole run, 998 queued in 10 sessions) after 1,000 ended"
        f" ones; {seconds:g}-second windows; daemon CPU is the `utime + stime` of its process from"
        " `/proc`. The page's cost is its row minus the baseline.\n",
        "| page | requests/s | daemon CPU | page's cost over the baseline |",
        "| --- | --- | --- | --- |",
    ]
    for name, rps, cpu in rows:
        extra = "–" if name.startswith("no page") else f"{(cpu - base) * 100:.1f} % of a core"
        lines.append(f"| {name} | {rps:.1f} | {cpu * 100:.1f} % of a core | {extra} |")
    lines.append(f"\nCommand: `.venv/bin/python -m benchmarks.bench_dashboard --seconds {seconds:g}`.\n")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    if browserkit.missing():
        raise SystemExit(browserkit.missing())
    rows = measure(args.seconds)
    base = rows[0][2]
    print(f"1,000 turns in the daemon (2 running, 998 queued), 1,000 ended; {args.seconds:g} s windows")
    print("| page | requests/s | daemon CPU | page's cost over the baseline |")
    print("| --- | --- | --- | --- |")
    for name, rps, cpu in rows:
        extra = "–" if name.startswith("no page") else f"{(cpu - base) * 100:.1f} % of a core"
        print(f"| {name} | {rps:.1f} | {cpu * 100:.1f} % of a core | {extra} |")


if __name__ == "__main__":
    main()
