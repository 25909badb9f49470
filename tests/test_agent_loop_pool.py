"""worker.agent through the pool: an AgentLoop agent in real worker processes, cancelled by the
supervisor at each detection point, ends ``aborted`` well inside the grace (no escalation)."""

from __future__ import annotations

import time
from contextlib import aclosing
from typing import Any

import anyio
import pytest

from supervisor import Supervisor, TurnHandle

pytestmark = pytest.mark.anyio

GRACE = 20.0
AGENT = "examples.loop_agent:research"


async def wait_for(handle: TurnHandle, wanted: dict[str, Any]) -> list[dict[str, Any]]:
    """Follow the turn's events (bounded) until one contains every key/value of ``wanted``;
    return the events seen so far."""
    seen: list[dict[str, Any]] = []
    with anyio.fail_after(30):
        async with aclosing(handle.events()) as events:
            async for event in events:
                seen.append(event)
                if all(event.get(k) == v for k, v in wanted.items()):
                    return seen
    raise AssertionError(f"the turn ended without emitting {wanted}: {seen}")


async def all_events(handle: TurnHandle) -> list[dict[str, Any]]:
    with anyio.fail_after(30):
        async with aclosing(handle.events()) as events:
            return [event async for event in events]


async def test_loop_agent_completes_and_streams_its_events() -> None:
    """Uncancelled, the loop agent streams deltas, both tool calls and results, and completes."""
    async with Supervisor(workers=1, spares=0) as sup:
        handle = await sup.submit(AGENT, {})
        with anyio.fail_after(30):
            result = await handle.result()
        events = await all_events(handle)
    assert result.outcome == "completed", result
    assert result.output == {"result": "Finished", "text": "The answer is 42.", "steps": 3}
    kinds = [e["type"] for e in events]
    assert kinds.count("delta") == 4 and kinds.count("tool_call") == 2 and kinds.count("tool_result") == 2
    assert "on_abort" not in kinds
    assert (
        "".join(e["text"] for e in events if e["type"] == "delta") == "Let me look that up. The answer is 42."
    )


@pytest.mark.parametrize(
    ("where", "inp", "marker"),
    [
        pytest.param("opening", {"open_delay": 3600}, {"type": "opening", "n": 1}, id="stream-opening"),
        pytest.param(
            "mid-stream", {"event_delay": 3600}, {"type": "delta", "text": "Let me "}, id="mid-stream"
        ),
        pytest.param("tools", {"tool_seconds": 3600}, {"type": "tool_start", "name": "fetch"}, id="tools"),
    ],
)
async def test_supervisor_cancel_at_each_detection_point_is_aborted(
    where: str, inp: dict[str, Any], marker: dict[str, Any]
) -> None:
    """Cancel through the Supervisor while the loop opens the stream, between streamed events,
    or while its tools run: ``run()`` raises the loop's ``Cancelled`` (a TurnCancelled with the
    turn's cause), the turn ends ``aborted`` far inside the grace, the on_abort hook reported
    "Cancelled", and the same worker serves the next turn (no kill)."""
    async with Supervisor(workers=1, spares=0, grace=GRACE) as sup:
        handle = await sup.submit("tests.agents.loop:research_probe", inp)
        before = await wait_for(handle, marker)
        if where == "tools":
            assert {e.get("name") for e in before if e["type"] == "tool_start"} >= {"fetch"}
        t0 = time.monotonic()
        assert await handle.cancel() == {"kind": "user"}
        with anyio.fail_after(30):
            result = await handle.result()
        elapsed = time.monotonic() - t0
        events = await all_events(handle)
        with anyio.fail_after(30):
            after = await sup.run("examples.agents:echo", "next")
    assert result.outcome == "aborted", result
    assert result.cause == {"kind": "user"} and result.started
    assert elapsed < GRACE / 2
    assert [e for e in events if e["type"] == "on_abort"] == [{"type": "on_abort", "reason": "Cancelled"}]
    # The loop recognised the Abort and raised its own typed cancellation, with the turn's cause.
    assert [e for e in events if e["type"] == "run_raised"] == [
        {
            "type": "run_raised",
            "error": "Cancelled",
            "turn_cancelled": True,
            "cause": "user",
            "interrupted": True,
        }
    ]
    assert not any(e["type"] == "tool_result" for e in events)
    assert after.outcome == "completed" and after.worker_pid == result.worker_pid


async def test_supervisor_cancel_of_an_openai_turn_closes_the_http_stream() -> None:
    """A worker runs ``examples.loop_agent:openai_chat`` against a loopback server the test
    started; cancelled mid-stream through the Supervisor, the turn ends ``aborted`` inside the
    grace and the server sees the worker's HTTP connection close."""
    from tests.support.openai_server import FakeOpenAIServer, Plan, chunk

    server = FakeOpenAIServer([Plan([chunk({"role": "assistant", "content": "Once upon"})], stall=True)])
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        async with Supervisor(workers=1, spares=0, grace=GRACE) as sup:
            handle = await sup.submit(
                "examples.loop_agent:openai_chat",
                {"base_url": server.base_url, "model": "m", "prompt": "story"},
            )
            await wait_for(handle, {"type": "delta", "text": "Once upon"})
            t0 = time.monotonic()
            await handle.cancel()
            with anyio.fail_after(30):
                result = await handle.result()
                await server.disconnected.wait()
            elapsed = time.monotonic() - t0
            events = await all_events(handle)
        tg.cancel_scope.cancel()
    assert result.outcome == "aborted" and elapsed < GRACE / 2
    assert {"type": "on_abort", "reason": "Cancelled"} in events


async def test_blocking_tool_delays_the_abort_until_it_returns() -> None:
    """Tools that cannot be interrupted (plain ``def`` in a thread, here taking 1 s) hold the
    cancel until they return; then the loop stops at detection point 4 and the turn still ends
    ``aborted`` inside the grace, with the finished tools' work never fed back to the model."""
    async with Supervisor(workers=1, spares=0, grace=GRACE) as sup:
        handle = await sup.submit(AGENT, {"blocking_tools": True, "tool_seconds": 1.0})
        await wait_for(handle, {"type": "tool_start", "name": "fetch"})
        await handle.cancel()
        with anyio.fail_after(30):
            result = await handle.result()
        events = await all_events(handle)
    assert result.outcome == "aborted", result
    assert {"type": "on_abort", "reason": "Cancelled"} in events
    assert not any(e["type"] == "opening" and e["n"] == 2 for e in events)


async def test_tool_stuck_past_the_grace_is_killed_and_the_worker_replaced() -> None:
    """A blocking tool that outlives the grace is what the escalation ladder is for: the turn
    ends ``killed`` and a new worker (new pid) serves the next turn."""
    async with Supervisor(workers=1, spares=0, grace=0.3, kill_after=1.0) as sup:
        handle = await sup.submit(AGENT, {"blocking_tools": True, "tool_seconds": 3600})
        await wait_for(handle, {"type": "tool_start", "name": "fetch"})
        await handle.cancel()
        with anyio.fail_after(30):
            result = await handle.result()
            after = await sup.run("examples.agents:echo", 1)
    assert result.outcome == "killed", result
    assert after.outcome == "completed" and after.worker_pid != result.worker_pid
