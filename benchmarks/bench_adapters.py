"""Framework objects as agents: what the adapter and the pool add to a framework's own run.

For pydantic-ai (``FunctionModel``) and LangGraph (``GenericFakeChatModel``), offline:

* events/s: a run streaming ~2 000 tokens, in process (the framework's own stream, consumed and
  dropped) against the same object named as a turn's agent (submit → every event followed →
  result); the per-event overhead is the difference per event;
* cancel → end: a run streaming forever, cancelled after its first token: in process (cancel the
  consuming task → it has unwound) against the pool (``handle.cancel()`` → ``TurnResult``).

The OpenAI Agents SDK needs a model server, so it is not in this table (its tests run it against
a loopback one). Run alone: ``.venv/bin/python -m benchmarks.bench_adapters [--quick]``.
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import aclosing
from typing import Any

import anyio
import psutil

from benchmarks import _framework_agents as fa
from supervisor import Supervisor

M = "benchmarks._framework_agents:"


async def _consume_pydantic(agent: Any, first: anyio.Event | None = None) -> int:
    n = 0
    async with agent.run_stream_events("go") as events:
        async for _ in events:
            n += 1
            if first is not None:
                first.set()
    return n


async def _consume_langgraph(graph: Any, first: anyio.Event | None = None) -> int:
    n = 0
    async for _ in graph.astream({"messages": [("user", "go")]}, stream_mode=["messages", "updates"]):
        n += 1
        if first is not None:
            first.set()
    return n


CONSUME = {"pydantic-ai": _consume_pydantic, "langgraph": _consume_langgraph}
OBJECTS = {
    "pydantic-ai": (fa.pydantic_words, fa.pydantic_forever, "pydantic_words", "pydantic_forever"),
    "langgraph": (fa.langgraph_words, fa.langgraph_forever, "langgraph_words", "langgraph_forever"),
}


def _cpu(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process, plus those of process ``pid``."""
    own = time.process_time()
    if pid is None:
        return own
    t = psutil.Process(pid).cpu_times()
    return own + t.user + t.system


async def _in_process_stream(name: str, reps: int) -> tuple[float, float, int]:
    words = OBJECTS[name][0]
    await CONSUME[name](words)  # warm: the first run fills the framework's caches
    times, cpus, count = [], [], 0
    for _ in range(reps):
        t0, c0 = time.perf_counter(), _cpu()
        count = await CONSUME[name](words)
        times.append(time.perf_counter() - t0)
        cpus.append(_cpu() - c0)
    return statistics.median(times), statistics.median(cpus), count


async def _in_process_cancel(name: str, reps: int) -> float:
    forever = OBJECTS[name][1]
    times = []
    for _ in range(reps):
        first = anyio.Event()
        t0 = 0.0
        async with anyio.create_task_group() as tg:
            tg.start_soon(CONSUME[name], forever, first)
            await first.wait()
            t0 = time.perf_counter()
            tg.cancel_scope.cancel()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def _pool(sup: Supervisor, name: str, reps: int) -> tuple[float, float, int, float]:
    _, _, words, forever = OBJECTS[name]
    warm = await sup.run(M + words, "warm")  # the worker imports the framework once
    pid = warm.worker_pid
    times, cpus, events = [], [], 0
    for _ in range(reps):
        t0, c0 = time.perf_counter(), _cpu(pid)
        handle = await sup.submit(M + words, "go")
        async with aclosing(handle.events()) as stream:
            events = sum([1 async for _ in stream])
        result = await handle.result()
        assert result.outcome == "completed" and result.worker_pid == pid, result
        times.append(time.perf_counter() - t0)
        cpus.append(_cpu(pid) - c0)
    cancels = []
    for _ in range(reps):
        handle = await sup.submit(M + forever, "go")
        async with aclosing(handle.events()) as stream:
            async for _ in stream:
                break
        t0 = time.perf_counter()
        await handle.cancel()
        result = await handle.result()
        cancels.append(time.perf_counter() - t0)
        assert result.outcome == "aborted", result
    return statistics.median(times), statistics.median(cpus), events, statistics.median(cancels)


async def _main(quick: bool) -> str:
    reps = 3 if quick else 9
    rows = []
    async with Supervisor(workers=1, spares=0, preload=("benchmarks._framework_agents",)) as sup:
        for name in CONSUME:
            local_s, local_cpu, local_events = await _in_process_stream(name, reps)
            local_cancel = await _in_process_cancel(name, reps)
            pool_s, pool_cpu, pool_events, pool_cancel = await _pool(sup, name, reps)
            overhead_us = (pool_cpu - local_cpu) / max(pool_events, 1) * 1e6
            rows.append(
                f"| {name} | {local_events / local_s:,.0f} ({local_events}) | "
                f"{pool_events / pool_s:,.0f} ({pool_events}) | "
                f"{local_cpu * 1e3:.0f} | {pool_cpu * 1e3:.0f} | "
                f"{overhead_us:.1f} | {local_cancel * 1e3:.2f} | {pool_cancel * 1e3:.2f} |"
            )
    return (
        "## Framework adapters\n\n"
        "Framework objects named as turns' agents, against the same object run in process (medians of "
        f"{reps}; `benchmarks/bench_adapters.py`). In process counts the framework's own stream events; "
        "the pool counts turnpool events (text tokens, tool calls, node updates), one worker. Wall-clock "
        "rates on a shared machine depend on CPU shares (the worker is a process of its own), so the "
        "overhead is counted in CPU time: the run's CPU in process, against the supervisor's plus the "
        "worker's for the same run through the pool.\n\n"
        "| framework | in process: events/s (events) | pool: events/s (events) | "
        "CPU per run in process (ms) | "
        "CPU per run through the pool (ms) | CPU added per event (µs) | "
        "cancel → unwound in process (ms) | cancel → result through the pool (ms) |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
    )


def run(quick: bool) -> str:
    return anyio.run(_main, quick, backend="asyncio")


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
