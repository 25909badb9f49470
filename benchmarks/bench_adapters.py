"""Framework objects as agents: what the adapter and the pool add to a framework's own run.

For pydantic-ai (``FunctionModel``) and LangGraph (``GenericFakeChatModel``), offline; the OpenAI
Agents SDK (``OpenAIChatCompletionsModel`` against a loopback streaming Chat Completions server in
a process of its own, for both sides); the Claude Agent SDK (a ``ClaudeSDKClient`` session with the stand-in
CLI of the tests, which speaks the SDK's stream-json protocol; a session spawns its CLI, on both
sides):

* events/s: a run streaming ~2 000 tokens, in process (the framework's own stream, consumed and
  dropped) against the same object named as a turn's agent (submit → every event followed →
  result); the per-event overhead is the difference per event;
* cancel → end: a run streaming forever, cancelled after its first token: in process with the
  framework's own cancel (pydantic-ai, LangGraph: cancel the consuming task → it has unwound; the
  OpenAI Agents SDK: ``RunResultStreaming.cancel(mode="immediate")`` → its stream has ended and its
  run task is done; Claude: ``interrupt()`` → the session's ``ResultMessage``) against the pool
  (``handle.cancel()`` → ``TurnResult``).

Run alone: ``.venv/bin/python -m benchmarks.bench_adapters [--quick]``.
"""

from __future__ import annotations

import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
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


async def _consume_openai(agent: Any, first: anyio.Event | None = None) -> int:
    import agents

    n = 0
    result = agents.Runner.run_streamed(agent, "forever" if first is not None else "words")
    async for _ in result.stream_events():
        n += 1
        if first is not None:
            first.set()
    return n


async def _consume_claude(options: Any, first: anyio.Event | None = None) -> int:
    import claude_agent_sdk as sdk

    n = 0
    async with sdk.ClaudeSDKClient(options=options) as client:
        await client.query(f"words {fa.WORDS}")
        async for _ in client.receive_response():
            n += 1
    return n


async def _cancel_task(name: str) -> float:
    """pydantic-ai, LangGraph: cancel the task consuming the run → it has unwound."""
    forever = OBJECTS[name][1]
    first = anyio.Event()
    t0 = 0.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(CONSUME[name], forever, first)
        await first.wait()
        t0 = time.perf_counter()
        tg.cancel_scope.cancel()
    return time.perf_counter() - t0


async def _cancel_openai(name: str) -> float:
    """The SDK's own cancel: ``cancel(mode="immediate")`` → the stream has ended, the run task done."""
    import asyncio

    import agents

    result = agents.Runner.run_streamed(OBJECTS[name][1], "forever")
    events = result.stream_events()
    async for event in events:
        if getattr(event, "type", "") == "raw_response_event":
            break
    t0 = time.perf_counter()
    result.cancel(mode="immediate")
    async for _ in events:
        pass
    if result.run_loop_task is not None:
        await asyncio.wait([result.run_loop_task])
    return time.perf_counter() - t0


async def _cancel_claude(name: str) -> float:
    """The SDK's own cancel: ``interrupt()`` → the session's ``ResultMessage`` (its CLI acknowledged)."""
    import claude_agent_sdk as sdk

    async with sdk.ClaudeSDKClient(options=OBJECTS[name][1]) as client:
        await client.query("forever")
        messages = client.receive_response()
        async for message in messages:
            if isinstance(message, sdk.StreamEvent):
                break
        t0 = time.perf_counter()
        await client.interrupt()
        async for message in messages:
            if isinstance(message, sdk.ResultMessage):
                break
        took = time.perf_counter() - t0
    return took


