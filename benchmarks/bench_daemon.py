"""The serve daemon's cost: a turn through ``Client`` vs the embedded ``Supervisor``, and more.

* round trip: ``run("examples.agents:noop")`` one after another, median latency, through a
  ``Client`` of a real ``turnpool serve`` (one extra hop over ipc, one request per run) vs the
  embedded ``Supervisor`` in this process; both on 2 workers, interleaved per repeat;
* concurrency: 50 clients submitting 20 noop turns each at once, then awaiting them: turns/s;
* cancel → ``aborted`` as a client sees it (cooperative ``slow`` agent), median;
* a client against no daemon: how long until ``DaemonUnavailable`` (missing ipc socket file, stale
  socket file, closed tcp port).

The ratio is the daemon's overhead on the smallest turn; real turns (model calls, tools) dwarf it.
"""

from __future__ import annotations

import shutil
import socket
import statistics
import tempfile
import time

import anyio

WORKERS = 2


async def _rtt(backend: object, n: int) -> float:
    run = backend.run  # type: ignore[attr-defined]
    for _ in range(20):
        await run("examples.agents:noop")
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        await run("examples.agents:noop")
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


async def _many(endpoint: str, clients: int, per: int) -> float:
    from supervisor import Client

    async def one() -> None:
        async with Client.connect(endpoint, timeout=60) as client:
            handles = [await client.submit("examples.agents:noop") for _ in range(per)]
            for h in handles:
                await h.result()

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(clients):
            tg.start_soon(one)
    return clients * per / (time.perf_counter() - t0)


async def _cancel(endpoint: str, n: int) -> float:
    from supervisor import Client

    ts = []
    async with Client.connect(endpoint) as client:
        for _ in range(n):
            handle = await client.submit("examples.agents:slow", {"seconds": 60})
            async for _ in handle.events():
                break
            t0 = time.perf_counter()
            await handle.cancel()
            result = await handle.result()
            ts.append(time.perf_counter() - t0)
            assert result.outcome == "aborted"
    return statistics.median(ts)


async def _no_daemon() -> dict[str, float]:
    from supervisor import Client, DaemonUnavailable

    home = tempfile.mkdtemp(prefix="tpb", dir="/tmp")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(f"{home}/stale.sock")
    stale.close()
    port_sock = socket.socket()
    port_sock.bind(("127.0.0.1", 0))
    port = port_sock.getsockname()[1]
    port_sock.close()
    out = {}
    for name, ep in (
        ("no socket file", f"ipc://{home}/none.sock"),
        ("stale socket file", f"ipc://{home}/stale.sock"),
        ("closed tcp port", f"tcp://127.0.0.1:{port}"),
    ):
        ts = []
        for _ in range(10):
            t0 = time.perf_counter()
            try:
                async with Client.connect(ep):
                    pass
            except DaemonUnavailable:
                ts.append(time.perf_counter() - t0)
        out[name] = statistics.median(ts)
    shutil.rmtree(home, ignore_errors=True)
    return out


async def _main(quick: bool) -> str:
    from supervisor import Client, Supervisor
    from tests.support import daemonkit

    n, repeats, cancels = (200, 3, 5) if quick else (1000, 5, 15)
    via_client: list[float] = []
    embedded: list[float] = []
    many: list[float] = []
    cancel: list[float] = []
    with daemonkit.serving("--workers", str(WORKERS), "--spares", "0", "--drain", "0") as served:
        for _ in range(repeats):
            async with Client.connect(served.endpoint) as client:
                via_client.append(await _rtt(client, n))
            async with Supervisor(workers=WORKERS, spares=0) as sup:
                embedded.append(await _rtt(sup, n))
            many.append(await _many(served.endpoint, 50, 20))
            cancel.append(await _cancel(served.endpoint, cancels))
    refused = await _no_daemon()
    c, e = statistics.median(via_client), statistics.median(embedded)
    ms = ", ".join
    return (
        "## daemon: a turn through `Client` + `turnpool serve` vs the embedded `Supervisor`\n\n"
        f'`run("examples.agents:noop")` {n:,} times in a row after 20 warm-ups, {WORKERS} workers, median '
        f"latency; median of {repeats} repeats, the two interleaved.\n\n"
        "| path | median run() | repeats (ms) |\n| --- | ---: | --- |\n"
        f"| `Client` → daemon (ipc) | {c * 1e3:.2f} ms | {ms(f'{t * 1e3:.2f}' for t in via_client)} |\n"
        f"| embedded `Supervisor` | {e * 1e3:.2f} ms | {ms(f'{t * 1e3:.2f}' for t in embedded)} |\n\n"
        f"Ratio, daemon ÷ embedded latency: **{c / e:.2f}×** (one more process hop per turn).\n\n"
        f"50 clients × 20 noop turns at once: **{statistics.median(many):,.0f} turns/s** (median; runs "
        f"{ms(f'{t:,.0f}' for t in many)}). Cancel → `aborted` seen by a client (cooperative agent): "
        f"**{statistics.median(cancel) * 1e3:.1f} ms** median. A client against no daemon fails with "
        "`DaemonUnavailable` after: "
        + ", ".join(f"{name} {t * 1e3:.1f} ms" for name, t in refused.items())
        + " (median of 10)."
    )


def run(quick: bool) -> str:
    return anyio.run(_main, quick, backend="asyncio")


if __name__ == "__main__":
    import sys

    print(run("--quick" in sys.argv))
