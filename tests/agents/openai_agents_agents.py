"""OpenAI Agents SDK agents run by name through the pool (``tests.agents.openai_agents_agents:NAME``):
the SDK's own ``OpenAIChatCompletionsModel`` against the loopback Chat Completions server the test
started (its URL in ``TURNPOOL_TEST_OPENAI_URL``, read when the workers import this module)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, RunContextWrapper, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from tests.agents.daemon_tool import leave_daemon

set_tracing_disabled(True)  # no trace export over the network

_client = AsyncOpenAI(
    base_url=os.environ.get("TURNPOOL_TEST_OPENAI_URL", "http://127.0.0.1:9/v1"),
    api_key="test",
    max_retries=0,
)
_model = OpenAIChatCompletionsModel(model="test-model", openai_client=_client)


@function_tool
def lookup(ctx: RunContextWrapper[Any], key: str) -> dict[str, Any]:
    """Look a key up; the run's context (from the turn's input) comes back in the result."""
    return {"key": key, "value": 42, "context": ctx.context}


@function_tool
def block(ctx: RunContextWrapper[Any]) -> str:
    """A sync tool (run in a thread by the SDK) that starts a child, then blocks in C."""
    child = subprocess.Popen(["sleep", "3600"])
    with open(ctx.context["pidfile"], "w") as f:
        f.write(str(child.pid))
    time.sleep(3600)  # allowed: a tool blocked in C, the case under test
    return "unreachable"


@function_tool
def leave(pidfile: str) -> int:
    """A sync tool that leaves a setsid daemon behind and returns."""
    return leave_daemon(pidfile)


@function_tool
async def stubborn_tool(mark: str) -> str:
    """An async tool that writes "started" to ``mark``, then swallows every cancellation."""
    with open(mark, "w") as f:  # noqa: ASYNC230 - one small write
        f.write("started")
    while True:
        try:
            await asyncio.sleep(3600)  # allowed: the agent's or tool's own work under test, not a wait
        except asyncio.CancelledError:
            continue


assistant = Agent(
    name="assistant", instructions="Be brief.", model=_model, tools=[lookup, block, leave, stubborn_tool]
)
