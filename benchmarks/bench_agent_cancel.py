"""How fast an ``AgentLoop`` turn stops when cancelled, at each detection point.

* in process: ``loop.cancel()`` → ``run()`` raises ``Cancelled`` (ScriptedModel, fake tools);
* through the pool: ``handle.cancel()`` → ``TurnResult(aborted)`` for
  ``examples.loop_agent:research``, beside ``examples.agents:slow`` (a plain cooperative agent
  stopped by the worker's cancel scope) measured in the same run as the reference.

Run alone: ``.venv/bin/python -m benchmarks.bench_agent_cancel [--quick]``.
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import aclosing
from typing import Any

import anyio

from worker.agent import (
    AgentLoop,
    Cancelled,
    Delayed,
    Finish,
    Response,
    ScriptedModel,
    TextDelta,
    ToolCall,
    tool,
)

FOREVER = 3600.0

POOL_CASES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("loop: stream opening", "examples.loop_agent:research", {"open_delay": FOREVER}, {"type": "opening"}),
    ("loop: mid-stream", "examples.loop_agent:research", {"event_delay": FOREVER}, {"type": "delta"}),
    ("loop: tools running", "examples.loop_agent:research", {"tool_seconds": FOREVER}, {"name": "fetch"}),
    ("reference: agents:slow", "examples.agents:slow", {"seconds": FOREVER}, {"type": "started"}),
]


def _stats(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    p99 = s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]
    return statistics.median(s), p99


async def _in_process(point: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = anyio.Event()

        @tool
        async def slow() -> None:
            started.set()  # noqa: B023 - used within this iteration only
            await anyio.sleep(FOREVER)

        if point == "opening":
            model = ScriptedModel([Response([Finish()], open_delay=FOREVER)])
        elif point == "mid-stream":
            model = ScriptedModel([Response([TextDelta("a"), Delayed(TextDelta("b"), FOREVER)])])
        else:
            model = ScriptedModel([Response([ToolCall("c1", "slow", {}), ToolCall("c2", "slow", {})])])
        loop = AgentLoop(model, tools=[slow])
        t0 = 0.0
        async with anyio.create_task_group() as tg:

            async def cancel() -> None:
                nonlocal t0
                # B023: the task group ends within this iteration, so the loop variables are this one's.
                if point == "opening":
                    await model.reached("open")  # noqa: B023
                elif point == "mid-stream":
                    await model.reached("event")  # noqa: B023
                else:
                    await started.wait()  # noqa: B023
                t0 = time.perf_counter()
                loop.cancel()  # noqa: B023

            tg.start_soon(cancel)
            try:
                await loop.run("x")
            except Cancelled:
                out.append(time.perf_counter() - t0)
    return out


async def _pool(agent: str, inp: dict[str, Any], marker: dict[str, Any], n: int) -> list[float]:
    from supervisor import Supervisor

    out = []
    async with Supervisor(workers=1, spares=0, grace=20) as sup:
        for _ in range(n):
            handle = await sup.submit(agent, inp)
            async with aclosing(handle.events()) as events:
                async for event in events:
                    if all(event.get(k) == v for k, v in marker.items()):
                        break
            t0 = time.perf_counter()
            await handle.cancel()
            result = await handle.result()
            out.append(time.perf_counter() - t0)
            assert result.outcome == "aborted", result
    return out


async def _main(quick: bool) -> str:
    n_local, n_pool = (200, 20) if quick else (2000, 100)
    rows = []
    for point in ("opening", "mid-stream", "tools"):
        med, p99 = _stats(await _in_process(point, n_local))
        rows.append(f"| in process: {point} | {n_local} | {med * 1e6:.0f} µs | {p99 * 1e6:.0f} µs |")
    for label, agent, inp, marker in POOL_CASES:
        med, p99 = _stats(await _pool(agent, inp, marker, n_pool))
        rows.append(f"| pool: {label} | {n_pool} | {med * 1e3:.2f} ms | {p99 * 1e3:.2f} ms |")
    return (
        "## Agent loop: cancel → stopped\n\n"
        "In process: `loop.cancel()` until `run()` raised `Cancelled`. Pool: `handle.cancel()` until the\n"
        "`aborted` result arrived (Abort over ZeroMQ, the loop stops at its detection point, on_abort\n"
        "hook emits, `End`). `agents:slow` is the foundation's cooperative agent, for reference.\n\n"
        "| case | n | median | p99 |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n\n"
        "Rerun: `.venv/bin/python -m benchmarks.bench_agent_cancel" + (" --quick" if quick else "") + "`"
    )


def run(quick: bool) -> str:
    return anyio.run(_main, quick, backend="asyncio")


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