CONSUME = {
    "pydantic-ai": _consume_pydantic,
    "langgraph": _consume_langgraph,
    "openai-agents": _consume_openai,
    "claude": _consume_claude,
}
CANCEL = {
    "pydantic-ai": _cancel_task,
    "langgraph": _cancel_task,
    "openai-agents": _cancel_openai,
    "claude": _cancel_claude,
}
# framework: (in-process object streaming WORDS, one streaming forever, their names for the pool,
# the pool's inputs for each)
OBJECTS: dict[str, tuple[Any, Any, str, str, str, str]] = {
    "pydantic-ai": (fa.pydantic_words, fa.pydantic_forever, "pydantic_words", "pydantic_forever", "go", "go"),
    "langgraph": (
        fa.langgraph_words,
        fa.langgraph_forever,
        "langgraph_words",
        "langgraph_forever",
        "go",
        "go",
    ),
    "openai-agents": (None, None, "openai_words", "openai_words", "words", "forever"),
    "claude": (
        fa.claude_session,
        fa.claude_session,
        "claude_session",
        "claude_session",
        f"words {fa.WORDS}",
        "forever",
    ),
}


@asynccontextmanager
async def _model_server() -> AsyncIterator[str]:
    """The OpenAI Agents SDK's model: a loopback Chat Completions server in a process of its own
    (``benchmarks._model_server``); yields its base URL."""
    argv = [sys.executable, "-m", "benchmarks._model_server"]
    async with await anyio.open_process(argv, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        line = b""
        async for data in proc.stdout:
            line += data
            if b"\n" in line:
                break
        try:
            yield line.decode().strip()
        finally:
            await proc.stdin.aclose()  # the server ends
            await proc.wait()


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
    await CANCEL[name](name)  # warm
    return statistics.median([await CANCEL[name](name) for _ in range(reps)])


async def _pool(sup: Supervisor, name: str, reps: int) -> tuple[float, float, int, float]:
    _, _, words, forever, words_input, forever_input = OBJECTS[name]
    warm = await sup.run(M + words, words_input)  # the worker imports the framework once
    pid = warm.worker_pid
    times, cpus, events = [], [], 0
    for _ in range(reps):
        t0, c0 = time.perf_counter(), _cpu(pid)
        handle = await sup.submit(M + words, words_input)
        async with aclosing(handle.events()) as stream:
            events = sum([1 async for _ in stream])
        result = await handle.result()
        assert result.outcome == "completed" and result.worker_pid == pid, result
        times.append(time.perf_counter() - t0)
        cpus.append(_cpu(pid) - c0)
    cancels = []
    for _ in range(reps):
        handle = await sup.submit(M + forever, forever_input)
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
    async with _model_server() as url:
        os.environ["BENCH_OPENAI_URL"] = url  # read by the pool's workers as they import the agents
        openai = fa.openai_agent(url)
        OBJECTS["openai-agents"] = (openai, openai, *OBJECTS["openai-agents"][2:])
        rows = await _rows(reps)
    gc.collect()  # the Claude sessions' subprocess transports, closed while the loop still runs
    load = os.getloadavg()[0]
    return (
        "## Framework adapters\n\n"
        "Framework objects named as turns' agents, against the same object run in process (medians of "
        f"{reps}; `python -m benchmarks.bench_adapters`; load average {load:.1f} on {os.cpu_count()} "
        "cores when it ended). In process counts the framework's own stream events; "
        "the pool counts turnpool events (text tokens, tool calls, node updates), one worker. Wall-clock "
        "rates on a shared machine depend on CPU shares (the worker is a process of its own), so the "
        "overhead is counted in CPU time: the run's CPU in process, against the supervisor's plus the "
        "worker's for the same run through the pool. The OpenAI Agents SDK's model server runs in a "
        "process of its own (its CPU is on neither side); a Claude session spawns its stand-in CLI on both "
        "sides (the CLI's own CPU is on neither).\n\n"
        "| framework | in process: events/s (events) | pool: events/s (events) | "
        "CPU per run in process (ms) | "
        "CPU per run through the pool (ms) | CPU added per event (µs) | "
        "cancel → end in process (ms) | cancel → result through the pool (ms) |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
    )


async def _rows(reps: int) -> list[str]:
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
    return rows


def run(quick: bool) -> str:
    return anyio.run(_main, quick, backend="asyncio")


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
