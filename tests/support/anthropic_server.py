"""A loopback stand-in for the Anthropic Messages API (``POST /v1/messages``, streamed as Server-Sent
Events), so that the real ``claude`` CLI runs with no model service (``ANTHROPIC_BASE_URL``). Every
request is answered by its messages: a conversation containing "forever" gets two text deltas and then
nothing until the client hangs up; one containing "isolated" gets a ``tool_use`` of
``mcp__tools__allocate`` until a tool result is in it, then "told: " and that result's text; any other
"Hello from Claude." in three deltas. Any other path (token counting and the like) gets a small JSON
body."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

OK_JSON = (
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n"
)


def _sse(data: dict[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def _tool_results(messages: list[dict[str, Any]]) -> list[str]:
    """The text of every ``tool_result`` block in the conversation, in order."""
    found = []
    for message in messages:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    inner = "".join(part.get("text", "") for part in inner if isinstance(part, dict))
                found.append(str(inner))
    return found


class FakeAnthropicServer:
    def __init__(self) -> None:
        self.port = 0
        self.requests = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener:
            task_status.started()
            await listener.serve(self._handle)

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            # the client hung up
            with contextlib.suppress(
                anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError
            ):
                await self._answer(client)

    async def _answer(self, client: anyio.abc.SocketStream) -> None:
        buf = BufferedByteReceiveStream(client)
        head = await buf.receive_until(b"\r\n\r\n", 65536)
        lines = head.decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)
        }
        body = json.loads(await buf.receive_exactly(int(headers.get("content-length", "0"))) or b"{}")
        self.requests += 1
        path = lines[0].split(" ")[1]
        if not path.startswith("/v1/messages") or "count_tokens" in path:
            payload = json.dumps({"input_tokens": 1}).encode()
            await client.send(OK_JSON.format(len(payload)).encode() + payload)
            return
        conversation = json.dumps(body.get("messages", []))
        forever = "forever" in conversation
        words = ["Once ", "upon "] if forever else ["Hello ", "from ", "Claude."]
        model = body.get("model", "stand-in")
        if "isolated" in conversation and body.get("stream"):
            told = _tool_results(body.get("messages", []))
            if not told:
                await self._tool_use(client, model, "mcp__tools__allocate")
                return
            words = ["told: ", told[-1]]
        usage = {"input_tokens": 1, "output_tokens": len(words)}
        if not body.get("stream"):
            message = {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": "".join(words)}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": usage,
            }
            payload = json.dumps(message).encode()
            await client.send(OK_JSON.format(len(payload)).encode() + payload)
            return
        await client.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        start = {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": []}
        start |= {"stop_reason": None, "stop_sequence": None, "usage": usage}
        await client.send(_sse({"type": "message_start", "message": start}))
        block = {"type": "text", "text": ""}
        await client.send(_sse({"type": "content_block_start", "index": 0, "content_block": block}))
        for word in words:
            delta = {"type": "text_delta", "text": word}
            await client.send(_sse({"type": "content_block_delta", "index": 0, "delta": delta}))
        if forever:
            while await buf.receive():  # until the client hangs up (EndOfStream)
                pass
            return
        await client.send(_sse({"type": "content_block_stop", "index": 0}))
        end = {"stop_reason": "end_turn", "stop_sequence": None}
        await client.send(_sse({"type": "message_delta", "delta": end, "usage": usage}))
        await client.send(_sse({"type": "message_stop"}))

    async def _tool_use(self, client: anyio.abc.SocketStream, model: str, name: str) -> None:
        """Stream one assistant message that calls ``name`` with no arguments."""
        usage = {"input_tokens": 1, "output_tokens": 1}
        await client.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        start = {"id": "msg_2", "type": "message", "role": "assistant", "model": model, "content": []}
        start |= {"stop_reason": None, "stop_sequence": None, "usage": usage}
        await client.send(_sse({"type": "message_start", "message": start}))
        block = {"type": "tool_use", "id": "toolu_1", "name": name, "input": {}}
        await client.send(_sse({"type": "content_block_start", "index": 0, "content_block": block}))
        delta = {"type": "input_json_delta", "partial_json": "{}"}
        await client.send(_sse({"type": "content_block_delta", "index": 0, "delta": delta}))
        await client.send(_sse({"type": "content_block_stop", "index": 0}))
        end = {"stop_reason": "tool_use", "stop_sequence": None}
        await client.send(_sse({"type": "message_delta", "delta": end, "usage": usage}))
        await client.send(_sse({"type": "message_stop"}))
