"""``make demo``: an embedded supervisor with real worker processes shows every outcome.

Runs a handful of turns — one that completes, one that fails, a cooperative one cancelled
(aborted), a stubborn one that ignores the abort and is killed after its grace, one whose
worker crashes — then shows that the pool kept serving.
"""

from __future__ import annotations

import time
from contextlib import aclosing

import anyio
from rich.console import Console
from rich.table import Table

from supervisor import Supervisor, TurnHandle, TurnResult

console = Console()


async def _wait_started(handle: TurnHandle) -> None:
    async with aclosing(handle.events()) as events:
        async for _ in events:
            return


async def main() -> None:
    rows: list[tuple[str, str, TurnResult, float]] = []
    t0 = time.monotonic()
    async with Supervisor(workers=2, spares=1, grace=1.0, kill_after=1.0) as sup:
        first = await sup.status()
        console.print(
            f"[bold]turnpool demo[/] — supervisor pid {first['pid']}, "
            f"workers {[w['pid'] for w in first['workers']]}"
        )

        async def timed(label: str, what: str, coro) -> None:  # type: ignore[no-untyped-def]
            start = time.monotonic()
            result = await coro
            rows.append((label, what, result, time.monotonic() - start))

        await timed("echo", "returns its input", sup.run("examples.agents:echo", {"text": "hi"}))
        await timed("failing", "raises ValueError", sup.run("examples.agents:failing"))

        slow = await sup.submit("examples.agents:slow", {"seconds": 30})
        await _wait_started(slow)
        start = time.monotonic()
        await slow.cancel()
        rows.append(("slow", "cooperative, cancelled", await slow.result(), time.monotonic() - start))

        stubborn = await sup.submit("examples.agents:stubborn")
        await _wait_started(stubborn)
        start = time.monotonic()
        await stubborn.cancel()
        rows.append(
            (
                "stubborn",
                "never awaits, cancelled (grace 1 s)",
                await stubborn.result(),
                time.monotonic() - start,
            )
        )

        await timed("crasher", "worker calls os._exit(3)", sup.run("examples.agents:crasher"))
        await timed("crasher", "worker segfaults", sup.run("examples.agents:crasher", {"how": "segv"}))
        await timed(
            "timeout",
            "slow with timeout=0.3 s",
            sup.run("examples.agents:slow", {"seconds": 30}, timeout=0.3),
        )
        await timed("echo", "the pool kept serving", sup.run("examples.agents:echo", {"text": "still here"}))

        table = Table(title="one outcome per turn")
        for col in ("agent", "what happened", "outcome", "cause", "worker pid", "exit", "took"):
            table.add_column(col)
        colours = {
            "completed": "green",
            "failed": "red",
            "aborted": "yellow",
            "killed": "magenta",
            "crashed": "bright_red",
        }
        for label, what, r, took in rows:
            table.add_row(
                label,
                what,
                f"[{colours[r.outcome]}]{r.outcome}[/]",
                r.cause.kind if r.cause else "",
                str(r.worker_pid or ""),
                "" if r.exit_code is None else str(r.exit_code),
                f"{took * 1000:.0f} ms",
            )
        console.print(table)
        status = await sup.status()
        console.print(
            f"workers now: {[(w['id'], w['pid'], w['state']) for w in status['workers']]}; "
            f"restarts: {status['worker_restarts']}"
        )
    console.print(f"disposed: every worker reaped. total {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    anyio.run(main)
