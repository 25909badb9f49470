"""Claude Agent SDK options (``claude_agent_sdk.ClaudeAgentOptions``) as a turnpool agent: a
``ClaudeSDKClient`` session whose ``claude`` CLI is a child of the worker, so it is inside the
turn's process tree and the ladder reaches it and whatever it starts.

Input: a ``str`` prompt, or ``{"prompt": str, "session_id": str}`` (the SDK's conversation id).

Events: partial messages (``include_partial_messages=True``) stream ``delta`` and ``thought``;
without them each whole text or thinking block is one ``delta``/``thought``. A ``tool_use`` block is a
``tool_call``, its ``tool_result`` a ``tool_call_update``; system messages and anything else are
``framework`` events. Output: the ``ResultMessage``'s ``structured_output`` if any, else its
``result`` text; a result with ``is_error`` fails the turn.

Cancel: the turn's Abort cancels its scope; on the way out (shielded) the SDK's ``interrupt()`` is
sent (bounded) to a session that connected, then ``disconnect()`` closes the CLI's stdin and waits
for it. A CLI that ignores both is still running when the grace ends: the ladder kills the worker's
tree, the CLI and its children with it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import anyio
import claude_agent_sdk as sdk

from .._errors import TurnCancelled
from .._turn import Turn
from . import AgentFn, split_input, too_old, tool_update

FRAMEWORK = "Claude Agent SDK options"
KEYS = ("session_id",)
INTERRUPT_SECONDS = 2.0  # how long a cancelled turn waits for the CLI to acknowledge interrupt()


def jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.loads(json.dumps(value, default=str))


def adapt(spec: str, obj: Any, extra: str) -> AgentFn | None:
    if not isinstance(obj, getattr(sdk, "ClaudeAgentOptions", ())):
        return None
    for name in ("ClaudeSDKClient", "ResultMessage", "StreamEvent"):
        if not hasattr(sdk, name):
            raise too_old(spec, obj, extra, f"claude_agent_sdk.{name}")
    options: Any = obj
    partial = bool(getattr(obj, "include_partial_messages", False))

    async def run(turn: Turn) -> Any:
        prompt, extras = split_input(turn.input, FRAMEWORK, KEYS)
        session_id = extras.get("session_id", "default")
        if not isinstance(session_id, str):
            raise TypeError(f"'session_id' is a str, got {type(session_id).__name__}")
        client = sdk.ClaudeSDKClient(options=options)
        result: Any = None
        connected = False
        try:
            await client.connect()
            connected = True
            await client.query(prompt, session_id=session_id)
            async for message in client.receive_response():
                if isinstance(message, sdk.ResultMessage):
                    result = message
                for event in map_message(message, partial):
                    await turn.emit(event)
        finally:
            with anyio.CancelScope(shield=True):
                # a cancel during connect() left no session to interrupt (the SDK then raises
                # "Not connected", which would stand in for the cancel)
                if turn.signal.cancelled and connected and result is None:
                    with anyio.move_on_after(INTERRUPT_SECONDS):
                        await client.interrupt()
                await client.disconnect()
        if turn.signal.cancelled:
            raise TurnCancelled(turn.signal.cause)
        if result is None:
            raise RuntimeError("the claude CLI ended without a result")
        if result.is_error:
            raise RuntimeError(
                f"the claude CLI ended with {result.subtype}: {result.result or result.errors}"
            )
        if result.structured_output is not None:
            return jsonable(result.structured_output)
        return result.result

    return run


def map_message(message: Any, partial: bool) -> list[dict[str, Any]]:
    """One SDK message as turnpool events."""
    if isinstance(message, sdk.StreamEvent):
        delta = message.event.get("delta") if message.event.get("type") == "content_block_delta" else None
        if isinstance(delta, dict):
            if delta.get("type") == "text_delta" and delta.get("text"):
                return [{"type": "delta", "text": delta["text"]}]
            if delta.get("type") == "thinking_delta" and delta.get("thinking"):
                return [{"type": "thought", "text": delta["thinking"]}]
        return []
    if isinstance(message, (sdk.AssistantMessage, sdk.UserMessage)) and isinstance(message.content, list):
        events: list[dict[str, Any]] = []
        for block in message.content:
            if isinstance(block, sdk.TextBlock):
                if not partial and isinstance(message, sdk.AssistantMessage):
                    events.append({"type": "delta", "text": block.text})
            elif isinstance(block, sdk.ThinkingBlock):
                if not partial:
                    events.append({"type": "thought", "text": block.thinking})
            elif isinstance(block, sdk.ToolUseBlock):
                events.append(
                    {"type": "tool_call", "id": block.id, "title": block.name, "input": jsonable(block.input)}
                )
            elif isinstance(block, sdk.ToolResultBlock):
                status = "failed" if block.is_error else "completed"
                events.append(tool_update(block.tool_use_id, status, jsonable(block.content)))
        return events
    if isinstance(message, (sdk.AssistantMessage, sdk.UserMessage, sdk.ResultMessage)):
        return []
    if isinstance(message, sdk.SystemMessage):
        return [{"type": "framework", "name": f"system.{message.subtype}", "data": jsonable(message.data)}]
    return [{"type": "framework", "name": type(message).__name__, "data": jsonable(message)}]
