"""Agents using MCP stdio servers through ``worker.mcp`` (``tests.agents.mcp_agents:NAME``)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import worker
from worker import mcp
from worker.agent import AgentLoop, Finish, FunctionCallOutput, Response, ScriptedModel, TextDelta, ToolCall

SERVER = mcp.StdioServer(sys.executable, ["-P", str(Path(__file__).with_name("mcp_server.py"))])
STUBBORN = mcp.StdioServer(SERVER.command, SERVER.args, env={"STUBBORN": "1"})
NEVER_EOF = mcp.StdioServer(SERVER.command, SERVER.args, env={"NEVER_EOF": "1"})


async def add(turn: worker.Turn) -> Any:
    async with mcp.serve(calc=SERVER) as servers:
        return await servers["calc"].call("add", {"a": 2, "b": 3})


async def waits(turn: worker.Turn) -> Any:
    """Calls ``slow`` (or ``stubborn``) after saying the server's pid."""
    inp = turn.input
    async with mcp.serve(calc=STUBBORN if inp["tool"] == "stubborn" else NEVER_EOF) as servers:
        await turn.emit({"type": "mcp_server", "pid": await servers["calc"].call("pid")})
        return await servers["calc"].call(inp["tool"], {"mark": inp["mark"]})


async def loop(turn: worker.Turn) -> Any:
    """``AgentLoop`` on a scripted model that calls the server's ``add`` tool, offered by ``mcp.tools``."""
    model = ScriptedModel(
        [
            Response([ToolCall("call_1", "add", {"a": 20, "b": 22}), Finish("tool_calls")]),
            Response([TextDelta("The sum is 42."), Finish("stop")]),
        ]
    )
    async with mcp.serve(calc=SERVER) as servers:
        result = await AgentLoop(model, tools=mcp.tools(servers), turn=turn).run("Add 20 and 22")
    return {"text": getattr(result, "text", None), "tools": [t.name for t in mcp.tools(servers)]}


async def isolated(turn: worker.Turn) -> Any:
    """``AgentLoop`` calls the server's ``allocate`` (a ``worker.isolated`` call in the server, killed for
    memory) and finishes; then ``add`` on the same server. Returns what the model was told."""
    model = ScriptedModel(
        [
            Response([ToolCall("call_1", "allocate", {}), Finish("tool_calls")]),
            Response([TextDelta("It did not fit."), Finish("stop")]),
        ]
    )
    async with mcp.serve(calc=SERVER) as servers:
        result = await AgentLoop(model, tools=mcp.tools(servers), turn=turn).run("Allocate")
        after = await servers["calc"].call("add", {"a": 1, "b": 2})
        await turn.emit({"type": "mcp_server", "pid": await servers["calc"].call("pid")})
    told = [m.output for m in model.requests[-1].messages if isinstance(m, FunctionCallOutput)]
    return {"text": getattr(result, "text", None), "told": told, "after": after}


# A worker-wide server (``mcp.shared``): one spec for the name in every agent of this module. It
# never sees stdin's EOF, so only ``notifications/cancelled`` can cancel a call in flight.
SHARED = NEVER_EOF


async def shared_pid(turn: worker.Turn) -> Any:
    """The worker-wide server's pid (started by the first turn that names it) and the worker's."""
    async with mcp.shared(calc=SHARED) as servers:
        return {"server": await servers["calc"].call("pid"), "worker": os.getpid()}


async def shared_waits(turn: worker.Turn) -> Any:
    """Calls the worker-wide server's ``slow`` after saying the server's pid."""
    async with mcp.shared(calc=SHARED) as servers:
        await turn.emit({"type": "mcp_server", "pid": await servers["calc"].call("pid")})
        return await servers["calc"].call("slow", {"mark": turn.input["mark"]})


async def shared_holds(turn: worker.Turn) -> Any:
    """Says the worker-wide server's pid, then swallows every cancellation: only the ladder ends it."""
    async with mcp.shared(calc=SHARED) as servers:
        await turn.emit({"type": "mcp_server", "pid": await servers["calc"].call("pid")})
        while True:
            try:
                await asyncio.sleep(3600)  # allowed: the agent's or tool's own work under test, not a wait
            except asyncio.CancelledError:
                continue
