"""Agents built on ``worker.agent.AgentLoop`` (``"examples.loop_agent:NAME"``).

``research`` drives a ``ScriptedModel`` through one tool round: it streams a sentence, asks
for two tools (run in parallel), then streams the answer. Every wait is tunable from the
input, so a cancel can be aimed at each detection point:

* ``open_delay``  — seconds the model takes to open its first stream (cancel while opening);
* ``event_delay`` — seconds between the first and the second streamed delta (cancel mid-stream);
* ``tool_seconds`` — seconds each tool takes (cancel while the tools run);
* ``blocking_tools`` — make the tools plain ``def`` functions that ``time.sleep`` in a thread:
  they cannot be interrupted, so a cancel waits for them (and only the grace-then-kill ladder
  stops one that takes too long).

It emits what the loop streams (``delta``, ``tool_call``, ``tool_result``) plus markers:
``{"type": "opening", "n": n}`` when a stream starts opening, ``{"type": "tool_start", "name": ...}``
when a tool starts, and ``{"type": "on_abort", "reason": ...}`` from its on_abort hook.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

import worker
from worker.agent import (
    AgentLoop,
    Delayed,
    Finish,
    Response,
    ScriptedModel,
    TextDelta,
    ToolCall,
    hook,
    tool,
)


def _research_loop(turn: worker.Turn) -> AgentLoop:
    inp = turn.input or {}
    open_delay = float(inp.get("open_delay", 0.0))
    event_delay = float(inp.get("event_delay", 0.0))
    tool_seconds = float(inp.get("tool_seconds", 0.0))
    question = str(inp.get("prompt", "What is the answer?"))

    model = ScriptedModel(
        [
            Response(
                [
                    TextDelta("Let me "),
                    Delayed(TextDelta("look that up. "), event_delay),
                    ToolCall("call_1", "search", {"query": question}),
                    ToolCall("call_2", "fetch", {"url": "https://example.invalid/answer"}),
                    Finish("tool_calls"),
                ],
                open_delay=open_delay,
            ),
            Response([TextDelta("The answer "), TextDelta("is 42."), Finish("stop")]),
        ],
        on_open=lambda n: turn.emit({"type": "opening", "n": n}),
    )

    search_params = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    fetch_params = {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}

    if inp.get("blocking_tools"):

        @tool(name="search", parameters=search_params)
        def search_blocking(query: str) -> dict[str, Any]:
            """Search the web (slowly, in a thread: cannot be interrupted)."""
            turn.emit_sync({"type": "tool_start", "name": "search"})
            time.sleep(tool_seconds)
            return {"hits": [f"result for {query}"]}

        @tool(name="fetch", parameters=fetch_params)
        def fetch_blocking(url: str) -> str:
            """Fetch a page (slowly, in a thread: cannot be interrupted)."""
            turn.emit_sync({"type": "tool_start", "name": "fetch"})
            time.sleep(tool_seconds)
            return "42"

        tools = [search_blocking, fetch_blocking]
    else:

        @tool(parameters=search_params)
        async def search(query: str) -> dict[str, Any]:
            """Search the web (slowly)."""
            await turn.emit({"type": "tool_start", "name": "search"})
            await anyio.sleep(tool_seconds)
            return {"hits": [f"result for {query}"]}

        @tool(parameters=fetch_params)
        async def fetch(url: str) -> str:
            """Fetch a page (slowly)."""
            await turn.emit({"type": "tool_start", "name": "fetch"})
            await anyio.sleep(tool_seconds)
            return "42"

        tools = [search, fetch]

    async def report_abort(reason: str) -> None:
        await turn.emit({"type": "on_abort", "reason": reason})

    return AgentLoop(model, tools=tools, hooks=[hook(on_abort=report_abort)], turn=turn)


async def research(turn: worker.Turn) -> dict[str, Any]:
    """One tool round on a scripted model; returns the final text. A supervisor cancel stops it
    at whichever detection point it is at, and the turn ends ``aborted``."""
    loop = _research_loop(turn)
    result = await loop.run(str((turn.input or {}).get("prompt", "What is the answer?")))
    return {
        "result": type(result).__name__,
        "text": getattr(result, "text", None),
        "steps": getattr(result, "steps", None),
    }


async def openai_chat(turn: worker.Turn) -> dict[str, Any]:
    """An ``AgentLoop`` on an OpenAI-compatible server (needs ``turnpool[openai]``).

    Input: ``{"prompt": ..., "model": ..., "base_url": ..., "system": ...}`` (``base_url``
    defaults to the openai package's, e.g. ``http://127.0.0.1:8000/v1`` for a local vLLM).
    Streams ``delta`` events; a supervisor cancel closes the HTTP stream and ends ``aborted``.
    """
    from worker.agent import OpenAIModel

    inp = turn.input or {}

    async def report_abort(reason: str) -> None:
        await turn.emit({"type": "on_abort", "reason": reason})

    async with OpenAIModel(
        str(inp.get("model", "gpt-4o-mini")), base_url=inp.get("base_url"), max_retries=0
    ) as model:
        loop = AgentLoop(model, hooks=[hook(on_abort=report_abort)], system=inp.get("system"), turn=turn)
        result = await loop.run(str(inp.get("prompt", "Say hello.")))
    return {"result": type(result).__name__, "text": getattr(result, "text", None)}
