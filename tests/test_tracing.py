"""Tracing (design rule OBS-TRACE): the caller's trace reaches the agent, and each turn is a span.

With OpenTelemetry's SDK and its in-memory exporter in this process (the caller), the turn's span is a
child of the caller's span, with events for queued, started, each escalation step and the end; an
agent's own span (recorded in the worker) is in the same trace, under the turn's span. Through the
daemon (``serve --tracing on``, spans written to its stderr), the same trace crosses the client, the
daemon and the worker; a ``traceparent`` header over HTTP and ``TRACEPARENT`` for ``turnpool
submit`` carry it too. Without ``tracing`` the caller's context still reaches the agent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
import contextlib

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from supervisor import Client, Supervisor
from tests.support.daemonkit import FAST, HTTP, serving, turnpool_argv

pytestmark = pytest.mark.anyio

BOUND = 60.0
_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """This process's tracer provider (set once per test process), its finished spans cleared."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _hex(number: int, width: int) -> str:
    return f"{number:0{width}x}"


def _turn_span(exporter: InMemorySpanExporter, turn_id: str) -> Any:
    found = [
        s for s in exporter.get_finished_spans() if (s.attributes or {}).get("turnpool.turn_id") == turn_id
    ]
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


async def test_a_turn_is_a_span_under_its_caller_and_the_agent_nests_under_it(
    spans: InMemorySpanExporter,
) -> None:
    """Embedded, ``tracing=True``: the turn's span has the caller's span as parent, its events are
    queued → started → end, its attributes the outcome and the worker; the agent's span (made in the
    worker, async and plain ``def``) is in the caller's trace with the turn's span as parent; a child
    turn's span is in the same trace too."""
    tracer = trace.get_tracer("caller")
    async with Supervisor(workers=2, spares=0, tracing=True) as sup:
        with tracer.start_as_current_span("request") as request:
            with anyio.fail_after(BOUND):
                result = await sup.run("tests.agents.tracing:report", None, turn_id="t-async")
                plain = await sup.run("tests.agents.tracing:report_sync", None, turn_id="t-sync")
                family = await sup.run("tests.agents.tracing:spawner", None, turn_id="t-parent")
    caller = request.get_span_context()
    span = _turn_span(spans, "t-async")
    assert span.parent is not None and span.parent.span_id == caller.span_id
    assert span.context.trace_id == caller.trace_id
    assert [event.name for event in span.events] == ["queued", "started", "end"]
    assert span.attributes["turnpool.outcome"] == "completed"
    assert span.attributes["turnpool.worker_pid"] == result.worker_pid
    for turn_id, output in (("t-async", result.output), ("t-sync", plain.output)):
        turn_span = _turn_span(spans, turn_id)
        assert output == {
            "trace_id": _hex(caller.trace_id, 32),
            "parent_span_id": _hex(turn_span.context.span_id, 16),
        }, turn_id
    parent_span = _turn_span(spans, "t-parent")
    child_span = next(
        s
        for s in spans.get_finished_spans()
        if (s.attributes or {}).get("turnpool.parent_turn_id") == "t-parent"
    )
    assert child_span.parent is not None and child_span.parent.span_id == parent_span.context.span_id
    assert family.output["child"]["parent_span_id"] == _hex(child_span.context.span_id, 16)
    assert family.output["child"]["trace_id"] == _hex(caller.trace_id, 32)


async def test_every_escalation_step_is_an_event_of_the_turn_span(spans: InMemorySpanExporter) -> None:
    """A turn that ignores the cancel and SIGTERM: its span records abort, sigterm and sigkill (with
    the cause), ends ``killed``; a failed turn's span has an error status naming the exception."""
    async with Supervisor(workers=1, spares=0, grace=0.2, kill_after=0.2, tracing=True) as sup:
        handle = await sup.submit("examples.agents:sigterm_ignorer", turn_id="t-kill")
        with anyio.fail_after(BOUND):
            async for _ in handle.events():
                break
            await handle.cancel()
            killed = await handle.result()
            failed = await sup.run("examples.agents:failing", None, turn_id="t-fail")
    assert killed.outcome == "killed" and failed.outcome == "failed"
    span = _turn_span(spans, "t-kill")
    steps = [event.name for event in span.events]
    assert steps == ["queued", "started", "abort", "sigterm", "sigkill", "end"], steps
    assert all(
        e.attributes["turnpool.cause"] == "user" for e in span.events if e.name in ("abort", "sigkill")
    )
    assert (span.attributes["turnpool.outcome"], span.attributes["turnpool.cause"]) == ("killed", "user")
    failed_span = _turn_span(spans, "t-fail")
    assert failed_span.status.status_code == trace.StatusCode.ERROR
    assert failed.error is not None and failed.error.type in (failed_span.status.description or "")


