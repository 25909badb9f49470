"""Claude Agent SDK options that run the real ``claude`` CLI (the one the SDK's wheel bundles),
pointed at the loopback Messages-API stand-in the test started (``tests.support.anthropic_server``:
its URL in ``TURNPOOL_TEST_ANTHROPIC_URL``, the CLI's home in ``TURNPOOL_TEST_CLAUDE_HOME``, both
read when the workers import this module). ``isolated`` adds an in-process SDK tool whose work is a
``worker.isolated`` call."""

import dataclasses
import os
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, create_sdk_mcp_server, tool

import worker
from tests.agents.tools import hog

_home = os.environ.get("TURNPOOL_TEST_CLAUDE_HOME", "/nonexistent")

assistant = ClaudeAgentOptions(
    include_partial_messages=True,
    cwd=_home,
    env={
        "ANTHROPIC_BASE_URL": os.environ.get("TURNPOOL_TEST_ANTHROPIC_URL", "http://127.0.0.1:9"),
        "ANTHROPIC_API_KEY": "test",
        "HOME": _home,  # the CLI's settings and sessions, in the test's directory
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no telemetry, no update checks: loopback only
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    },
)


# An in-process SDK tool (it runs in the worker, called by the CLI over the SDK's control protocol)
# whose work is a ``worker.isolated`` call that writes 2 GiB under 256 MiB: killed alone, told to the
# model as the tool's error.
_hog = worker.isolated(hog, memory_mb=256)


@tool("allocate", "Allocate a lot of memory.", {})
async def _allocate(args: dict[str, Any]) -> dict[str, Any]:
    size = await _hog.acall()
    return {"content": [{"type": "text", "text": str(size)}]}


isolated = dataclasses.replace(
    assistant,
    mcp_servers={"tools": create_sdk_mcp_server(name="tools", tools=[_allocate])},
    allowed_tools=["mcp__tools__allocate"],
)
