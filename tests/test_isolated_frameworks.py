"""A ``worker.isolated`` tool killed for memory inside each framework's agent, run through its adapter
in a real worker on the framework's own offline model: the model is told
``tool killed: memory limit 256 MiB reached``, answers, and the turn completes; followers get a
``tool_call_update`` with ``status: "failed"`` and the reason; the worker then runs the next turn.
(The agent loop's own case is in tests/test_isolated_tools.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from supervisor import Supervisor
from tests.support.agents_server import text, tool_call
from tests.support.openai_server import FakeOpenAIServer, Plan

pytest.importorskip("pydantic_ai", reason="needs the pydantic-ai extra")
pytest.importorskip("langgraph", reason="needs the langgraph extra")
pytest.importorskip("agents", reason="needs the openai-agents extra")

pytestmark = pytest.mark.anyio

A = "tests.agents.tools_frameworks:"
TOLD = "tool killed: memory limit 256 MiB reached"
URL_VAR = "TURNPOOL_TEST_OPENAI_URL"


class _HogPlans:
    """The loopback model: calls ``allocate_oa`` first, then says what the tool's message was."""

    def __init__(self, server: FakeOpenAIServer) -> None:
        self.server = server

    def pop(self, index: int) -> Plan:
        messages = self.server.requests[-1][1]["messages"]
        told = [m["content"] for m in messages if m["role"] == "tool"]
        if told:
            return text(f"told: {told[-1]}")
        return Plan(tool_call("allocate_oa", "{}"))


@asynccontextmanager
async def _model_server() -> AsyncIterator[FakeOpenAIServer]:
    server = FakeOpenAIServer([])
    server.plans = _HogPlans(server)  # type: ignore[assignment]
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        yield server
        tg.cancel_scope.cancel()


async def _run_twice(sup: Supervisor, name: str) -> tuple[Any, list[dict[str, Any]], Any]:
    handle = await sup.submit(A + name, "allocate")
    with anyio.fail_after(120):
        result = await handle.result()
        events = [e async for e in handle.events()]
        again = await sup.run(A + name, "allocate")
    return result, events, again


async def test_each_framework_tells_its_model_of_a_memory_kill_and_the_turn_completes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with _model_server() as server:
        monkeypatch.setenv(URL_VAR, server.base_url)
        async with Supervisor(workers=1, spares=0) as sup:
            seen = {
                name: await _run_twice(sup, name)
                for name in ("pydantic_hog", "pydantic_durable_hog", "langgraph_hog", "openai_hog")
            }
    for name, (result, events, again) in seen.items():
        assert result.outcome == "completed", (name, result)
        # A graph's output is its final state: the model's answer is its last message.
        answer = result.output["messages"][-1]["content"] if name == "langgraph_hog" else result.output
        assert isinstance(answer, str) and answer.startswith("told: ") and TOLD in answer, (name, answer)
        # TOOL-TOLD-FOLLOWERS: followers see the call failed, and why, whatever the framework hands the
        # adapter (the OpenAI Agents SDK: the error's text as the tool's output).
        updates = [e for e in events if e.get("type") == "tool_call_update"]
        assert [(u["status"], u.get("reason"), u.get("text")) for u in updates] == [
            ("failed", "memory", TOLD)
        ], (name, events)
        assert again.outcome == "completed" and again.worker_pid == result.worker_pid, (name, again)


async def test_the_openai_sdks_default_failure_text_still_reports_the_kill_to_followers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TOOL-TOLD-FOLLOWERS through the OpenAI Agents SDK's default ``failure_error_function``, which hands
    the model (and the adapter) a fixed text without the error: the adapter learns which call raised what
    from the SDK's ``tool_error_formatter`` hook, so followers still get the call failed, with its reason
    and text; the model gets the SDK's text and the turn completes."""
    async with _model_server() as server:
        monkeypatch.setenv(URL_VAR, server.base_url)
        async with Supervisor(workers=1, spares=0) as sup:
            result, events, again = await _run_twice(sup, "openai_hog_default")
    assert result.outcome == "completed", result
    assert isinstance(result.output, str) and result.output.startswith("told: ") and TOLD not in result.output
    updates = [e for e in events if e.get("type") == "tool_call_update"]
    assert [(u["status"], u.get("reason"), u.get("text")) for u in updates] == [("failed", "memory", TOLD)], (
        events
    )
    assert again.outcome == "completed"


def test_an_adapters_tool_result_carrying_a_kill_of_the_turn_is_failed_with_its_reason() -> None:
    """TOOL-TOLD-FOLLOWERS where no framework model runs here: the Claude Agent SDK's in-process tools run
    in the worker, but the `claude` CLI hands their errors back as tool results (``is_error``). Every
    adapter maps a tool result through ``tool_update``: once an isolated call of the turn raised
    ``ToolKilled``, a result carrying its text is failed, with the reason and the text, once; a tool's
    own error result stays as the framework said, without a kill's reason."""
    from worker import ToolKilled, lowlevel
    from worker.adapters import tool_update

    lowlevel.tool_errors_forget()
    lowlevel.tool_error_raised(ToolKilled("memory", 256))
    own = tool_update("t0", "failed", "no such file")
    assert (own["status"], own.get("reason")) == ("failed", None)
    update = tool_update("t1", "completed", [{"type": "text", "text": TOLD}])
    assert (update["id"], update["status"], update.get("reason"), update.get("text")) == (
        "t1",
        "failed",
        "memory",
        TOLD,
    )
    again = tool_update("t2", "completed", TOLD)  # a tool returning the same text: the kill was t1's
    assert (again["status"], again.get("reason")) == ("completed", None)
    lowlevel.tool_errors_forget()