async def test_without_tracing_the_callers_context_still_reaches_the_agent(
    spans: InMemorySpanExporter,
) -> None:
    """``tracing`` off: no turn span, and the agent's span is a child of the caller's span itself."""
    tracer = trace.get_tracer("caller")
    async with Supervisor(workers=1, spares=0) as sup:
        with tracer.start_as_current_span("request") as request:
            with anyio.fail_after(BOUND):
                result = await sup.run("tests.agents.tracing:report", None)
        untraced = await sup.run("tests.agents.tracing:report", None)
    caller = request.get_span_context()
    assert result.output == {
        "trace_id": _hex(caller.trace_id, 32),
        "parent_span_id": _hex(caller.span_id, 16),
    }
    assert untraced.output["parent_span_id"] is None  # no context: the agent's span is a root
    assert [s.name for s in spans.get_finished_spans()] == ["request"]


def _daemon_spans(log: Path) -> list[dict[str, Any]]:
    """The spans ``ConsoleSpanExporter`` wrote to the daemon's stderr (indented JSON objects)."""
    text = log.read_text()
    found, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth, start = depth + 1, (i if depth == 0 else start)
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                with contextlib.suppress(json.JSONDecodeError):
                    found.append(json.loads(text[start : i + 1]))
    return [span for span in found if "context" in span and "name" in span]


async def test_one_trace_across_client_daemon_and_worker_http_and_the_cli(
    spans: InMemorySpanExporter,
) -> None:
    """``serve --tracing on`` with spans on its stderr: a ``Client`` submit inside the caller's span
    gives a daemon turn span whose parent is the caller's span, and an agent span under the turn
    span, all one trace; a ``traceparent`` header over HTTP and ``TRACEPARENT`` for ``turnpool
    submit --wait`` start the same chain; an invalid ``traceparent`` is ignored, never refused."""
    import httpx

    tracer = trace.get_tracer("caller")
    env = {"OTEL_TRACES_EXPORTER": "console"}
    with serving(*FAST, *HTTP, "--tracing", "on", env_extra=env) as d:
        async with Client.connect(d.endpoint) as client:
            with tracer.start_as_current_span("request") as request:
                with anyio.fail_after(BOUND):
                    result = await client.run("tests.agents.tracing:report", None, turn_id="t-client")
        caller = request.get_span_context()
        header = f"00-{'ab' * 16}-{'cd' * 8}-01"
        with anyio.fail_after(BOUND):
            async with httpx.AsyncClient(base_url=d.http_url) as http:
                ok = await http.post(
                    "/v1/turns",
                    json={"agent": "tests.agents.tracing:report", "turn_id": "t-http"},
                    headers={"traceparent": header},
                )
                bad = await http.post(
                    "/v1/turns",
                    json={"agent": "tests.agents.tracing:report", "turn_id": "t-bad"},
                    headers={"traceparent": "00-zz-not-a-trace"},
                )
            assert ok.status_code in (200, 201, 202) and bad.status_code in (200, 201, 202), bad.text
            async with Client.connect(d.endpoint) as client:
                over_http = await client.handle("t-http").result()
                ignored = await client.handle("t-bad").result()
            cli_parent = f"00-{'12' * 16}-{'34' * 8}-01"
            cli = await anyio.run_process(
                turnpool_argv("submit", "tests.agents.tracing:report", "--wait", "--endpoint", d.endpoint),
                env={**d.env, "TRACEPARENT": cli_parent},
                check=False,
            )
        assert cli.returncode == 0, cli.stderr.decode()
        by_cli = json.loads(cli.stdout)
        with anyio.fail_after(BOUND):
            while True:
                daemon_spans = {
                    s["attributes"].get("turnpool.turn_id"): s for s in _daemon_spans(d.home / "stderr.log")
                }
                if {"t-client", "t-http", "t-bad"} <= daemon_spans.keys() and len(daemon_spans) >= 4:
                    break
                await anyio.sleep(0.05)  # allowed: the exporter writes a file, no event to wait on
    turn = daemon_spans["t-client"]
    assert turn["parent_id"] == "0x" + _hex(caller.span_id, 16)
    assert turn["context"]["trace_id"] == "0x" + _hex(caller.trace_id, 32)
    assert result.output == {
        "trace_id": _hex(caller.trace_id, 32),
        "parent_span_id": turn["context"]["span_id"].removeprefix("0x"),
    }
    assert over_http.output["trace_id"] == "ab" * 16
    assert daemon_spans["t-http"]["parent_id"] == "0x" + "cd" * 8
    assert daemon_spans["t-bad"]["parent_id"] is None and ignored.outcome == "completed"
    assert by_cli["output"]["trace_id"] == "12" * 16
