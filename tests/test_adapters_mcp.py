"""The frameworks' own MCP server objects, which the user never starts: a pydantic-ai
``MCPToolset`` over stdio and an OpenAI Agents SDK ``MCPServerStdio``, each on the real MCP server
of ``tests/agents/mcp_server.py`` (the ``mcp`` package's ``MCPServer``). turnpool's adapter starts
them for the turn as children of the worker (the server's parent is the worker), their tools work,
and they are gone at the turn's end; a cancel while a call is in flight reaches the server as
``notifications/cancelled`` (it never sees stdin's EOF: nothing else cancels the call) and ends
``aborted`` (cause ``user``) with the server gone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import Supervisor
from tests.support.adapterkit import events_of, wait_for_event, wait_for_file
from tests.support.agents_server import agents_server

pytestmark = pytest.mark.anyio

pytest.importorskip("mcp", reason="the mcp extra is not installed")
pytest.importorskip("fastmcp", reason="pydantic-ai's MCP client (the pydantic-ai extra) is not installed")

A = "tests.agents.framework_mcp:"
URL_VAR = "TURNPOOL_TEST_OPENAI_URL"


@asynccontextmanager
async def model_server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """The OpenAI Agents SDK's model: the loopback Chat Completions server (its URL in the workers'
    environment)."""
    server = agents_server()
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        monkeypatch.setenv(URL_VAR, server.base_url)
        yield
        tg.cancel_scope.cancel()


def number(output: Any) -> int:
    """A tool's number as the framework reports it: pydantic-ai the value, the OpenAI Agents SDK
    the MCP text content (``{"type": "text", "text": "5"}``)."""
    return int(output["text"]) if isinstance(output, dict) else int(output)


def output_of(events: list[dict[str, Any]], call: str) -> int:
    return number(next(e["output"] for e in events if e["type"] == "tool_call_update" and e["id"] == call))


async def _turns_of(sup: Supervisor, agent: str, mark: Path) -> dict[str, Any]:
    """The agent's ``mcp`` turn (its server ends at stdin's EOF), then its ``slow`` turn (its server
    never sees EOF) cancelled while the call is in flight."""
    done = await sup.submit(A + agent + "_eof", "mcp")
    with anyio.fail_after(60):
        result = await done.result()
    seen = await events_of(done)
    slow = await sup.submit(A + agent, f"slow {mark}")
    parent = await wait_for_event(slow, "tool_call_update")
    assert await anyio.to_thread.run_sync(wait_for_file, mark) == "started", agent  # the call is in flight
    cancelled = await slow.cancel()
    with anyio.fail_after(60):
        aborted = await slow.result()
    # The server's pid, from its own tool: the same server served both calls of the turn.
    pids = [e for e in await events_of(slow) if e["type"] == "tool_call"]
    return {
        "result": result,
        "seen": seen,
        "parent": parent,
        "cancelled": cancelled,
        "aborted": aborted,
        "pids": pids,
    }


async def test_framework_mcp_servers_are_started_for_the_turn_inside_its_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each framework's own MCP server object (pydantic-ai, the OpenAI Agents SDK), one after the other
    on one worker (its module imports both frameworks: once, not once per framework)."""
    async with model_server(monkeypatch), Supervisor(workers=1, spares=0, grace=20) as sup:
        turns = {
            agent: await _turns_of(sup, agent, tmp_path / agent)
            for agent in ("pydantic_agent", "openai_agent")
        }
    for agent, t in turns.items():
        result, seen, aborted = t["result"], t["seen"], t["aborted"]
        assert result.outcome == "completed" and result.output == "The sum is 5.", (agent, result)
        assert output_of(seen, "call_parent") == result.worker_pid, agent  # the server is the worker's child
        assert output_of(seen, "call_add") == 5, agent
        assert t["cancelled"] == {"kind": "user"}, agent
        assert [p["title"] for p in t["pids"]] == ["parent", "slow"], agent
        assert number(t["parent"]["output"]) == aborted.worker_pid, agent
        assert aborted.outcome == "aborted" and aborted.cause == {"kind": "user"}, (agent, aborted)
        assert (tmp_path / agent).read_text() == "cancelled", (
            agent
        )  # notifications/cancelled reached the server
        assert aborted.worker_pid == result.worker_pid, agent  # no kill was needed
