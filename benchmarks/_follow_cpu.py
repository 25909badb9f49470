"""The daemon's follower alone, without workers or sockets: N followed turns, one event each per round
(N turns ticking, each event alone, past ``COALESCE``), the loop thread's CPU per event sent
(``time.thread_time``: the emits, each reply's encoding and the followers' steps) and the followers' task
steps per event (CLIENT-ONE-STEP). ``python -m benchmarks._follow_cpu [N] [ROUNDS]`` (default 384 100)."""

from __future__ import annotations

import sys
import time
from typing import Any

import anyio

import wire
from tests.support.followkit import Rig


def _encoding(send: Any) -> Any:
    def send_encoded(ident: bytes, msg: Any) -> bool:
        wire.encode(msg)  # the daemon encodes each reply (CLIENT-BATCHES)
        return bool(send(ident, msg))

    return send_encoded


async def run(n: int, rounds: int) -> dict[str, float]:
    rigs = [Rig(256) for _ in range(n)]
    for rig in rigs:
        rig.requests.send = rig.requests.send_alone = _encoding(rig.requests.send)
    started = [rig.start() for rig in rigs]
    await anyio.sleep(0.05)  # allowed: every follower reaches its first wait
    steps0 = sum(c.steps for c, _ in started)
    t0 = time.thread_time()
    for _ in range(rounds):
        for rig in rigs:
            rig.emit(1)
        await anyio.sleep(0.006)  # allowed: past COALESCE, so each event comes alone
        for rig in rigs:
            rig.stream.grant(1)  # the client read it
    cpu = time.thread_time() - t0
    steps = sum(c.steps for c, _ in started) - steps0
    sent = sum(rig.events_sent() for rig in rigs)
    for rig, (_, task) in zip(rigs, started, strict=True):
        await rig.end(task)
    return {"events": sent, "steps": steps / sent, "cpu_us": cpu / sent * 1e6}


def main(argv: list[str]) -> None:
    n, rounds = (int(argv[0]) if argv else 384), (int(argv[1]) if len(argv) > 1 else 100)
    r = anyio.run(run, n, rounds)
    print(
        f"{n} followed turns: {r['events']:,.0f} events, {r['steps']:.2f} follower steps per event, "
        f"{r['cpu_us']:.1f} µs of the loop's CPU per event"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
