"""A compiled LangGraph graph as a turnpool agent: ``astream`` with the ``messages``, ``updates`` and
``custom`` stream modes (and ``values``, for the final state), mapped onto turnpool's events
(docs/adapters.md); the output is the final state, messages as dicts.

Input: a ``str`` is the user's message (``{"messages": [{"role": "user", "content": str}]}``);
``{"prompt": str, "config": {...}}`` the same with the run's config (``thread_id`` under
``configurable``); ``{"input": value, "config": {...}}`` any graph input with a config; an
editor's prompt through ``turnpool acp`` is the user's message (its session the thread, for a
checkpointed graph); anything else is the graph's input value as it is.

Cancel: the turn's Abort cancels the turn's scope; ``astream`` runs in a task of its own, which is
then cancelled once, so LangGraph cancels its node tasks and waits for them (an async node that
swallows the cancel holds the turn until the ladder kills the worker). Sync nodes and tools run
in the loop's default executor, which is the turn's ``TurnThreads``: the turn ends only once
they have returned.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

import anyio
from langgraph.pregel import Pregel
from pydantic_core import to_jsonable_python

from .._turn import Turn
from . import AgentFn, TurnThreads, acp_prompt, too_old, tool_update

FRAMEWORK = "a LangGraph graph"
MODES = ["messages", "updates", "custom", "values"]


def jsonable(value: Any) -> Any:
    """``value`` in its JSON form: messages (pydantic models) as dicts; ``str`` of the rest."""
    return to_jsonable_python(value, fallback=str)


def graph_input(value: Any, checkpointed: bool = False) -> tuple[Any, dict[str, Any] | None]:
    """The turn's input as (graph input, config). An editor's prompt through ``turnpool acp`` is the
    user's message; for a graph with a checkpointer its ACP session is the thread."""
    if isinstance(value, str):
        return {"messages": [{"role": "user", "content": value}]}, None
    acp = acp_prompt(value)
    if acp is not None:
        text, session = acp
        config = {"configurable": {"thread_id": session}} if checkpointed else None
        return {"messages": [{"role": "user", "content": text}]}, config
    if isinstance(value, dict) and ("prompt" in value or "input" in value):
        unknown = sorted(str(k) for k in value if k not in ("prompt", "input", "config"))
        if unknown or ("prompt" in value and "input" in value):
            raise ValueError(
                f"unknown input key(s) {', '.join(map(repr, unknown)) or repr('input')} for {FRAMEWORK}: "
                "the input takes 'prompt' (a str) or 'input' (the graph's input), and 'config'; "
                "any other input is the graph's input value"
            )
        config = value.get("config")
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"'config' is a dict (the run's RunnableConfig), got {type(config).__name__}")
        if "prompt" in value:
            prompt = value["prompt"]
            if not isinstance(prompt, str):
                raise TypeError(f"'prompt' is a str, got {type(prompt).__name__}")
            return {"messages": [{"role": "user", "content": prompt}]}, config
        return value["input"], config
    return value, None


def adapt(spec: str, obj: Any, extra: str) -> AgentFn | None:
    if not isinstance(obj, Pregel):
        return None
    if not hasattr(obj, "astream"):
        raise too_old(spec, obj, extra, "astream")

    async def run(turn: Turn) -> Any:
        saver = getattr(obj, "checkpointer", None)
        value, config = graph_input(turn.input, saver not in (None, False))
        # LOOP-RESUME: step records behind the checkpoints (a subclass of the checkpointer too).
        if any(c.__name__ == "TurnCheckpointer" for c in type(saver).__mro__):
            return await run_durable(obj, saver, turn, value, config)
        state: Any = None

        async def consume() -> None:
            nonlocal state
            stream: Any = obj.astream(value, config, stream_mode=MODES)  # type: ignore[arg-type]
            async with aclosing(stream):
                async for mode, chunk in stream:
                    if mode == "values":
                        state = chunk
                        continue
                    for event in map_chunk(mode, chunk):
                        await turn.emit(event)

        async with TurnThreads():
            # ADAPT-QUIET: the stream runs in a task of its own, cancelled once when the turn is.
            # LangGraph's cleanup (cancel its node tasks, wait for them) expects one cancellation:
            # under the turn's cancel scope, which cancels again at every await, the wait is cut
            # short and the nodes run on, not even cancelled. A node that swallows the cancel then
            # holds the turn until the ladder kills the worker (``killed``).
            task = asyncio.get_running_loop().create_task(consume())
            try:
                await asyncio.shield(task)
            except BaseException:
                task.cancel()
                with anyio.CancelScope(shield=True):
                    await asyncio.wait([task])
                raise
        return jsonable(state)

    return run


