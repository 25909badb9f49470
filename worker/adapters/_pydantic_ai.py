"""A ``pydantic_ai.Agent`` as a turnpool agent: ``run_stream_events``, its events mapped onto
turnpool's vocabulary (docs/adapters.md), the run's output made encodable.

Input: a ``str`` prompt, or ``{"prompt": str, "deps": "pkg.mod:factory", "deps_args": {...}}``:
the factory (sync or async) is called with ``deps_args`` as keyword arguments and its value is
the run's ``deps``.

MCP: the agent's ``MCPToolset`` toolsets are entered for the turn by turnpool, in a task of their
own (``worker.mcp.held``): their servers are children of the worker, and a call a cancel abandons
still sends ``notifications/cancelled``; a stdio transport kept alive between connections is
disconnected at the turn's end (else the end-of-turn sweep would kill its server).

Cancel: the turn's Abort calls the run handle's own ``cancel()`` and cancels the turn's scope;
leaving the event stream cancels the run task. pydantic-ai then abandons a sync tool running in
its thread: ``TurnThreads`` (its thread executor for the turn) holds the turn until every such
thread has returned, so a tool that never returns ends the turn ``killed`` by the ladder after
the grace, never ``aborted`` while it still runs.
"""

from __future__ import annotations

import inspect
from typing import Any

import anyio
import pydantic_ai
from pydantic_ai import messages as m
from pydantic_core import to_jsonable_python

from .. import mcp
from .._turn import Turn
from . import AgentFn, TurnThreads, load_named, of_class, split_input, too_old, tool_update

FRAMEWORK = "a pydantic-ai Agent"
KEYS = ("deps", "deps_args")


def jsonable(value: Any) -> Any:
    """``value`` in its JSON form (pydantic models, dataclasses, datetimes); ``str`` of the rest."""
    return to_jsonable_python(value, fallback=str)


def adapt(spec: str, obj: Any, extra: str) -> AgentFn | None:
    base = getattr(getattr(pydantic_ai, "agent", None), "AbstractAgent", None)
    if base is None or not isinstance(obj, base):
        if base is None:
            raise too_old(spec, obj, extra, "pydantic_ai.agent.AbstractAgent")
        return None
    for owner, name in ((obj, "run_stream_events"), (pydantic_ai, "AgentRunResultEvent")):
        if not hasattr(owner, name):
            raise too_old(spec, obj, extra, name)
    if not hasattr(getattr(pydantic_ai, "Agent", None), "using_thread_executor"):
        raise too_old(spec, obj, extra, "Agent.using_thread_executor")

    async def run(turn: Turn) -> Any:
        prompt, extras = split_input(turn.input, FRAMEWORK, KEYS)
        deps = None
        if "deps" in extras:
            factory = load_named(extras["deps"], "the deps factory")
            kwargs = extras.get("deps_args") or {}
            if not isinstance(kwargs, dict):
                raise TypeError(f"'deps_args' is a dict of keyword arguments, got {type(kwargs).__name__}")
            deps = factory(**kwargs)
            if inspect.isawaitable(deps):
                deps = await deps
        elif "deps_args" in extras:
            raise ValueError("'deps_args' needs 'deps' (the factory that takes them)")
        servers = mcp_toolsets(obj)
        try:
            async with TurnThreads() as threads, mcp.held(servers):
                with pydantic_ai.Agent.using_thread_executor(threads):
                    async with obj.run_stream_events(prompt, deps=deps) as events:
                        turn.signal.add_callback(lambda cause: events.cancel())
                        async for event in events:
                            if isinstance(event, pydantic_ai.AgentRunResultEvent):
                                return jsonable(event.result.output)
                            mapped = map_event(event)
                            if mapped is not None:
                                await turn.emit(mapped)
                raise RuntimeError("the pydantic-ai run ended without a result")
        finally:
            await _disconnect_kept_alive(servers)

    return run


def mcp_toolsets(agent: Any) -> list[Any]:
    """The agent's ``MCPToolset`` leaves (ADAPT-MCP-FRAMEWORK): entered by turnpool for the turn."""
    found: list[Any] = []
    for toolset in getattr(agent, "toolsets", ()):
        toolset.apply(
            lambda leaf: found.append(leaf) if of_class(leaf, "pydantic_ai", "MCPToolset") else None
        )
    return list(dict.fromkeys(found))


async def _disconnect_kept_alive(servers: list[Any]) -> None:
    """A stdio transport kept alive between connections (fastmcp's default) keeps its server after
    the toolset's exit: disconnected, so nothing of the turn outlives it."""
    with anyio.CancelScope(shield=True):
        for toolset in servers:
            transport: Any = getattr(getattr(toolset, "client", None), "transport", None)
            if getattr(transport, "keep_alive", False) and hasattr(transport, "disconnect"):
                await transport.disconnect()


def map_event(event: Any) -> dict[str, Any] | None:
    """One pydantic-ai stream event as a turnpool event, or None (part ends: their text was streamed)."""
    if isinstance(event, m.PartStartEvent):
        part = event.part
        if isinstance(part, m.TextPart):
            return {"type": "delta", "text": part.content} if part.content else None
        if isinstance(part, m.ThinkingPart):
            return {"type": "thought", "text": part.content} if part.content else None
        return None  # a tool call's part: announced whole by its FunctionToolCallEvent
    if isinstance(event, m.PartDeltaEvent):
        delta = event.delta
        if isinstance(delta, m.TextPartDelta):
            return {"type": "delta", "text": delta.content_delta} if delta.content_delta else None
        if isinstance(delta, m.ThinkingPartDelta):
            return {"type": "thought", "text": delta.content_delta} if delta.content_delta else None
        return None
    if isinstance(event, m.PartEndEvent):
        return None
    if isinstance(event, m.FunctionToolCallEvent):
        part = event.part
        return {
            "type": "tool_call",
            "id": part.tool_call_id,
            "title": part.tool_name,
            "input": jsonable(part.args_as_dict()),
        }
    if isinstance(event, m.FunctionToolResultEvent):
        result = event.part
        status = "completed" if getattr(result, "outcome", "success") == "success" else "failed"
        return tool_update(result.tool_call_id, status, jsonable(result.content))
    if isinstance(event, m.OutputToolCallEvent):
        part = event.part
        data = {"id": part.tool_call_id, "title": part.tool_name, "input": jsonable(part.args_as_dict())}
        return {"type": "framework", "name": "output_tool_call", "data": data}
    if isinstance(event, m.OutputToolResultEvent):
        return None  # pydantic-ai's own acknowledgement of the output tool; the output is the result
    if isinstance(event, m.FinalResultEvent):
        return {
            "type": "framework",
            "name": "final_result",
            "data": {"tool_name": event.tool_name, "tool_call_id": event.tool_call_id},
        }
    return {"type": "framework", "name": type(event).__name__, "data": jsonable(event)}
