"""A tiny OpenAI-compatible Chat Completions server for the tests: loopback only, one scripted
plan per request, SSE streaming, and events for what it saw (request in, client gone)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream


@dataclass
class Plan:
    """How to answer one request: ``chunks`` as SSE ``data:`` lines, then ``[DONE]``; with
    ``stall`` the server stops after the chunks and waits for the client to hang up; with
    ``hold_headers`` it never answers at all (the client is stuck opening the stream);
    ``status`` other than 200 answers with an error body."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    stall: bool = False
    hold_headers: bool = False
    status: int = 200


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


class FakeOpenAIServer:
    def __init__(self, plans: list[Plan]) -> None:
        self.plans = list(plans)
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.received = anyio.Event()
        self.disconnected = anyio.Event()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener:
            task_status.started()
            await listener.serve(self._handle)

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            buf = BufferedByteReceiveStream(client)
            try:
                head = await buf.receive_until(b"\r\n\r\n", 65536)
            except (anyio.EndOfStream, anyio.IncompleteRead):
                return
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            headers = {
                k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)
            }
            body = await buf.receive_exactly(int(headers.get("content-length", "0")))
            self.requests.append((path, json.loads(body)))
            plan = self.plans.pop(0)
            self.received.set()
            if plan.hold_headers:
                await self._until_client_leaves(buf)
                return
            if plan.status != 200:
                payload = json.dumps(
                    {"error": {"message": "scripted failure", "type": "server_error"}}
                ).encode()
                await client.send(
                    f"HTTP/1.1 {plan.status} Error\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                    + payload
                )
                return
            await client.send(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                b"Connection: close\r\n\r\n"
            )
            for c in plan.chunks:
                await client.send(b"data: " + json.dumps(c).encode() + b"\n\n")
            if plan.stall:
                await self._until_client_leaves(buf)
                return
            await client.send(b"data: [DONE]\n\n")

    async def _until_client_leaves(self, buf: BufferedByteReceiveStream) -> None:
        while True:
            try:
                await buf.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                break
        self.disconnected.set()