async def run_durable(graph: Any, saver: Any, turn: Turn, value: Any, config: dict[str, Any] | None) -> Any:
    """A graph compiled with ``TurnCheckpointer``: each checkpoint recorded before the graph goes on
    (``durability="sync"``); on a later attempt, resumed from the last one (``worker.adapters.langgraph``)."""
    config = dict(config or {})
    configurable = config["configurable"] = dict(config.get("configurable") or {})
    configurable.setdefault("thread_id", turn.id)
    token, resumed = saver.begin(turn)
    try:
        if resumed:
            await saver.settle(graph, config)
            value = None  # LangGraph: resume the thread from its last checkpoint
        state: Any = None
        async with TurnThreads():
            stream = graph.astream(value, config, stream_mode=MODES, durability="sync")
            async for mode, chunk in stream:
                if mode == "values":
                    state = chunk
                    continue
                for event in map_chunk(mode, chunk):
                    await turn.emit(event)
        if state is None:  # resumed past the last step: the state as it was left
            state = (await graph.aget_state(config)).values
        return jsonable(state)
    finally:
        saver.end(token)


def _blocks(content: Any) -> list[dict[str, Any]]:
    """A message's content as turnpool events: text as deltas, reasoning as thoughts."""
    if isinstance(content, str):
        return [{"type": "delta", "text": content}] if content else []
    out: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else ():
        if isinstance(block, str):
            if block:
                out.append({"type": "delta", "text": block})
        elif isinstance(block, dict):
            kind = block.get("type")
            if kind == "text" and block.get("text"):
                out.append({"type": "delta", "text": block["text"]})
            elif kind in ("thinking", "reasoning"):
                text = block.get(kind) or block.get("text")
                if text:
                    out.append({"type": "thought", "text": text})
    return out


def map_chunk(mode: str, chunk: Any) -> list[dict[str, Any]]:
    """One ``(mode, chunk)`` of ``astream`` as turnpool events."""
    message: Any
    if mode == "messages":
        message, _metadata = chunk
        if getattr(message, "type", None) not in ("ai", "AIMessageChunk"):
            return []  # tool results and the user's messages come as node updates
        return _blocks(message.content)
    if mode == "custom":
        return [{"type": "framework", "name": "custom", "data": jsonable(chunk)}]
    if mode != "updates" or not isinstance(chunk, dict):
        return []
    out: list[dict[str, Any]] = []
    for node, update in chunk.items():
        messages: Any = update.get("messages", []) if isinstance(update, dict) else []
        for message in messages if isinstance(messages, list) else [messages]:
            out.extend(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "title": call.get("name"),
                    "input": jsonable(call.get("args")),
                }
                for call in getattr(message, "tool_calls", None) or ()
            )
            if getattr(message, "type", None) == "tool":
                status = "failed" if getattr(message, "status", "success") == "error" else "completed"
                output = jsonable(message.content)
                out.append(tool_update(message.tool_call_id, status, output))
        out.append(
            {"type": "framework", "name": "update", "data": {"node": node, "update": jsonable(update)}}
        )
    return out
