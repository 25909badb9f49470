"""Tracing (OBS-TRACE): W3C trace context carried from the caller to the agent, and a span per turn.

Two parts, each off unless asked for:

* **Context.** A turn carries the ``traceparent`` it was submitted under to its worker (``Run.trace``),
  where the agent runs inside that context: an agent's or a framework's own spans nest under the
  caller's trace. ``caller_trace()`` finds it: a value set for this call (``CALLER_TRACE``: the daemon
  sets the one a ``Submit`` or an HTTP ``traceparent`` header brought; ``turnpool submit`` the
  ``TRACEPARENT`` environment variable's), else the current OpenTelemetry span's context where
  OpenTelemetry is already imported. Neither: ``None`` at the cost of a context-variable read and a
  dict lookup; nothing is imported for it.
* **Spans.** ``TurnSpans`` (``Supervisor(tracing=True)``, ``turnpool serve --tracing``) opens a span
  per turn from its acceptance to its end, with events for ``started``, each escalation step
  (``abort``, ``sigterm``, ``sigkill``) and ``end``, and the outcome, cause, attempts and worker pid as
  attributes; the turn's workers then get the turn span's context, so the agent's spans nest under
  it. It uses the global tracer provider (configured by the application, or by
  ``opentelemetry-instrument``); ``OTEL_TRACES_EXPORTER=console`` gives a daemon one of its own.
"""

from __future__ import annotations

import os
import re
import sys
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from wire import TurnResult

if TYPE_CHECKING:
    from ._engine.turns import TurnRecord

# The trace context a front end received with a submit (a ``Submit.trace``, a ``traceparent``
# header), set around the acceptance it makes: the engine's ``caller_trace()`` reads it.
CALLER_TRACE: ContextVar[str | None] = ContextVar("turnpool_caller_trace", default=None)

# W3C trace context: version 00, a 128-bit trace id and a 64-bit parent id (neither all zeros), flags.
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def valid_traceparent(value: Any) -> str | None:
    """``value`` if it is a W3C ``traceparent`` of version 00, else ``None``: an invalid one is
    ignored, as the W3C recommendation says (a trace is never a reason to refuse a turn)."""
    if isinstance(value, str) and len(value) == 55 and _TRACEPARENT.fullmatch(value):
        return value
    return None


def caller_trace() -> str | None:
    """The ``traceparent`` a turn accepted now runs under, or ``None``."""
    given = CALLER_TRACE.get()
    if given is not None:
        return given
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None  # OpenTelemetry not in use here: nothing to carry
    return _traceparent_of(trace.get_current_span().get_span_context())


def _traceparent_of(ctx: Any) -> str | None:
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def context_of(traceparent: str | None) -> Any:
    """The OpenTelemetry ``Context`` of a ``traceparent`` (OpenTelemetry must be importable)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {} if traceparent is None else {"traceparent": traceparent}
    return TraceContextTextMapPropagator().extract(carrier)


def require_otel() -> None:
    """``tracing=True`` without OpenTelemetry: a ``ValueError`` naming the extra, at the call."""
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        raise ValueError("tracing needs OpenTelemetry: pip install 'turnpool[otel]'") from None


def configure_from_environment() -> None:
    """``tracing=True`` (``turnpool serve --tracing on``): with ``OTEL_TRACES_EXPORTER=console`` and no
    tracer provider set yet, one of this process's own that writes finished spans to stderr (other
    exporters come from ``opentelemetry-instrument``, which sets the provider before this runs)."""
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip() != "console":
        return
    from opentelemetry import trace

    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    service = os.environ.get("OTEL_SERVICE_NAME", "turnpool")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    trace.set_tracer_provider(provider)


class TurnSpans:
    """A span per turn, driven by the engine's hooks (``install``)."""

    def __init__(self) -> None:
        require_otel()
        configure_from_environment()
        from opentelemetry import trace

        self._trace = trace
        self._tracer = trace.get_tracer("turnpool")
        self._spans: dict[str, Any] = {}

    def install(self, hooks: Any) -> None:
        hooks.accept.append(self.accepted)
        hooks.start.append(self.started)
        hooks.step.append(self.stepped)
        hooks.result.append(self.ended)

    def accepted(self, turn: TurnRecord) -> None:
        parent = context_of(turn.trace) if turn.trace is not None else None
        span = self._tracer.start_span(
            f"turn {turn.agent}",
            context=parent,
            kind=self._trace.SpanKind.INTERNAL,
            attributes={"turnpool.turn_id": turn.id, "turnpool.agent": turn.agent},
        )
        if turn.session is not None:
            span.set_attribute("turnpool.session", turn.session)
        if turn.parent is not None:
            span.set_attribute("turnpool.parent_turn_id", turn.parent)
        span.add_event("queued")
        self._spans[turn.id] = span
        turn.trace = _traceparent_of(span.get_span_context()) or turn.trace

    def started(self, turn: TurnRecord, pid: int) -> None:
        span = self._spans.get(turn.id)
        if span is not None:
            span.add_event("started", {"turnpool.worker_pid": pid})

    def stepped(self, turn: TurnRecord, step: str) -> None:
        span = self._spans.get(turn.id)
        if span is not None:
            cause = turn.cause["kind"] if turn.cause is not None else ""
            span.add_event(step, {"turnpool.cause": cause})

    def ended(self, turn: TurnRecord, result: TurnResult) -> None:
        span = self._spans.pop(turn.id, None)
        if span is None:
            return
        span.set_attribute("turnpool.outcome", result.outcome)
        span.set_attribute("turnpool.attempts", result.attempts)
        span.set_attribute("turnpool.started", result.started)
        if result.cause is not None:
            span.set_attribute("turnpool.cause", result.cause["kind"])
        if result.worker_pid is not None:
            span.set_attribute("turnpool.worker_pid", result.worker_pid)
        if result.exit_code is not None:
            span.set_attribute("turnpool.exit_code", result.exit_code)
        if result.outcome in ("failed", "crashed"):
            error = result.error
            detail = f"{error.type}: {error.message}" if error is not None else result.outcome
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, detail))
        span.add_event("end", {"turnpool.outcome": result.outcome})
        span.end()
