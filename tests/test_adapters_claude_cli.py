"""Claude Agent SDK options run by the real ``claude`` CLI (the binary the SDK's wheel bundles),
pointed at a loopback Messages-API stand-in through ``ANTHROPIC_BASE_URL``
(``tests/support/anthropic_server.py``): no model service, no other network. The session streams
the model's tokens as deltas and completes with the CLI's result; a cancel mid-stream reaches the
CLI as the SDK's ``interrupt()`` and ends ``aborted`` (cause ``user``) with the CLI and everything
it started gone. The stand-in CLI (``tests/test_adapters_claude.py``) covers the hostile cases."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import psutil
import pytest

from supervisor import Supervisor
from tests.support.adapterkit import events_of, gone, wait_for_event
from tests.support.anthropic_server import FakeAnthropicServer

pytestmark = pytest.mark.anyio

sdk = pytest.importorskip("claude_agent_sdk", reason="the claude extra is not installed")
CLI = Path(sdk.__file__).parent / "_bundled" / "claude"
if not CLI.exists():
    pytest.skip("this claude-agent-sdk wheel bundles no claude CLI", allow_module_level=True)

A = "tests.agents.claude_real:assistant"


@asynccontextmanager
async def messages_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeAnthropicServer]:
    server = FakeAnthropicServer()
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        monkeypatch.setenv("TURNPOOL_TEST_ANTHROPIC_URL", server.base_url)
        monkeypatch.setenv("TURNPOOL_TEST_CLAUDE_HOME", str(tmp_path))
        yield server
        tg.cancel_scope.cancel()


def real_clis(workers: list[int]) -> list[psutil.Process]:
    """The running processes of the bundled CLI below ``workers`` (not another test's, running at once)."""
    found = []
    for pid in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            found += psutil.Process(pid).children(recursive=True)
    return [p for p in found if _is_cli(p)]


def _is_cli(p: psutil.Process) -> bool:
    try:
        return p.exe() == str(CLI) and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def test_the_real_claude_cli_streams_completes_and_is_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        messages_api(tmp_path, monkeypatch) as server,
        Supervisor(workers=1, spares=0, grace=10, kill_after=1) as sup,
    ):
        hello = await sup.submit(A, "hello there")
        with anyio.fail_after(120):
            result = await hello.result()
        seen = await events_of(hello)
        endless = await sup.submit(A, "tell me a story forever")
        first = await wait_for_event(endless, "delta")
        clis = [p.pid for p in real_clis([w["pid"] for w in (await sup.status())["workers"]])]
        assert await endless.cancel() == {"kind": "user"}
        with anyio.fail_after(60):
            aborted = await endless.result()
        left = [pid for pid in clis if not gone(pid)]
    assert result.outcome == "completed" and result.output == "Hello from Claude.", result
    assert "".join(e["text"] for e in seen if e["type"] == "delta") == "Hello from Claude."
    assert any(e["type"] == "framework" and e["name"] == "system.init" for e in seen)
    assert server.requests >= 2
    assert first == {"type": "delta", "text": "Once "}
    assert clis, "the real CLI was not running during the turn"
    assert aborted.outcome == "aborted" and aborted.cause == {"kind": "user"}, aborted
    assert left == []


async def test_an_isolated_call_in_an_sdk_tool_is_killed_alone_and_told_to_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI calls an in-process SDK tool (it runs in the worker) whose ``worker.isolated`` call
    writes 2 GiB under 256 MiB: the call is killed for memory, the SDK hands the ``ToolKilled`` text to
    the CLI as the tool's error, the model answers with it, and the turn completes; the worker runs the
    next turn."""
    async with (
        messages_api(tmp_path, monkeypatch) as server,
        Supervisor(workers=1, spares=0, grace=10, kill_after=1) as sup,
    ):
        handle = await sup.submit("tests.agents.claude_real:isolated", "allocate, isolated")
        with anyio.fail_after(120):
            result = await handle.result()
            seen = await events_of(handle)
            again = await sup.run(A, "hello there")
    assert result.outcome == "completed", result
    # (The CLI adds a hint of its own after a failed MCP tool's text.)
    assert result.output.startswith("told: tool killed: memory limit 256 MiB reached"), result
    updates = [e for e in seen if e["type"] == "tool_call_update"]
    assert [u["status"] for u in updates] == ["failed"], seen
    assert server.requests >= 2
    assert again.outcome == "completed" and again.worker_pid == result.worker_pid, again
