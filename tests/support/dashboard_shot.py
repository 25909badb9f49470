"""Take the docs' dashboard screenshots: ``python -m tests.support.dashboard_shot docs/dashboard.png
--history docs/dashboard-history.png``.

Starts a daemon with ``--http``, runs a minute of mixed turns through the HTTP API (every outcome),
leaves a few running, one of them cancelled and ignoring it (so its escalation countdown shows),
and saves a screenshot of the live page (and of the history view: the daemon's journal) from
Debian's headless Chromium.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import httpx

from tests.support import browserkit
from tests.support.daemonkit import serving

MIX = [("examples.agents:echo", {"text": "hi"})] * 12 + [
    ("examples.agents:streamer", {"count": 20}),
    ("examples.agents:failing", None),
    ("examples.agents:slow", {"seconds": 0.3}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--history", type=Path, default=None, help="also save the history view here")
    args = parser.parse_args()
    with (
        serving(
            "--workers",
            "4",
            "--spares",
            "1",
            "--grace",
            "20",
            "--kill-after",
            "2",
            "--drain",
            "0",
            "--http",
            "127.0.0.1:0",
        ) as d,
        httpx.Client(base_url=d.http_url, timeout=60) as http,
    ):
        rng = random.Random(7)
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            for _ in range(rng.randint(5, 25)):
                agent, inp = rng.choice(MIX)
                http.post("/v1/turns", json={"agent": agent, "input": inp})
            if rng.random() < 0.15:  # an aborted turn
                t = http.post(
                    "/v1/turns", json={"agent": "examples.agents:slow", "input": {"seconds": 5}}
                ).json()
                http.post(f"/v1/turns/{t['turn_id']}/cancel")
            if rng.random() < 0.05:  # a killed one
                t = http.post(
                    "/v1/turns", json={"agent": "examples.agents:stubborn", "grace": 0.2, "kill_after": 0.2}
                ).json()
                http.post(f"/v1/turns/{t['turn_id']}/cancel")
            time.sleep(0.25)  # allowed: paces the demo load, nothing waits on it
        # The newest ended rows: a failed turn (its error) and a killed one (its cause and signal).
        failed = http.post(
            "/v1/turns",
            json={
                "agent": "examples.agents:failing",
                "input": {"message": "the model returned no tool call"},
            },
        ).json()
        killed = http.post(
            "/v1/turns", json={"agent": "examples.agents:stubborn", "grace": 0.2, "kill_after": 0.2}
        ).json()
        time.sleep(1)  # allowed: the stubborn turn starts before it is cancelled
        http.post(f"/v1/turns/{killed['turn_id']}/cancel")
        for t in (failed, killed):
            http.get(f"/v1/turns/{t['turn_id']}", params={"wait": 60})
        http.post("/v1/turns", json={"agent": "tests.agents.http:ticker", "session": "chat-42"})
        http.post(
            "/v1/turns",
            json={"agent": "examples.agents:slow", "input": {"seconds": 600}, "session": "research-7"},
        )
        stuck = http.post(
            "/v1/turns", json={"agent": "examples.agents:stubborn", "session": "batch-3"}
        ).json()
        time.sleep(1.5)  # allowed: lets the stubborn turn start before it is cancelled
        http.post(f"/v1/turns/{stuck['turn_id']}/cancel")
        with browserkit.chromium(args.out.with_suffix(".log"), size=(1280, 1700)) as browser:
            browser.get(d.http_url)
            time.sleep(3)  # allowed: a few refreshes of the live page before the picture
            browser.save_screenshot(str(args.out))
            if args.history is not None:
                browser.get(d.http_url + "#/history")
                time.sleep(2)  # allowed: the history's first page loads before the picture
                browser.save_screenshot(str(args.history))
                print(f"saved {args.history}")
        args.out.with_suffix(".log").unlink(missing_ok=True)
        print(f"saved {args.out}")


if __name__ == "__main__":
    main()
