"""Hundreds of streaming turns at once, beside the bare-process floor: N turns each emitting
``time.monotonic()`` ``RATE`` times a second (``benchmarks._agents:ticker``), followed embedded
and through a ``turnpool serve`` daemon; N bare processes sending the same over ZeroMQ to one
reader (``_tick_floor``). Cancels and kills under 256 of those turns, beside a bare spinner's
SIGTERM → reaped. A daemon's SIGTERM with N idle workers, until its process is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psutil

from supervisor import Client, Supervisor

from ._common import ms, pct

RATE = 20.0
AGENT = "benchmarks._agents:ticker"


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


async def _streams(sup: Any, n: int, seconds: float, pid: int) -> dict[str, Any]:
    """N ticking turns at once on ``sup`` (a ``Supervisor`` or a ``Client``); the follower's
    emit → delivery latencies, events lost, the agents' delivered rate, the engine's CPU per event."""
    lat: list[float] = []
    lost = 0

    async def one(inp: dict[str, float], into: list[float] | None) -> None:
        nonlocal lost
        handle = await sup.submit(AGENT, inp)
        got = 0
        async for ev in handle.events():
            if isinstance(ev, float):
                if into is not None:
                    into.append(time.monotonic() - ev)
                got += 1
        if into is not None:
            lost += int(inp["rate"] * inp["seconds"]) - got

    async with anyio.create_task_group() as tg:  # every worker imports the agent first
        for _ in range(n):
            tg.start_soon(one, {"rate": 100, "seconds": 0.02}, None)
    await anyio.sleep(1.0)  # allowed: the warm-up's exits settle
    cpu0, t0 = _cpu_s(pid), time.monotonic()
    nice = _autogroup_nice(pid)  # WORKER-SUPERVISOR-WEIGHT: raised or not, while the pool runs
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one, {"rate": RATE, "seconds": seconds}, lat)
    dt = time.monotonic() - t0
    events = n * int(RATE * seconds)
    return {
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
        "lost": lost,
        "rate": len(lat) / dt,
        "want": n * RATE,
        "cpu_us": (_cpu_s(pid) - cpu0) / max(1, events) * 1e6,
        "nice": nice,
    }


def _autogroup_nice(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


async def embedded(n: int, seconds: float) -> dict[str, Any]:
    async with Supervisor(workers=n, spares=0, start_timeout=600, max_queue=max(1000, 4 * n)) as sup:
        return await _streams(sup, n, seconds, os.getpid())


async def daemon(n: int, seconds: float, own_session: bool = False) -> dict[str, Any]:
    """``own_session``: the daemon leads a session of its own (``setsid``), as a service's process
    does (systemd starts each in one): where it may, it raises its weight (WORKER-SUPERVISOR-WEIGHT).
    Without it the daemon is a child in this program's session, which it does not lead."""
    from tests.support import daemonkit

    opts = ("--workers", str(n), "--spares", "0", "--drain", "0", "--no-journal", "--start-timeout", "600")
    with daemonkit.serving(*opts, wrap=("setsid",) if own_session else ()) as served:
        async with Client.connect(served.endpoint, timeout=600) as client:
            return await _streams(client, n, seconds, served.pid)


def floor(n: int, seconds: float, sessions: bool = False) -> dict[str, Any]:
    """``sessions``: each sender in a session (autogroup) of its own at the pool's niceness and the
    reader raised as a supervisor would be, as turnpool's processes are weighed (``_tick_floor``)."""
    from . import _tick_floor

    r = _tick_floor.tickers(n, RATE, seconds, sessions=sessions)
    return {
        "nice": r["reader_nice"],
        "p50": pct(r["lat"], 50),
        "p99": pct(r["lat"], 99),
        "cpu_us": r["reader_us"],
        "sender_us": r["cpu_us"],
        "rate": r["rate"],
        "n": len(r["lat"]),
    }


async def _first(handle: Any) -> Any:
    async for event in handle.events():
        return event


@contextlib.asynccontextmanager
async def streaming(n: int, grace: float) -> AsyncIterator[Any]:
    """A supervisor with ``n`` ticking turns streaming, each followed here, for cancels under their load
    (the streams are cancelled at the exit)."""
    async with (
        Supervisor(
            workers=n + 2,
            spares=1,
            start_timeout=600,
            grace=grace,
            kill_after=1.0,
            max_queue=max(1000, 4 * n),
        ) as sup,
        anyio.create_task_group() as tg,
    ):

        async def stream() -> None:
            handle = await sup.submit(AGENT, {"rate": RATE, "seconds": 3600})
            async for _ in handle.events():
                pass

        for _ in range(n):
            tg.start_soon(stream)
        await anyio.sleep(3.0)  # allowed: the streams get going
        yield sup
        tg.cancel_scope.cancel()


