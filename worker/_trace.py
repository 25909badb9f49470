"""OBS-TRACE, the worker's side: an agent runs inside the trace context its turn carries.

A ``Run`` with ``trace`` (a W3C ``traceparent``) has its agent run with that context attached, so the
agent's and its framework's OpenTelemetry spans nest under the turn's span (or the caller's). Nothing
is imported for a turn without one, nor when OpenTelemetry is not installed in the worker: then there
is nobody to record a span, and the agent runs as it would anyway.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_PROPAGATE: list[Any] = []  # [extract, attach, detach] once imported; [None] when OpenTelemetry is absent


def _propagation() -> Any:
    if not _PROPAGATE:
        try:
            from opentelemetry import context
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            _PROPAGATE.append(None)
        else:
            _PROPAGATE.extend((TraceContextTextMapPropagator().extract, context.attach, context.detach))
    return _PROPAGATE


@contextlib.contextmanager
def traced(traceparent: str | None) -> Iterator[None]:
    """Attach ``traceparent``'s context for the block (this task's context, and so a plain ``def``
    agent's thread, which anyio starts in a copy of it)."""
    if traceparent is None:
        yield
        return
    found = _propagation()
    if found[0] is None:
        yield
        return
    extract, attach, detach = found
    token = attach(extract({"traceparent": traceparent}))
    try:
        yield
    finally:
        detach(token)
