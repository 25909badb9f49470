"""``worker.mcp``: MCP stdio servers as children of the worker, their tools offered to the agent loop.

``async with serve(files=StdioServer("python", ["-m", "myapp.files_server"])) as servers:`` starts
each named server for the block (a turn: the agent's own servers), as a child process of the worker,
so it is inside the turn's process tree and the ladder reaches it and whatever it starts; it
initialises an MCP client session with each and lists their tools. ``tools(servers)`` gives them as
``worker.agent.Tool`` objects for ``AgentLoop``; ``servers["files"].call(tool, arguments)`` calls one.

Cancel: a call in flight when the turn is cancelled is abandoned by the MCP client, which sends the
server ``notifications/cancelled`` for it; leaving the block closes each server's stdin and waits
for it to exit (the ``mcp`` package's stdio client, then SIGTERM). A server that ignores all of it
holds the turn until the ladder kills the worker's tree, the server with it (``killed``).

Needs the ``mcp`` package (``pip install 'turnpool[mcp]'``), imported only when a server starts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from .agent import Tool

__all__ = ["McpToolError", "Server", "StdioServer", "serve", "tools"]


class McpToolError(RuntimeError):
    """An MCP tool answered with ``isError``: its text is the message."""


@dataclass(frozen=True)
class StdioServer:
    """How to start an MCP server that speaks over its stdin and stdout."""

    command: str
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None  # merged over the MCP client's default environment
    cwd: str | None = None


class Server:
    """A running MCP server of the block: its client session and its tools."""

    def __init__(self, name: str, session: Any, listed: Sequence[Any]) -> None:
        self.name = name
        self.session = session
        self.tools = [
            Tool(
                name=t.name,
                fn=self._caller(t.name),
                description=t.description or "",
                parameters=dict(getattr(t, "input_schema", None) or {"type": "object", "properties": {}}),
            )
            for t in listed
        ]

    def _caller(self, tool: str) -> Any:
        async def call(**arguments: Any) -> Any:
            return await self.call(tool, arguments)

        return call

    async def call(self, tool: str, arguments: Mapping[str, Any] | None = None) -> Any:
        """Call ``tool``: its structured result if it has one, else its text; ``McpToolError`` if it
        answered with an error."""
        result = await self.session.call_tool(tool, dict(arguments or {}))
        text = "".join(getattr(block, "text", "") for block in result.content or ())
        if result.is_error:
            raise McpToolError(text or f"MCP tool {tool!r} of server {self.name!r} failed")
        structured = result.structured_content
        if isinstance(structured, dict) and structured.keys() == {"result"}:
            return structured["result"]
        if structured is not None:
            return json.loads(json.dumps(structured, default=str))
        return text


@asynccontextmanager
async def serve(**named: StdioServer) -> AsyncIterator[dict[str, Server]]:
    """ADAPT-MCP: start the named MCP stdio servers as children of this worker for the block; yields them.

    The servers' client sessions live in a task of their own, outside the turn's cancel scope: a
    turn's cancel abandons the calls in flight, whose ``notifications/cancelled`` then still reach
    the servers, and the block's end closes them gracefully (shielded; the ladder bounds it)."""
    for name, spec in named.items():
        if not isinstance(spec, StdioServer):
            raise TypeError(
                f"MCP server {name!r} must be a worker.mcp.StdioServer, got {type(spec).__name__}"
            )
    ready: asyncio.Future[dict[str, Server]] = asyncio.get_running_loop().create_future()
    close = asyncio.Event()
    owner = asyncio.get_running_loop().create_task(_own(named, ready, close))
    try:
        servers = await asyncio.shield(ready)
        yield servers
    finally:
        close.set()
        with anyio.CancelScope(shield=True):
            await asyncio.wait([owner])
        if not owner.cancelled():
            owner.exception()  # retrieved: a failure to close a server is not the block's error


async def _own(
    named: Mapping[str, StdioServer], ready: asyncio.Future[dict[str, Server]], close: asyncio.Event
) -> None:
    """The servers' owner: starts them, hands them over, and closes them once the block has ended."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    try:
        async with AsyncExitStack() as stack:
            servers: dict[str, Server] = {}
            for name, spec in named.items():
                env = dict(spec.env) if spec.env else None
                params = StdioServerParameters(
                    command=spec.command, args=list(spec.args), env=env, cwd=spec.cwd
                )
                streams = await stack.enter_async_context(stdio_client(params))
                session = await stack.enter_async_context(ClientSession(*streams))
                await session.initialize()
                listed = await session.list_tools()
                servers[name] = Server(name, session, listed.tools)
            ready.set_result(servers)
            await close.wait()
    except BaseException as exc:
        if not ready.done():
            ready.set_exception(_unwrapped(exc))
        else:
            raise


def _unwrapped(exc: BaseException) -> BaseException:
    """What the MCP client's task groups wrapped (one exception), as raised."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def tools(servers: Mapping[str, Server]) -> list[Tool]:
    """Every server's tools, for ``AgentLoop(tools=...)``; a name two servers share is prefixed
    with its server's name (``server__tool``)."""
    counts: dict[str, int] = {}
    for server in servers.values():
        for t in server.tools:
            counts[t.name] = counts.get(t.name, 0) + 1
    out = []
    for server in servers.values():
        for t in server.tools:
            if counts[t.name] > 1:
                t = Tool(
                    name=f"{server.name}__{t.name}",
                    fn=t.fn,
                    description=t.description,
                    parameters=t.parameters,
                )
            out.append(t)
    return out
