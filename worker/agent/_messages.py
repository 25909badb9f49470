"""What the loop keeps and exchanges: history items, the model request, model events, results.

All are frozen msgspec Structs, so they encode as-is (turn events, journals).
"""

from __future__ import annotations

from typing import Any

import msgspec

# ---- history --------------------------------------------------------------------------


class UserMessage(msgspec.Struct, frozen=True, tag="user"):
    text: str


class AssistantMessage(msgspec.Struct, frozen=True, tag="assistant"):
    text: str


class FunctionCall(msgspec.Struct, frozen=True, tag="function_call"):
    """A tool call the model asked for. Pending until a ``FunctionCallOutput`` with the same
    ``call_id`` follows it in the history."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    # Why the model's arguments could not be read (not JSON, not an object), if so: the loop
    # answers the call with this error instead of running a tool.
    invalid: str | None = None


class FunctionCallOutput(msgspec.Struct, frozen=True, tag="function_call_output"):
    call_id: str
    name: str
    output: Any


HistoryItem = UserMessage | AssistantMessage | FunctionCall | FunctionCallOutput


# ---- model events ---------------------------------------------------------------------


class TextDelta(msgspec.Struct, frozen=True, tag="text_delta"):
    text: str


class ToolCall(msgspec.Struct, frozen=True, tag="tool_call"):
    """A complete tool call (clients that stream arguments in pieces assemble them first).
    ``invalid`` says why the arguments could not be read, if they could not (then ``arguments``
    is empty and the loop answers the call with that error)."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    invalid: str | None = None


class Finish(msgspec.Struct, frozen=True, tag="finish"):
    reason: str = "stop"


ModelEvent = TextDelta | ToolCall | Finish


# ---- request --------------------------------------------------------------------------


class ToolSpec(msgspec.Struct, frozen=True):
    """What the model is told about a tool: name, description, JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


class ModelRequest(msgspec.Struct, frozen=True):
    messages: tuple[HistoryItem, ...]
    tools: tuple[ToolSpec, ...] = ()
    system: str | None = None
    settings: dict[str, Any] = msgspec.field(default_factory=dict)


# ---- results --------------------------------------------------------------------------


class Finished(msgspec.Struct, frozen=True, tag="finished"):
    """``run()`` / ``resume()`` ended normally: the model finished without asking for tools."""

    text: str
    steps: int
    finish_reason: str | None = None


class Paused(msgspec.Struct, frozen=True, tag="paused"):
    """A hook answered ``Pause``. ``pending`` are the tool calls ``resume()`` will run first."""

    reason: str
    pending: tuple[FunctionCall, ...] = ()


RunResult = Finished | Paused
