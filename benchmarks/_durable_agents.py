"""Agents of ``bench_durability`` (``benchmarks._durable_agents:NAME``): step records' cost and resume."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import worker
from worker.agent import (
    AgentLoop,
    Finish,
    FunctionCallOutput,
    ModelRequest,
    Response,
    ScriptedModel,
    TextDelta,
    ToolCall,
    tool,
)


async def record_steps(turn: worker.Turn) -> list[float]:
    """``input["steps"]`` steps recorded as an ``AgentLoop`` records a tool step (a model response,
    the call's ``started`` record waited for, its ``completed`` record waited for before the next
    model call), each record ≈ 200 bytes; the seconds each step's records cost."""
    log = turn._steps()
    times = []
    args = {"query": "x" * 100}
    for step in range(turn.input["steps"]):
        t0 = time.perf_counter()
        base = {"v": 1, "turn": turn.id, "loop": 0, "step": step}
        calls = [[f"c{step}", "lookup", args, None]]
        log.record(
            step, "model", {**base, "k": "model", "text": "ok", "calls": calls, "finish": "tool_calls"}
        )
        seq = log.record(
            step, "started", {**base, "k": "started", "call": f"c{step}", "name": "lookup", "index": 0}
        )
        await log.durable(seq)
        seq = log.record(step, "completed", {**base, "k": "completed", "call": f"c{step}", "output": args})
        await log.durable(seq)
        times.append(time.perf_counter() - t0)
    return times


class _Model:
    """Calls ``lookup`` ``steps`` times, then answers; notes when each call opens (the resume)."""

    supported_settings = None

    def __init__(self, steps: int, d: Path) -> None:
        self.steps, self.dir = steps, d
        self.t0 = time.perf_counter()  # the agent's start

    async def open(self, request: ModelRequest) -> Any:
        n = sum(isinstance(m, FunctionCallOutput) for m in request.messages) + 1
        if n == self.steps + 1:
            now = time.time()
            killed = self.dir / "killed_at"
            if not killed.exists():
                killed.write_text(repr(now))
                os.kill(os.getpid(), signal.SIGKILL)
            (self.dir / "resumed_at").write_text(repr(now))
            (self.dir / "replay_s").write_text(repr(time.perf_counter() - self.t0))
        if n <= self.steps:
            events: list[Any] = [ToolCall(f"c{n}", "lookup", {"query": "x" * 100}), Finish("tool_calls")]
        else:
            events = [TextDelta("done"), Finish("stop")]
        return await ScriptedModel([Response(events)]).open(request)


@tool
async def lookup(query: str) -> dict[str, Any]:
    return {"query": query, "found": True}


async def resume_after(turn: worker.Turn) -> dict[str, Any]:
    """A ``steps``-step turn that SIGKILLs its worker as its last model call opens, once; the
    second attempt notes when it reaches that call again (``resumed_at``) and how long the replay
    took in the worker (agent start → that model call)."""
    model = _Model(turn.input["steps"], Path(turn.input["dir"]))
    result = await AgentLoop(model, [lookup], turn=turn, max_steps=1000).run("go")
    return {"text": result.text, "attempt": turn.attempt}