async def cancels_under_load(n: int, k: int, grace: float = 0.05) -> dict[str, list[float]]:
    """``n`` ticking turns stream while ``k`` cooperative cancels (an awaiting agent: cancel →
    ``aborted``) and ``k`` kills (a spinner: the SIGTERM step, ``grace`` after the cancel, →
    ``killed``) are timed one after the other."""
    coop: list[float] = []
    kill: list[float] = []
    async with streaming(n, grace) as sup:
        for _ in range(k):
            handle = await sup.submit("benchmarks._agents:awaiting", grace=10.0)  # the abort, not a kill
            await _first(handle)
            t0 = time.monotonic()
            await handle.cancel()
            result = await handle.result()
            coop.append(time.monotonic() - t0)
            assert result.outcome == "aborted", result
        for _ in range(k):
            handle = await sup.submit("benchmarks._agents:spin")
            await _first(handle)
            t0 = time.monotonic()
            await handle.cancel()
            result = await handle.result()
            kill.append(time.monotonic() - t0 - grace)
            assert result.outcome == "killed", result
    return {"coop": coop, "kill": kill}


def spinner_floor(k: int) -> list[float]:
    from .bench_kill import _stop_floor

    return _stop_floor(k)


def serve_sigterm(n: int) -> dict[str, float]:
    """``turnpool serve`` with ``n`` idle workers: SIGTERM → its process gone."""
    from tests.support import daemonkit

    served = daemonkit.start("--workers", str(n), "--spares", "0", "--drain", "0", "--no-journal")
    try:

        async def wait_ready() -> None:
            async with Client.connect(served.endpoint, timeout=600) as client:
                with anyio.fail_after(600):
                    while True:
                        workers = (await client.status())["workers"]
                        if len(workers) >= n and all(w["state"] == "idle" and w["pid"] for w in workers):
                            return
                        await anyio.sleep(0.2)

        anyio.run(wait_ready)
        t0 = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        served.proc.wait(600)
        return {"n": n, "close_s": time.monotonic() - t0}
    finally:
        daemonkit.stop_process(served.proc)
        import shutil

        shutil.rmtree(served.home, ignore_errors=True)


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: list[str]) -> None:
    """The streaming rows alone, each front end beside both floors, one after the other:
    ``python -m benchmarks._stream_rows [--seconds=S] [N ...]`` (default 256 384, 5 s). Run it under
    ``setsid -w`` to see what a supervisor that leads its session (a service's process) gets, and
    without to see what one embedded in a program started from a shell gets. ``floor`` is the bare
    processes in this program's one session; ``floor, a session each``: weighed as turnpool's are."""
    seconds = next((float(a.split("=", 1)[1]) for a in argv if a.startswith("--seconds=")), 5.0)
    sizes = tuple(int(a) for a in argv if not a.startswith("--")) or (256, 384)
    leads = os.getsid(0) == os.getpid()
    print(
        f"loadavg before: {_loadavg()}; this process leads its session: {leads}; uid {os.getuid()}",
        flush=True,
    )
    for n in sizes:
        fl = floor(n, seconds)
        runs: list[tuple[str, dict[str, Any]]] = [
            ("floor: one session", fl),
            ("floor: a session each", floor(n, seconds, sessions=True)),
            ("embedded", anyio.run(embedded, n, seconds)),
            ("daemon, this session", anyio.run(daemon, n, seconds)),
            ("daemon, its own session", anyio.run(daemon, n, seconds, True)),
        ]
        for what, r in runs:
            extra = f" lost {r['lost']}" if "lost" in r else ""
            print(
                f"{n} {what:26s} p50 {ms(r['p50'])} ({r['p50'] / fl['p50']:.1f}×) "
                f"p99 {ms(r['p99'])} ({r['p99'] / fl['p99']:.1f}×) rate {r['rate']:,.0f}/s "
                f"CPU/event {r['cpu_us']:.0f} µs ({r['cpu_us'] / fl['cpu_us']:.1f}×) "
                f"autogroup nice {r['nice']}{extra} | load {_loadavg()}",
                flush=True,
            )
    print(f"loadavg after: {_loadavg()}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
