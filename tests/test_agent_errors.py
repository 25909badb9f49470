"""Agent mistakes a user can act on (issue 15, item 17; design rule A-TOOLERR).

An agent named in ``__main__`` is refused at the call, saying why agents must live in an importable
module; a generator agent fails its turn saying that agents return a value and emit events, and
how; in the agent loop, a model that calls an unknown tool or passes arguments that do not fit gets
the error back as the tool's output, a bounded number of times, and ``max_steps`` bounds a model
that never finishes (run against the fake OpenAI-compatible server in tests/support).
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from supervisor import Client, InvalidAgent, Supervisor
from tests.support.openai_server import FakeOpenAIServer, Plan, chunk
from worker.agent import AgentLoop, Finished, MaxStepsExceeded, OpenAIModel, ToolError, tool

pytestmark = pytest.mark.anyio


async def test_main_module_agent_is_refused_at_the_call_saying_why() -> None:
    """``"__main__:fn"`` raises ``InvalidAgent`` at ``submit`` (embedded and client side, before
    anything is sent): workers import agents by module name and a worker's ``__main__`` is not
    the user's script, so the agent must move to an importable module."""
    async with Supervisor(workers=1, spares=0) as sup:
        with pytest.raises(InvalidAgent) as err:
            await sup.submit("__main__:fn")
    message = str(err.value)
    assert "importable module" in message and "__main__" in message and "worker" in message, message
    with pytest.raises(InvalidAgent, match="importable module"):
        await Client("ipc:///nonexistent/s.sock").submit("__main__:fn")


@pytest.mark.parametrize("agent", ["streams_by_yielding", "generator_agent"])
async def test_generator_agent_fails_saying_return_and_emit(agent: str) -> None:
    """A generator agent ends ``failed`` with a ``TypeError`` that says agents return a value and
    emit events with ``await turn.emit(...)``; the worker stays up."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(60):
            result = await sup.run(f"tests.agents.api:{agent}")
            again = await sup.run("examples.agents:echo", {"ok": 1})
    assert result.outcome == "failed" and result.error is not None
    assert result.error.type == "TypeError", result.error
    assert "turn.emit" in result.error.message and "return" in result.error.message, result.error
    assert again.outcome == "completed" and again.worker_pid == result.worker_pid


def _call(call_id: str, name: str, arguments: str) -> list[dict[str, Any]]:
    return [
        chunk(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                ],
            }
        ),
        chunk({}, finish="tool_calls"),
    ]


@tool(parameters={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]})
async def lookup(key: str) -> dict[str, Any]:
    return {"value": 42, "key": key}


async def _run(plans: list[Plan], **loop_kwargs: Any) -> tuple[Any, FakeOpenAIServer]:
    server = FakeOpenAIServer(plans)
    outcome: Any = None
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            async with OpenAIModel("test-model", base_url=server.base_url, max_retries=0) as model:
                loop = AgentLoop(model, tools=[lookup], **loop_kwargs)
                try:
                    outcome = await loop.run("what is it?")
                except Exception as exc:  # noqa: BLE001 - the test inspects it
                    outcome = exc
            tg.cancel_scope.cancel()
    return outcome, server


def _tool_messages(request: dict[str, Any]) -> list[Any]:
    return [json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"]


async def test_model_mistakes_are_answered_as_the_tools_output() -> None:
    """An unknown tool, arguments that are not JSON and arguments that do not fit the tool each
    come back to the model as ``{"error": ...}``; the model then calls the tool right and the run
    finishes."""
    plans = [
        Plan(_call("c1", "lookup_typo", '{"key": "a"}')),
        Plan(_call("c2", "lookup", '{"key": ')),
        Plan(_call("c3", "lookup", '{"name": "a"}')),
        Plan(_call("c4", "lookup", '{"key": "answer"}')),
        Plan([chunk({"content": "It is 42."}, finish="stop")]),
    ]
    result, server = await _run(plans)
    assert isinstance(result, Finished) and result.text == "It is 42.", result
    errors = _tool_messages(server.requests[3][1])
    assert [sorted(e) for e in errors] == [["error"]] * 3, errors
    assert "unknown tool 'lookup_typo'" in errors[0]["error"] and "lookup" in errors[0]["error"]
    assert "not valid JSON" in errors[1]["error"]
    assert "bad arguments for tool 'lookup'" in errors[2]["error"]
    assert _tool_messages(server.requests[4][1])[-1] == {"value": 42, "key": "answer"}


async def test_model_mistakes_are_bounded_by_max_tool_errors() -> None:
    """A model that keeps calling a tool that does not exist ends the run with ``ToolError`` after
    ``max_tool_errors`` answered mistakes, instead of looping."""
    plans = [Plan(_call(f"c{i}", "nope", "{}")) for i in range(3)]
    result, server = await _run(plans, max_tool_errors=2)
    assert isinstance(result, ToolError), result
    assert "max_tool_errors=2" in str(result) and len(server.requests) == 3


async def test_max_steps_bounds_a_model_that_never_finishes() -> None:
    """A model that calls a (working) tool at every step ends the run with ``MaxStepsExceeded``
    after ``max_steps`` model requests."""
    plans = [Plan(_call(f"c{i}", "lookup", '{"key": "k"}')) for i in range(3)]
    result, server = await _run(plans, max_steps=3)
    assert isinstance(result, MaxStepsExceeded) and result.max_steps == 3, result
    assert len(server.requests) == 3
    with pytest.raises(ValueError, match="max_steps"):
        AgentLoop(object(), max_steps=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("agent", ["raises_unreadable", "raises_unreadable_sync", "raises_surrogate"])
async def test_an_error_whose_text_cannot_be_read_ends_failed_and_the_worker_stays(agent: str) -> None:
    """WORKER-ERROR-TEXT: an exception whose ``__str__`` raises, or whose message holds a lone surrogate
    (which UTF-8 cannot carry), ends its turn ``failed`` with the error's type and what can be
    said of its message; the worker stays up for the next turn (was: the worker died, ``crashed``)."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(60):
            result = await sup.run(f"tests.agents.api:{agent}")
            again = await sup.run("examples.agents:echo", {"ok": 1})
    assert result.outcome == "failed" and result.error is not None, result
    if agent == "raises_surrogate":
        assert result.error.type == "ValueError" and result.error.message == "bad \\ud800 text", result.error
    else:
        assert result.error.type == "_UnreadableError", result.error
        assert "__str__ raised RuntimeError" in result.error.message, result.error
    assert again.outcome == "completed" and again.worker_pid == result.worker_pid
