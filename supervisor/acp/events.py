"""Turn events → ACP ``session/update`` payloads, and the tool calls still open in a prompt.

Pure translation, no I/O: ``TurnEvents.update(event)`` returns the update to send (or ``None``
for an event ACP has no use for) and keeps track of tool calls that have not finished, so the
front end can report them when the turn ends without finishing them.

The event shapes an agent emits (``await turn.emit(...)``) to drive an ACP client:

``{"type": "delta", "text": str}``
    a chunk of the agent's reply (``agent_message_chunk``). A bare ``str`` event is the same.
``{"type": "thought", "text": str}``
    a chunk of the agent's reasoning (``agent_thought_chunk``).
``{"type": "tool_call", "id": str, "title": str, "kind"?: ToolKind, "status"?: ToolCallStatus,
"input"?: any, "text"?: str}``
    a tool call starts (``tool_call``); ``status`` defaults to ``pending``; ``input`` becomes
    ``rawInput``; ``text`` becomes its content.
``{"type": "tool_call_update", "id": str, "status"?: ..., "title"?: str, "output"?: any, "text"?: str}``
    a tool call progresses or ends (``tool_call_update``); ``output`` becomes ``rawOutput``.
``{"type": "plan", "entries": [{"content": str, "priority"?: "high"|"medium"|"low",
"status"?: "pending"|"in_progress"|"completed"}]}``
    the agent's plan (``plan``).

``ToolKind`` is one of ACP's ``read edit delete move search execute think fetch switch_mode other``;
``ToolCallStatus`` one of ``pending in_progress completed failed``. Any other event (for instance
``{"type": "started", ...}`` from the generic example agents) and any malformed one is skipped:
an agent's event can never break the prompt it belongs to.

ACP has no ``cancelled`` tool-call status: a tool call left unfinished by a cancelled turn is
reported ``failed`` with ``_meta: {"turnpool": {"cancelled": true}}`` and the text ``cancelled``.
"""

from __future__ import annotations

import logging
from typing import Any, cast, get_args

import acp
from acp.schema import StopReason, ToolCallProgress, ToolCallStatus, ToolKind
from pydantic import ValidationError

log = logging.getLogger("turnpool.acp")

TOOL_KINDS: frozenset[str] = frozenset(get_args(ToolKind))
TOOL_STATUSES: frozenset[str] = frozenset(get_args(ToolCallStatus))
FINISHED = frozenset({"completed", "failed"})
# Stop reasons an agent may choose by returning {"stop_reason": ...}; "cancelled" is the
# front end's alone (it is answered when, and only when, the turn was cancelled).
AGENT_STOP_REASONS: frozenset[str] = frozenset(get_args(StopReason)) - {"cancelled"}
PLAN_PRIORITIES = frozenset({"high", "medium", "low"})
PLAN_STATUSES = frozenset({"pending", "in_progress", "completed"})


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _content(text: str | None) -> list[Any] | None:
    return [acp.tool_content(acp.text_block(text))] if text is not None else None


class TurnEvents:
    """One prompt's translation state: which tool calls are open."""

    def __init__(self) -> None:
        self.open_tools: dict[str, str] = {}  # tool call id → last status, for unfinished ones
        self.text = ""  # the message text streamed so far (a str output equal to it is not sent again)

    def update(self, event: Any) -> Any | None:
        """The ACP update for one turn event, or ``None`` to skip it."""
        try:
            return self._update(event)
        except (ValidationError, TypeError, ValueError) as exc:
            log.warning("skipping a malformed turn event %.200r: %s", event, exc)
            return None

    def _update(self, event: Any) -> Any | None:
        if isinstance(event, str):
            self.text += event
            return acp.update_agent_message_text(event) if event else None
        if not isinstance(event, dict):
            return None
        kind = event.get("type")
        if kind == "delta":
            text = _text(event.get("text"))
            if text:
                self.text += text
            return acp.update_agent_message_text(text) if text else None
        if kind == "thought":
            text = _text(event.get("text"))
            return acp.update_agent_thought_text(text) if text else None
        if kind == "tool_call":
            tool_id, title = event.get("id"), event.get("title")
            if not isinstance(tool_id, str) or not tool_id or not isinstance(title, str):
                return None
            asked = event.get("status", "pending")
            status: ToolCallStatus = asked if asked in TOOL_STATUSES else "pending"
            tool_kind = event.get("kind")
            start = acp.start_tool_call(
                tool_id,
                title,
                kind=tool_kind if tool_kind in TOOL_KINDS else None,
                status=status,
                content=_content(_text(event.get("text"))),
                raw_input=event.get("input"),
            )
            self._track(tool_id, status)
            return start
        if kind == "tool_call_update":
            tool_id = event.get("id")
            if not isinstance(tool_id, str) or not tool_id:
                return None
            asked = event.get("status")
            new_status: ToolCallStatus | None = asked if asked in TOOL_STATUSES else None
            tool_kind = event.get("kind")
            progress = acp.update_tool_call(
                tool_id,
                title=_text(event.get("title")),
                kind=tool_kind if tool_kind in TOOL_KINDS else None,
                status=new_status,
                content=_content(_text(event.get("text"))),
                raw_output=event.get("output"),
            )
            if new_status is not None:
                self._track(tool_id, new_status)
            return progress
        if kind == "plan":
            entries = event.get("entries")
            if not isinstance(entries, list):
                return None
            plan = []
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
                    continue
                priority = entry.get("priority", "medium")
                entry_status = entry.get("status", "pending")
                plan.append(
                    acp.plan_entry(
                        entry["content"],
                        priority=priority if priority in PLAN_PRIORITIES else "medium",
                        status=entry_status if entry_status in PLAN_STATUSES else "pending",
                    )
                )
            return acp.update_plan(plan)
        return None

    def _track(self, tool_id: str, status: str) -> None:
        if status in FINISHED:
            self.open_tools.pop(tool_id, None)
        else:
            self.open_tools[tool_id] = status

    def close_open_tools(self, *, cancelled: bool, reason: str) -> list[Any]:
        """Updates that end every unfinished tool call: ``failed``, marked cancelled when it was."""
        updates: list[Any] = [
            ToolCallProgress(
                session_update="tool_call_update",
                tool_call_id=tool_id,
                status="failed",
                content=_content(reason),
                field_meta={"turnpool": {"cancelled": True}} if cancelled else None,
            )
            for tool_id in self.open_tools
        ]
        self.open_tools.clear()
        return updates


def stop_reason_of(output: Any) -> StopReason:
    """``end_turn`` unless a completed turn's output chose another reason: ``{"stop_reason": ...}``."""
    if isinstance(output, dict):
        reason = output.get("stop_reason")
        if reason in AGENT_STOP_REASONS:
            return cast(StopReason, reason)  # checked against the closed list just above
    return "end_turn"
