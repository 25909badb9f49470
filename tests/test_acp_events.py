"""Turn events → ACP updates (``supervisor.acp.events``): pure translation, no processes."""

from __future__ import annotations

import pytest

pytest.importorskip("acp", reason="the acp extra is not installed")
from acp.schema import AgentMessageChunk, AgentPlanUpdate, AgentThoughtChunk, ToolCallProgress, ToolCallStart

from supervisor.acp.events import TurnEvents, stop_reason_of


def test_deltas_thoughts_and_bare_strings_become_chunks() -> None:
    """``delta`` and bare strings are message chunks, ``thought`` a thought chunk; empty text is skipped."""
    ev = TurnEvents()
    delta = ev.update({"type": "delta", "text": "hi", "i": 0})
    assert isinstance(delta, AgentMessageChunk) and delta.content.text == "hi"
    bare = ev.update("there")
    assert isinstance(bare, AgentMessageChunk) and bare.content.text == "there"
    thought = ev.update({"type": "thought", "text": "hmm"})
    assert isinstance(thought, AgentThoughtChunk) and thought.content.text == "hmm"
    assert ev.update({"type": "delta", "text": ""}) is None


def test_other_and_malformed_events_are_skipped() -> None:
    """Events ACP has no use for, or that are malformed, are skipped rather than breaking the prompt."""
    ev = TurnEvents()
    for event in [
        None,
        3,
        ["delta"],
        {"type": "started", "pid": 1},
        {"type": "delta", "text": 5},
        {"type": "tool_call", "title": "no id"},
        {"type": "tool_call", "id": "x", "title": 3},
        {"type": "tool_call_update"},
        {"type": "plan", "entries": "nope"},
    ]:
        assert ev.update(event) is None, event
    assert ev.open_tools == {}


def test_tool_calls_are_tracked_until_they_finish() -> None:
    """A started tool call stays open until an update says ``completed`` or ``failed``; unknown
    kinds and statuses fall back (kind unset, status ``pending``)."""
    ev = TurnEvents()
    start = ev.update(
        {
            "type": "tool_call",
            "id": "a",
            "title": "read",
            "kind": "read",
            "input": {"p": 1},
            "text": "reading",
        }
    )
    assert isinstance(start, ToolCallStart)
    assert (start.tool_call_id, start.kind, start.status) == ("a", "read", "pending")
    assert start.raw_input == {"p": 1}
    odd = ev.update({"type": "tool_call", "id": "b", "title": "x", "kind": "teleport", "status": "weird"})
    assert isinstance(odd, ToolCallStart) and odd.kind is None and odd.status == "pending"
    progress = ev.update({"type": "tool_call_update", "id": "a", "status": "in_progress"})
    assert isinstance(progress, ToolCallProgress) and progress.status == "in_progress"
    assert ev.open_tools == {"a": "in_progress", "b": "pending"}
    done = ev.update({"type": "tool_call_update", "id": "a", "status": "completed", "output": [1]})
    assert isinstance(done, ToolCallProgress) and done.raw_output == [1]
    assert ev.open_tools == {"b": "pending"}


def test_closing_open_tools_marks_them_cancelled() -> None:
    """Unfinished tool calls of a cancelled turn end ``failed`` with ``_meta.turnpool.cancelled``
    (ACP has no cancelled status); after that none is open."""
    ev = TurnEvents()
    ev.update({"type": "tool_call", "id": "a", "title": "t"})
    ev.update({"type": "tool_call", "id": "b", "title": "t"})
    ev.update({"type": "tool_call_update", "id": "b", "status": "failed"})
    (closing,) = ev.close_open_tools(cancelled=True, reason="cancelled")
    assert closing.tool_call_id == "a" and closing.status == "failed"
    assert closing.field_meta == {"turnpool": {"cancelled": True}}
    dumped = closing.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped["_meta"] == {"turnpool": {"cancelled": True}}
    assert ev.close_open_tools(cancelled=True, reason="cancelled") == []


def test_plan_entries_are_normalised() -> None:
    """A ``plan`` event becomes a plan update; entries without content are dropped."""
    plan = TurnEvents().update(
        {
            "type": "plan",
            "entries": [
                {"content": "read", "priority": "high", "status": "completed"},
                {"content": "write"},
                {"nope": 1},
            ],
        }
    )
    assert isinstance(plan, AgentPlanUpdate)
    assert [(e.content, e.priority, e.status) for e in plan.entries] == [
        ("read", "high", "completed"),
        ("write", "medium", "pending"),
    ]


def test_stop_reason_of_output() -> None:
    """``end_turn`` by default; an agent may return another ACP reason, but never ``cancelled``."""
    assert stop_reason_of(None) == "end_turn"
    assert stop_reason_of({"stop_reason": "max_tokens"}) == "max_tokens"
    assert stop_reason_of({"stop_reason": "refusal"}) == "refusal"
    assert stop_reason_of({"stop_reason": "cancelled"}) == "end_turn"
    assert stop_reason_of({"stop_reason": "bogus"}) == "end_turn"
