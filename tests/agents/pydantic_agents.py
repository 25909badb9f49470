"""pydantic-ai agents run by name through the pool (``tests.agents.pydantic_agents:NAME``), on the
framework's own offline models: ``TestModel`` and ``FunctionModel``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import (
    AgentInfo,
    DeltaThinkingPart,
    DeltaToolCall,
    FunctionModel,
)
from pydantic_ai.models.test import TestModel

from tests.agents.daemon_tool import leave_daemon

# TestModel calls every tool once, then answers with their results as text.
weather = Agent(TestModel(), instructions="Answer about the weather.")


@weather.tool_plain
def forecast(city: str) -> str:
    return f"sunny in {city}"


class Verdict(BaseModel):
    city: str
    score: int


structured = Agent(TestModel(custom_output_args={"city": "Paris", "score": 7}), output_type=Verdict)


async def _think_then_answer(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
    if not any(isinstance(p, ToolReturnPart) for msg in messages for p in getattr(msg, "parts", ())):
        yield {0: DeltaThinkingPart(content="let me ")}
        yield {0: DeltaThinkingPart(content="check")}
        yield {1: DeltaToolCall(name="lookup", json_args='{"key": "answer"}', tool_call_id="call_1")}
        return
    for piece in ("The answer ", "is ", "42."):
        yield piece


thinker = Agent(FunctionModel(stream_function=_think_then_answer))


@thinker.tool_plain
def lookup(key: str) -> dict[str, Any]:
    return {"key": key, "value": 42}


async def _forever(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
    """Streams one word every 10 ms, never ending: only a cancel stops it."""
    n = 0
    while True:
        n += 1
        yield f"word{n} "
        await asyncio.sleep(0.01)  # allowed: the agent's or tool's own work under test, not a wait


forever = Agent(FunctionModel(stream_function=_forever))


@dataclass
class Files:
    pidfile: str


def files(pidfile: str) -> Files:
    """The deps factory named in the turn's input (``"deps": "tests.agents.pydantic_agents:files"``)."""
    return Files(pidfile)


async def _call_block(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
    yield {0: DeltaToolCall(name="block", json_args="{}", tool_call_id="call_block")}


blocker = Agent(FunctionModel(stream_function=_call_block), deps_type=Files)


@blocker.tool
def block(ctx: RunContext[Files]) -> str:
    """A sync tool (run in a thread) that starts a child process, then blocks in C: a cancel cannot
    reach it."""
    child = subprocess.Popen(["sleep", "3600"])
    with open(ctx.deps.pidfile, "w") as f:
        f.write(str(child.pid))
    time.sleep(3600)  # allowed: the agent's or tool's own work under test, not a wait
    return "unreachable"


async def _call_stubborn(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
    yield {0: DeltaToolCall(name="stubborn_tool", json_args="{}", tool_call_id="call_stubborn")}


stubborn = Agent(FunctionModel(stream_function=_call_stubborn))


@stubborn.tool_plain
async def stubborn_tool() -> str:
    """An async tool that swallows every cancellation: the run can never unwind."""
    while True:
        try:
            await asyncio.sleep(3600)  # allowed: the agent's or tool's own work under test, not a wait
        except asyncio.CancelledError:
            continue


not_an_agent = {"model": "gpt"}


async def _call_daemon(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
    """Calls ``daemon`` with the prompt as its pid file, then answers."""
    parts = [p for message in messages for p in getattr(message, "parts", ())]
    if any(isinstance(p, ToolReturnPart) for p in parts):
        yield "done"
        return
    prompt = next(str(p.content) for p in parts if isinstance(p, UserPromptPart))
    yield {0: DeltaToolCall(name="daemon", json_args=json.dumps({"pidfile": prompt}), tool_call_id="call_d")}


daemonizer = Agent(FunctionModel(stream_function=_call_daemon))


@daemonizer.tool_plain
def daemon(pidfile: str) -> int:
    """A sync tool that leaves a setsid daemon behind and returns."""
    return leave_daemon(pidfile)
