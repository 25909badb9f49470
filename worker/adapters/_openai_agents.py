"""An OpenAI Agents SDK ``agents.Agent`` as a turnpool agent: ``Runner.run_streamed``, its stream
events mapped onto turnpool's vocabulary (docs/adapters.md), ``final_output`` made encodable.

Input: a ``str`` prompt, or ``{"prompt": str, "context": value, "max_turns": int}``: ``context`` (any
JSON value) is the run's context object, which tools see as ``ctx.context``.

MCP: the agent's ``mcp_servers`` (and those of the agents it hands off to) that are not connected
are connected for the turn by turnpool, in a task of their own (``worker.mcp.held``), and cleaned
up after it: the user starts nothing, the servers are children of the worker, and a call a cancel
abandons still sends ``notifications/cancelled``.

Cancel: the turn's Abort calls the run's own ``cancel(mode="immediate")`` and cancels the turn's
scope; on the way out the run's task is waited for (shielded). The SDK runs sync function tools
with ``asyncio.to_thread``, in the loop's default executor, which is the turn's ``TurnThreads``:
the turn ends only once they have returned.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import agents
import anyio
from pydantic_core import to_jsonable_python

from .. import mcp
from .._errors import TurnCancelled
from .._toolerrors import ToolIsolationError
from .._turn import Turn
from . import AgentFn, TurnThreads, split_input, too_old, tool_update

FRAMEWORK = "an OpenAI Agents SDK Agent"
KEYS = ("context", "max_turns")


def jsonable(value: Any) -> Any:
    return to_jsonable_python(value, fallback=str)


def adapt(spec: str, obj: Any, extra: str) -> AgentFn | None:
    if not isinstance(obj, agents.Agent):
        return None
    if not hasattr(getattr(agents, "Runner", None), "run_streamed"):
        raise too_old(spec, obj, extra, "Runner.run_streamed")

    async def run(turn: Turn) -> Any:
        prompt, extras = split_input(turn.input, FRAMEWORK, KEYS)
        kwargs: dict[str, Any] = {"context": extras.get("context")}
        if "max_turns" in extras:
            max_turns = extras["max_turns"]
            if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
                raise ValueError(f"'max_turns' is a positive int, got {max_turns!r}")
            kwargs["max_turns"] = max_turns
        stopped: dict[str, ToolIsolationError] = {}
        config = run_config(stopped)
        if config is not None:
            kwargs["run_config"] = config
        async with TurnThreads(), mcp.held(unconnected_servers(obj)):
            result = agents.Runner.run_streamed(obj, prompt, **kwargs)
            turn.signal.add_callback(lambda cause: result.cancel(mode="immediate"))
            try:
                async for event in result.stream_events():
                    mapped = map_event(event, stopped)
                    if mapped is not None:
                        await turn.emit(mapped)
            finally:
                if not result.is_complete:
                    result.cancel(mode="immediate")
                task = result.run_loop_task
                if task is not None and not task.done():
                    with anyio.CancelScope(shield=True):
                        await asyncio.wait([task])
            if turn.signal.cancelled:
                # A cancelled run's stream ends quietly: the turn honoured the cancel.
                raise TurnCancelled(turn.signal.cause)
            return jsonable(result.final_output)

    return run


def run_config(stopped: dict[str, ToolIsolationError]) -> Any:
    """The run's ``RunConfig`` (None: this SDK has no ``tool_error_formatter``). TOOL-TOLD-FOLLOWERS: a
    tool with the SDK's default failure function hands over a fixed text, not the error; the SDK's
    formatter hook is told which call raised what, and the isolation errors are kept by call id
    (the model's text stays the SDK's)."""
    fields = getattr(agents.RunConfig, "__dataclass_fields__", {})
    if "tool_error_formatter" not in fields:
        return None

    def formatter(args: Any) -> None:
        error = getattr(args, "error", None)
        if isinstance(error, ToolIsolationError) and getattr(args, "call_id", None):
            stopped[str(args.call_id)] = error

    return agents.RunConfig(tool_error_formatter=formatter)


def unconnected_servers(agent: Any) -> list[Any]:
    """The MCP servers of ``agent`` and of the agents it hands off to that are not connected
    (ADAPT-MCP-FRAMEWORK): turnpool connects them for the turn."""
    servers: list[Any] = []
    seen: set[int] = set()
    stack = [agent]
    while stack:
        current = stack.pop()
        if id(current) in seen or not isinstance(current, agents.Agent):
            continue
        seen.add(id(current))
        for server in getattr(current, "mcp_servers", None) or ():
            if getattr(server, "session", True) is None and server not in servers:
                servers.append(server)
        stack.extend(getattr(current, "handoffs", None) or ())
    return servers


def _arguments(raw: Any) -> Any:
    text = getattr(raw, "arguments", None)
    if not isinstance(text, str):
        return jsonable(text)
    try:
        return json.loads(text)
    except ValueError:
        return text


def map_event(event: Any, stopped: dict[str, ToolIsolationError] | None = None) -> dict[str, Any] | None:
    """One SDK stream event as a turnpool event, or None (whole messages: their text was streamed);
    ``stopped``: the isolation errors of the run's calls, by call id (see ``run_config``)."""
    kind = getattr(event, "type", None)
    if kind == "raw_response_event":
        data = event.data
        data_type = getattr(data, "type", "")
        if data_type == "response.output_text.delta":
            return {"type": "delta", "text": data.delta} if data.delta else None
        if data_type in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            return {"type": "thought", "text": data.delta} if data.delta else None
        return None
    if kind == "agent_updated_stream_event":
        return {"type": "framework", "name": "agent_updated", "data": {"agent": event.new_agent.name}}
    if kind != "run_item_stream_event":
        return {"type": "framework", "name": str(kind), "data": jsonable(event)}
    item = event.item
    raw = getattr(item, "raw_item", None)
    if event.name == "tool_called":
        call_id = getattr(raw, "call_id", None) or getattr(raw, "id", None)
        title = getattr(raw, "name", None) or getattr(raw, "type", "tool")
        return {"type": "tool_call", "id": call_id, "title": title, "input": _arguments(raw)}
    if event.name == "tool_output":
        call_id = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
        error = stopped.pop(str(call_id), None) if stopped else None
        return tool_update(call_id, "completed", jsonable(item.output), error)
    if event.name in ("message_output_created", "reasoning_item_created"):
        return None
    return {"type": "framework", "name": event.name, "data": jsonable(raw)}
