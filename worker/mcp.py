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

Worker-wide servers: ``async with shared(files=FILES) as servers:`` gives the same, but each named
server is the worker's: the first block in a worker that names it starts it, and later blocks (later
turns in that worker) use the running server. It is a child of the worker that the end-of-turn sweep
spares (TREE-KEPT-CHILDREN), so the ladder and the worker's own end still reach it. A call in flight when
the turn is cancelled gets ``notifications/cancelled``; since no answer tells whether the server
stopped the work, the block's end then closes that server (stdin, SIGTERM, SIGKILL of its group:
the ``mcp`` client's shutdown), holding the turn until it is gone or the ladder ends it; the next
block that names it starts it again.

``held(contexts)``: a framework's own MCP server objects (an OpenAI Agents SDK ``MCPServerStdio``, a
pydantic-ai ``MCPToolset``), entered in a task of their own outside the turn's cancel scope for the
block, so their processes are children of the worker and a cancel's ``notifications/cancelled``
still goes out (the adapters use it: the user starts nothing).

Needs the ``mcp`` package (``pip install 'turnpool[mcp]'``), imported only when a server starts.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from . import _guards
from .agent import Tool
from .proctree import _tree

__all__ = ["McpToolError", "Server", "StdioServer", "held", "serve", "shared", "tools"]

SERVER_MARK = "TURNPOOL_MCP_SERVER"  # in a worker-wide server's environment: how its pid is found


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
        self.abandoned = False  # a call was cancelled in flight (its server got notifications/cancelled)
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
        # ADAPT-MCP-ERROR: a tool that answers with ``isError`` is told to the model as the call's output
        # (what MCP's tool errors are for); ``call()`` itself raises ``McpToolError``.
        async def call(**arguments: Any) -> Any:
            try:
                return await self.call(tool, arguments)
            except McpToolError as exc:
                return {"error": str(exc)}

        return call

    async def call(self, tool: str, arguments: Mapping[str, Any] | None = None) -> Any:
        """Call ``tool``: its structured result if it has one, else its text; ``McpToolError`` if it
        answered with an error."""
        try:
            result = await self.session.call_tool(tool, dict(arguments or {}))
        except anyio.get_cancelled_exc_class():
            self.abandoned = True
            raise
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
    from mcp.client.stdio import stdio_client

    try:
        async with AsyncExitStack() as stack:
            servers: dict[str, Server] = {}
            for name, spec in named.items():
                streams = await stack.enter_async_context(stdio_client(_params(spec)))
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


def _params(spec: StdioServer, mark: str | None = None) -> Any:
    """The ``mcp`` client's parameters for ``spec``. The client passes a server only a few variables
    of the worker's environment: the worker's tree marker is added (a server that outlived a dead
    worker is still found as the worker's), and for a worker-wide server the mark its pid is
    found by."""
    from mcp.client.stdio import StdioServerParameters

    env = dict(spec.env or {})
    tree = os.environ.get(_tree.TREE_ENV)
    if tree is not None:
        env.setdefault(_tree.TREE_ENV, tree)
    if mark is not None:
        env[SERVER_MARK] = mark
    return StdioServerParameters(command=spec.command, args=list(spec.args), env=env, cwd=spec.cwd)


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


# ---- worker-wide servers --------------------------------------------------------------------


class _Kept:
    """One worker-wide server: its owner task, the server once started, and its pid."""

    def __init__(self, name: str, spec: StdioServer) -> None:
        loop = asyncio.get_running_loop()
        self.name, self.spec = name, spec
        self.pid: int | None = None
        self.close = asyncio.Event()
        self.ready: asyncio.Future[Server] = loop.create_future()
        self.owner = loop.create_task(_own_kept(self), name=f"turnpool-mcp-{name}")

    def gone(self) -> bool:
        """The server's process has exited (or was never found)."""
        if self.owner.done():
            return True
        fields = _tree.stat_fields(self.pid) if self.pid is not None else None
        return self.ready.done() and (fields is None or fields[0] == b"Z")

    async def retire(self) -> None:
        """Close the server (the ``mcp`` client's shutdown) and wait for its owner, shielded."""
        self.close.set()
        with anyio.CancelScope(shield=True):
            await asyncio.wait([self.owner])


_KEPT: dict[str, _Kept] = {}  # the worker's servers, by name


