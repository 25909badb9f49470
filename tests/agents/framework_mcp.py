"""Framework agents whose MCP servers are the frameworks' own objects, which the user never starts
(``tests.agents.framework_mcp:NAME``): a pydantic-ai ``Agent`` with an ``MCPToolset`` over stdio
and an OpenAI Agents SDK ``Agent`` with an ``MCPServerStdio``, both on the real MCP server of
``mcp_server.py``. turnpool's adapters start them for the turn.

The model asks by the prompt: ``"mcp"`` calls ``parent``, then ``add`` (2 + 3), then answers
``"The sum is 5."``; ``"slow MARK"`` calls ``parent``, then ``slow`` (which only a cancel ends).
The server never sees stdin's EOF (``NEVER_EOF``): only ``notifications/cancelled`` cancels a
call in flight."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent as OpenAIAgent
from agents.mcp import MCPServerStdio
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset, StdioTransport
from pydantic_ai.messages import ModelMessage, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from tests.agents.openai_agents_agents import _model

SERVER = str(Path(__file__).with_name("mcp_server.py"))
ENV = {"NEVER_EOF": "1"}


def next_call(prompt: str, answered: int) -> tuple[str, dict[str, Any]] | str:
    """The next tool call (name, arguments) for the prompt after ``answered`` tool results, or the
    answer's text."""
    if answered == 0:
        return "parent", {}
    if prompt.startswith("slow "):
        return "slow", {"mark": prompt.removeprefix("slow ")}
    if answered == 1:
        return "add", {"a": 2, "b": 3}
    return "The sum is 5."


async def _stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
    parts = [p for message in messages for p in getattr(message, "parts", ())]
    prompt = next(str(p.content) for p in parts if isinstance(p, UserPromptPart))
    step = next_call(prompt, sum(isinstance(p, ToolReturnPart) for p in parts))
    if isinstance(step, str):
        yield step
        return
    name, args = step
    yield {0: DeltaToolCall(name=name, json_args=json.dumps(args), tool_call_id=f"call_{name}")}


def _pydantic(env: dict[str, str]) -> Agent[None, str]:
    transport = StdioTransport(sys.executable, ["-P", SERVER], env=env)
    # The server's start imports ``mcp`` (≈ 2 CPU-s, 4 s at load 400 here): MCPToolset's default 5 s for
    # the start and handshake failed the turn under load ("Failed to initialize server session").
    toolset = MCPToolset(transport, init_timeout=120, read_timeout=120)
    return Agent(FunctionModel(stream_function=_stream), toolsets=[toolset])


def _openai(env: dict[str, str]) -> OpenAIAgent[Any]:
    server = MCPServerStdio(
        {"command": sys.executable, "args": ["-P", SERVER], "env": env},
        name="calc",
        client_session_timeout_seconds=120,
    )
    return OpenAIAgent(name="assistant", instructions="Use the tools.", model=_model, mcp_servers=[server])


# For the "slow" turns, whose cancel only notifications/cancelled may reach: the server never sees EOF.
pydantic_agent = _pydantic(ENV)
openai_agent = _openai(ENV)
# For the "mcp" turns, which complete: the server ends at its stdin's EOF when the framework closes it,
# rather than waiting out the framework's 2 s before its SIGTERM.
pydantic_agent_eof = _pydantic({})
openai_agent_eof = _openai({})
