"""Submit throughput of ``turnpool serve`` with the journal on vs off.

A submit is acknowledged only after its journal row is committed; the journal batches rows
into one transaction per writer wake-up (group commit), so concurrent submits share commits.
Measured: 10 clients each submitting ``per`` noop turns at once, until every ``submit`` is
acknowledged (acks/s), then until every result is in (turns/s); journal off and on,
interleaved per repeat, same daemon options.
"""

from __future__ import annotations

import shutil
import statistics
import time

import anyio

CLIENTS = 10


async def _submits(endpoint: str, per: int) -> tuple[float, float]:
    from supervisor import Client

    acked = anyio.Event()
    remaining = CLIENTS
    handles_all: list = []

    async def one() -> None:
        nonlocal remaining
        async with Client.connect(endpoint, timeout=120) as client:
            handles = [await client.submit("examples.agents:noop") for _ in range(per)]
            handles_all.extend(handles)
            remaining -= 1
            if remaining == 0:
                acked.set()
            for h in handles:
                await h.result()

    t0 = time.perf_counter()
    t_ack = 0.0
    async with anyio.create_task_group() as tg:
        for _ in range(CLIENTS):
            tg.start_soon(one)
        await acked.wait()
        t_ack = time.perf_counter() - t0
    total = time.perf_counter() - t0
    n = CLIENTS * per
    return n / t_ack, n / total


async def _main(quick: bool) -> str:
    from tests.support import daemonkit

    per, repeats = (100, 3) if quick else (500, 5)
    opts = ("--workers", "2", "--spares", "0", "--drain", "0")
    results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    for _ in range(repeats):
        for mode in ("off", "on"):
            home = daemonkit.short_dir()
            extra = ("--no-journal",) if mode == "off" else ("--journal", str(home / "j.sqlite3"))
            with daemonkit.serving(*opts, *extra) as served:
                results[mode].append(await _submits(served.endpoint, per))
            shutil.rmtree(home, ignore_errors=True)
    med = {
        m: (statistics.median(a for a, _ in r), statistics.median(t for _, t in r))
        for m, r in results.items()
    }
    n = CLIENTS * per
    return (
        "## journal: submit throughput with the journal on vs off\n\n"
        f"{CLIENTS} clients × {per} noop submits at once ({n:,} turns), 2 workers; median of {repeats} "
        "repeats, off/on interleaved. *acks/s*: until every `submit` is acknowledged (with the journal: "
        "after its row is committed); *turns/s*: until every result is in.\n\n"
        "| journal | acks/s | turns/s |\n| --- | ---: | ---: |\n"
        f"| off (`--no-journal`) | {med['off'][0]:,.0f} | {med['off'][1]:,.0f} |\n"
        f"| on (SQLite WAL, group commit) | {med['on'][0]:,.0f} | {med['on'][1]:,.0f} |\n\n"
        f"Ratio on ÷ off: acks **{med['on'][0] / med['off'][0]:.2f}×**, turns "
        f"**{med['on'][1] / med['off'][1]:.2f}×**.\n\n"
        "Rerun: `.venv/bin/python -m benchmarks --only journal`."
    )


def run(quick: bool) -> str:
    return anyio.run(_main, quick, backend="asyncio")


if __name__ == "__main__":
    import sys

    print(run("--quick" in sys.argv))
