"""Agents for the tracing tests (``tests/test_tracing.py``): each reports the trace context it ran in."""

from __future__ import annotations

from typing import Any

import worker


def _span_ids() -> dict[str, Any]:
    """Open a span of the agent's own (with a provider of its own, as an instrumented framework
    would) and report its trace id and its parent's span id."""
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("agent")
    with tracer.start_as_current_span("agent-work") as span:
        ctx = span.get_span_context()
        parent = span.parent  # type: ignore[attr-defined]  # the SDK span's parent context
    return {
        "trace_id": f"{ctx.trace_id:032x}",
        "parent_span_id": None if parent is None else f"{parent.span_id:016x}",
    }


async def report(turn: worker.Turn) -> dict[str, Any]:
    return _span_ids()


def report_sync(turn: worker.Turn) -> dict[str, Any]:
    """A plain ``def`` agent: it runs in a thread, which gets the turn's context too."""
    return _span_ids()


async def spawner(turn: worker.Turn) -> dict[str, Any]:
    """A child turn's agent runs in the same trace."""
    child = await turn.spawn("tests.agents.tracing:report", None)
    return {"own": _span_ids(), "child": child.output}
