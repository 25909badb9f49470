"""A compiled LangGraph graph as a turnpool agent: ``astream`` with the ``messages``, ``updates`` and
``custom`` stream modes (and ``values``, for the final state), mapped onto turnpool's events
(docs/adapters.md); the output is the final state, messages as dicts.

Input: a ``str`` is the user's message (``{"messages": [{"role": "user", "content": str}]}``);
``{"prompt": str, "config": {...}}`` the same with the run's config (``thread_id`` under
``configurable``); ``{"input": value, "config": {...}}`` any graph input with a config; an
editor's prompt through ``turnpool acp`` is the user's message (its session the thread, for a
checkpointed graph); anything else is the graph's input value as it is.

Cancel: the turn's Abort cancels the turn's scope, which cancels ``astream`` (LangGraph cancels its
node tasks). Sync nodes and tools run in the loop's default executor, which is the turn's
``TurnThreads``: the turn ends only once they have returned.
"""

from __future__ import annotations

from typing import Any

from langgraph.pregel import Pregel
from pydantic_core import to_jsonable_python

from .._turn import Turn
from . import AgentFn, TurnThreads, acp_prompt, too_old

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
        value, config = graph_input(turn.input, getattr(obj, "checkpointer", None) not in (None, False))
        state: Any = None
        async with TurnThreads():
            async for mode, chunk in obj.astream(value, config, stream_mode=MODES):  # type: ignore[arg-type]
                if mode == "values":
                    state = chunk
                    continue
                for event in map_chunk(mode, chunk):
                    await turn.emit(event)
        return jsonable(state)

    return run


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
                out.append(
                    {
                        "type": "tool_call_update",
                        "id": message.tool_call_id,
                        "status": status,
                        "output": output,
                    }
                )
        out.append(
            {"type": "framework", "name": "update", "data": {"node": node, "update": jsonable(update)}}
        )
    return out
