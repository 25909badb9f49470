"""``worker.mcp`` against a real MCP server written with the ``mcp`` package
(``tests/agents/mcp_server.py``): the server is a child of the worker; its tools are called directly
and offered to ``AgentLoop``; a cancel sends the server ``notifications/cancelled`` for the call in
flight and ends ``aborted`` with the server gone; a server that ignores the cancel, SIGTERM and
stdin EOF ends ``killed`` after the grace, gone with the worker's tree."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from supervisor import Supervisor, TurnHandle
from tests.support.adapterkit import gone, wait_for_file

pytestmark = pytest.mark.anyio

pytest.importorskip("mcp", reason="the mcp extra is not installed")

M = "tests.agents.mcp_agents:"


async def server_pid(handle: TurnHandle) -> int:
    with anyio.fail_after(60):
        async with aclosing(handle.events()) as events:
            async for event in events:
                if event["type"] == "mcp_server":
                    return int(event["pid"])
    raise AssertionError(f"the turn ended before its server said its pid: {await handle.result()}")


async def test_mcp_servers_are_children_of_the_turn(tmp_path: Path) -> None:
    """(One supervisor for all.) A tool call returns the server's result; ``AgentLoop`` calls the
    server's tool it was offered and finishes; a cancel while ``slow`` runs reaches the server as
    ``notifications/cancelled`` (the tool saw its cancel) and ends ``aborted`` (cause ``user``) with
    the server gone; a server whose tool blocks in C and that ignores SIGTERM and stdin EOF ends
    ``killed`` after the grace, gone too."""
    async with Supervisor(workers=1, spares=0, grace=1, kill_after=1) as sup:
        with anyio.fail_after(60):
            added = await sup.run(M + "add")
            looped = await sup.run(M + "loop")
        mark = tmp_path / "slow"
        slow = await sup.submit(M + "waits", {"tool": "slow", "mark": str(mark)}, grace=20)
        pid = await server_pid(slow)
        assert await anyio.to_thread.run_sync(wait_for_file, mark) == "started"  # the call is in flight
        assert await slow.cancel() == {"kind": "user"}
        with anyio.fail_after(60):
            aborted = await slow.result()
        stuck_mark = tmp_path / "stubborn"
        stuck = await sup.submit(M + "waits", {"tool": "stubborn", "mark": str(stuck_mark)})
        stuck_pid = await server_pid(stuck)
        assert await anyio.to_thread.run_sync(wait_for_file, stuck_mark) == "started"
        await stuck.cancel()
        with anyio.fail_after(60):
            killed = await stuck.result()
    assert added.outcome == "completed" and added.output == 5, added
    assert looped.outcome == "completed" and looped.output == {
        "text": "The sum is 42.",
        "tools": ["add", "pid", "slow", "stubborn"],
    }, looped
    assert aborted.outcome == "aborted" and aborted.cause == {"kind": "user"}, aborted
    # The server never sees stdin's EOF (NEVER_EOF): only notifications/cancelled cancels the call.
    assert mark.read_text() == "cancelled"
    assert gone(pid)
    assert killed.outcome == "killed" and killed.cause == {"kind": "user"}, killed
    assert gone(stuck_pid)
