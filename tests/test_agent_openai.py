"""worker.agent.OpenAIModel against a local OpenAI-compatible streaming server (loopback,
started by each test): streaming text and tool calls, errors, and cancellation closing the
HTTP connection (the server sees the client leave)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from tests.support.openai_server import FakeOpenAIServer, Plan, chunk
from worker.agent import (
    AgentLoop,
    Cancelled,
    ClientError,
    ConfigWarnings,
    Finished,
    OpenAIModel,
    TextDelta,
    hook,
    tool,
)

pytestmark = pytest.mark.anyio


def tool_call_chunks() -> list[dict[str, Any]]:
    """Text, then one tool call whose id/name come first and arguments in three fragments."""
    return [
        chunk({"role": "assistant", "content": "Checking"}),
        chunk({"content": "..."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"key"'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "ans'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'wer"}'}}]}),
        chunk({}, finish="tool_calls"),
    ]


async def test_streams_text_and_tool_calls_through_the_loop() -> None:
    """Text deltas and a fragmented tool call become events; the tool runs; its output goes back
    as a ``tool`` message next to the assistant's ``tool_calls``; base_url and settings are used."""

    @tool(parameters={"type": "object", "properties": {"key": {"type": "string"}}})
    async def lookup(key: str) -> dict[str, Any]:
        return {"value": 42, "key": key}

    server = FakeOpenAIServer(
        [
            Plan(tool_call_chunks()),
            Plan([chunk({"content": "It is "}), chunk({"content": "42."}, finish="stop")]),
        ]
    )
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            async with OpenAIModel("test-model", base_url=server.base_url, max_retries=0) as model:
                loop = AgentLoop(model, tools=[lookup], system="be brief", settings={"temperature": 0})
                result = await loop.run("what is it?")
            tg.cancel_scope.cancel()
    assert result == Finished("It is 42.", 3, "stop")
    (path1, first), (path2, second) = server.requests
    assert path1 == path2 == "/v1/chat/completions"
    assert first["model"] == "test-model" and first["stream"] is True and first["temperature"] == 0
    assert first["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is it?"},
    ]
    assert first["tools"][0]["function"]["name"] == "lookup"
    assistant, tool_msg = second["messages"][2:]
    assert assistant["content"] == "Checking..."
    assert assistant["tool_calls"] == [
        {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "answer"}'}}
    ]
    assert tool_msg == {
        "role": "tool",
        "tool_call_id": "call_a",
        "content": json.dumps({"value": 42, "key": "answer"}),
    }


async def test_cancel_mid_stream_closes_the_http_connection() -> None:
    """The server sends one delta and then holds the stream open; ``cancel()`` ends the run
    ``Cancelled`` at once and the server sees the client hang up."""
    server = FakeOpenAIServer([Plan([chunk({"role": "assistant", "content": "Once upon"})], stall=True)])
    first_delta = anyio.Event()

    def on_event(event: Any) -> None:
        if isinstance(event, TextDelta):
            first_delta.set()

    reasons: list[str] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            async with OpenAIModel("test-model", base_url=server.base_url, max_retries=0) as model:
                loop = AgentLoop(model, hooks=[hook(on_event=on_event, on_abort=reasons.append)])

                async def cancel_after_first_delta() -> None:
                    await first_delta.wait()
                    loop.cancel()

                tg.start_soon(cancel_after_first_delta)
                with pytest.raises(Cancelled):
                    await loop.run("tell me a long story")
                await server.disconnected.wait()
            tg.cancel_scope.cancel()
    assert reasons == ["Cancelled"]
    last = loop.timeline.blocks[-1]
    assert (last.kind, last.state, last.text) == ("text", "aborted", "Once upon")


async def test_cancel_while_opening_closes_the_http_connection() -> None:
    """The server takes the request and never answers; a cancel while the stream is being
    opened ends the run ``Cancelled`` and drops the connection."""
    server = FakeOpenAIServer([Plan(hold_headers=True)])
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            async with OpenAIModel("test-model", base_url=server.base_url, max_retries=0) as model:
                loop = AgentLoop(model)
                sender = loop.cancel_sender()

                async def cancel_when_received() -> None:
                    await server.received.wait()
                    await sender.send()

                tg.start_soon(cancel_when_received)
                with pytest.raises(Cancelled):
                    await loop.run("hi")
                sender.close()
                await server.disconnected.wait()
            tg.cancel_scope.cancel()


async def test_http_error_is_a_client_error() -> None:
    """An HTTP error answer ends the run with ``ClientError`` and the on_abort hooks hear it."""
    server = FakeOpenAIServer([Plan(status=500)])
    reasons: list[str] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            async with OpenAIModel("test-model", base_url=server.base_url, max_retries=0) as model:
                loop = AgentLoop(model, hooks=[hook(on_abort=reasons.append)])
                with pytest.raises(ClientError) as info:
                    await loop.run("hi")
            tg.cancel_scope.cancel()
    assert reasons == [str(info.value)] and "500" in reasons[0]


async def test_unsupported_setting_is_a_config_warning() -> None:
    """A setting the client does not pass on is refused before any request is sent."""
    server = FakeOpenAIServer([])
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            async with OpenAIModel("test-model", base_url=server.base_url, max_retries=0) as model:
                loop = AgentLoop(model, settings={"top_k": 4})
                with pytest.raises(ConfigWarnings) as info:
                    await loop.run("hi")
            tg.cancel_scope.cancel()
    assert info.value.warnings == ("OpenAIModel does not support setting 'top_k'",)
    assert server.requests == []
