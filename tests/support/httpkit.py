"""Talking to a daemon's HTTP front end in tests: a client, submit and result, the event stream
parsed, and an error reply checked."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import msgspec

from supervisor.http import ErrorReply
from tests.support import daemonkit

TIMEOUT = httpx.Timeout(60.0)


def client(d: daemonkit.Served, **kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=d.http_url, timeout=TIMEOUT, **kwargs)


async def submit(http: httpx.AsyncClient, agent: str, input: Any = None, **fields: Any) -> str:
    r = await http.post("/v1/turns", json={"agent": agent, "input": input, **fields})
    assert r.status_code == 201, r.text
    return str(r.json()["turn_id"])


async def result(http: httpx.AsyncClient, turn_id: str) -> dict[str, Any]:
    with anyio.fail_after(60):
        while True:
            r = await http.get(f"/v1/turns/{turn_id}", params={"wait": 30})
            if r.status_code == 200:
                return dict(r.json())
            assert r.status_code == 202, r.text


def error_of(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = msgspec.json.decode(r.content, type=ErrorReply)
    assert body.error.code == code, body
    return body.error.message


async def sse(response: httpx.Response) -> AsyncIterator[Any]:
    """Parse a text/event-stream into ``(event, id, data)`` tuples as they arrive."""
    event: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if not line:
            if "event" in event or "data" in event:
                yield event.get("event", "message"), event.get("id"), json.loads(event.get("data", "null"))
            event = {}
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        event[key] = value[1:] if value.startswith(" ") else value


async def follow_all(
    http: httpx.AsyncClient, turn_id: str, headers: dict[str, str] | None = None
) -> list[Any]:
    with anyio.fail_after(60):
        async with http.stream("GET", f"/v1/turns/{turn_id}/events", headers=headers) as r:
            assert r.status_code == 200, await r.aread()
            assert r.headers["content-type"].startswith("text/event-stream")
            return [item async for item in sse(r)]
