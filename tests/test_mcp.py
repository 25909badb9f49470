"""``worker.mcp`` against a real MCP server written with the ``mcp`` package
(``tests/agents/mcp_server.py``): the server is a child of the worker; its tools are called directly
and offered to ``AgentLoop``; a cancel sends the server ``notifications/cancelled`` for the call in
flight and ends ``aborted`` with the server gone; a server that ignores the cancel, SIGTERM and
stdin EOF ends ``killed`` after the grace, gone with the worker's tree."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio
import psutil
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
        "tools": ["add", "pid", "parent", "slow", "stubborn", "allocate"],
    }, looped
    assert aborted.outcome == "aborted" and aborted.cause == {"kind": "user"}, aborted
    # The server never sees stdin's EOF (NEVER_EOF): only notifications/cancelled cancels the call.
    assert mark.read_text() == "cancelled"
    assert gone(pid)
    assert killed.outcome == "killed" and killed.cause == {"kind": "user"}, killed
    assert gone(stuck_pid)


async def test_worker_wide_servers_outlive_turns_and_are_closed_after_a_cancel(tmp_path: Path) -> None:
    """``mcp.shared``: the first turn naming a worker-wide server starts it as a child of the worker;
    the end-of-turn sweep spares it and the next turn uses the same process. A cancel while its
    ``slow`` runs sends the server ``notifications/cancelled`` (the server never sees stdin's EOF:
    only that cancels the call), ends ``aborted`` (cause ``user``) and closes that server; the next
    turn starts a new one. A turn that ignores its cancel is ``killed`` by the ladder, the
    worker-wide server with the worker."""
    async with Supervisor(workers=1, spares=0, grace=1, kill_after=1) as sup:
        with anyio.fail_after(60):
            first = await sup.run(M + "shared_pid")
            server = psutil.Process(first.output["server"])
            parent = server.ppid()
            second = await sup.run(M + "shared_pid")
        mark = tmp_path / "slow"
        slow = await sup.submit(M + "shared_waits", {"mark": str(mark)}, grace=20)
        in_flight = await server_pid(slow)
        assert await anyio.to_thread.run_sync(wait_for_file, mark) == "started"
        assert await slow.cancel() == {"kind": "user"}
        with anyio.fail_after(60):
            aborted = await slow.result()
            third = await sup.run(M + "shared_pid")
        holds = await sup.submit(M + "shared_holds")
        held_pid = await server_pid(holds)
        await holds.cancel()
        with anyio.fail_after(60):
            killed = await holds.result()
    assert first.outcome == second.outcome == "completed", (first, second)
    assert parent == first.output["worker"] == first.worker_pid  # a child of the worker
    assert second.output == first.output  # the same server, kept across turns
    assert in_flight == first.output["server"]
    assert aborted.outcome == "aborted" and aborted.cause == {"kind": "user"}, aborted
    assert mark.read_text() == "cancelled"  # notifications/cancelled reached the server
    assert gone(in_flight)  # closed after the abandoned call
    assert third.outcome == "completed" and third.output["server"] != in_flight, third
    assert third.worker_pid == first.worker_pid
    assert held_pid == third.output["server"]
    assert killed.outcome == "killed" and killed.cause == {"kind": "user"}, killed
    assert gone(held_pid)


async def test_an_isolated_call_in_an_mcp_servers_tool_is_killed_alone_and_told_to_the_model() -> None:
    """The server's ``allocate`` runs a ``worker.isolated`` call (forked by the server, which is not a
    worker) that writes 2 GiB under 256 MiB: the call is killed for memory, the server answers the tool
    call with the ``ToolKilled`` text as an error, ``AgentLoop`` hands it to the model, the turn
    completes, and the same server answers the next call."""
    async with Supervisor(workers=1, spares=0) as sup:
        handle = await sup.submit(M + "isolated")
        pid = await server_pid(handle)
        with anyio.fail_after(120):
            result = await handle.result()
    assert result.outcome == "completed", result
    assert result.output["text"] == "It did not fit." and result.output["after"] == 3, result
    [told] = result.output["told"]
    assert "tool killed: memory limit 256 MiB reached" in str(told), told
    assert gone(pid)