def _child_marked(mark: str) -> int | None:
    """The pid of this process's child whose environment holds ``mark``."""
    needle = f"{SERVER_MARK}={mark}".encode()
    for pid in _tree.children(os.getpid()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    return pid
        except OSError:
            continue
    return None


def _waiting_thread(pid: int) -> int | None:
    """The thread asyncio's child watcher runs to wait for ``pid`` (Python 3.11), if any."""
    for thread in threading.enumerate():
        args: tuple[Any, ...] = getattr(thread, "_args", ())
        if thread.name.startswith("asyncio-waitpid-") and len(args) > 1 and args[1] == pid:
            return thread.ident
    return None


async def _own_kept(kept: _Kept) -> None:
    """A worker-wide server's owner: starts it, marks it the worker's (TREE-KEPT-CHILDREN), hands it over,
    and closes it once retired."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import stdio_client

    mark = secrets.token_hex(8)
    try:
        async with AsyncExitStack() as stack:
            streams = await stack.enter_async_context(stdio_client(_params(kept.spec, mark)))
            kept.pid = _child_marked(mark)
            if kept.pid is not None:
                _guards.keep_child(kept.pid, _waiting_thread(kept.pid))
            session = await stack.enter_async_context(ClientSession(*streams))
            await session.initialize()
            listed = await session.list_tools()
            kept.ready.set_result(Server(kept.name, session, listed.tools))
            await kept.close.wait()
    except BaseException as exc:  # noqa: BLE001 - the users of the server see it; the owner ends
        if not kept.ready.done():
            kept.ready.set_exception(_unwrapped(exc))
    finally:
        if _KEPT.get(kept.name) is kept:
            del _KEPT[kept.name]
        if kept.pid is not None:
            _guards.release_child(kept.pid)


# ADAPT-MCP-WORKER: worker-wide servers, started on first use, spared by the sweep, closed after a cancel.
@asynccontextmanager
async def shared(**named: StdioServer) -> AsyncIterator[dict[str, Server]]:
    """The named worker-wide MCP stdio servers for the block, each started on its first use in this
    worker and kept running for later blocks; see the module docstring. A name already running with
    another ``StdioServer`` is refused (``ValueError``)."""
    for name, spec in named.items():
        if not isinstance(spec, StdioServer):
            raise TypeError(
                f"MCP server {name!r} must be a worker.mcp.StdioServer, got {type(spec).__name__}"
            )
        kept = _KEPT.get(name)
        if kept is not None and kept.spec != spec:
            raise ValueError(f"MCP server {name!r} already runs in this worker as {kept.spec}, not {spec}")
    servers: dict[str, Server] = {}
    for name, spec in named.items():
        kept = _KEPT.get(name)
        if kept is not None and kept.gone():
            await kept.retire()
            kept = None
        if kept is None:
            kept = _KEPT[name] = _Kept(name, spec)
        servers[name] = await asyncio.shield(kept.ready)
        servers[name].abandoned = False
    try:
        yield servers
    finally:
        for name, server in servers.items():
            kept = _KEPT.get(name)
            if server.abandoned and kept is not None:
                await kept.retire()  # it may still run the abandoned call: closed, the ladder bounds it


# ADAPT-MCP-FRAMEWORK: a framework's own MCP server objects, entered outside the turn's cancel scope.
@asynccontextmanager
async def held(contexts: Sequence[AbstractAsyncContextManager[Any]]) -> AsyncIterator[None]:
    """Enter ``contexts`` (a framework's MCP server objects) in a task of their own for the block,
    and exit them, in reverse, once it has ended (shielded; the ladder bounds a server that does not
    close). Their sessions' tasks are then outside the turn's cancel scope, so a call the turn's
    cancel abandons still sends its ``notifications/cancelled``."""
    if not contexts:
        yield
        return
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    close = asyncio.Event()

    async def own() -> None:
        try:
            async with AsyncExitStack() as stack:
                for context in contexts:
                    await stack.enter_async_context(context)
                ready.set_result(None)
                await close.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(_unwrapped(exc))
            else:
                raise

    owner = loop.create_task(own())
    try:
        await asyncio.shield(ready)
        yield
    finally:
        close.set()
        with anyio.CancelScope(shield=True):
            await asyncio.wait([owner])
        if not owner.cancelled():
            owner.exception()  # retrieved: a failure to close a server is not the turn's error
