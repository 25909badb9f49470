"""The hostile cases native turns get, for each framework's object (parametrised): a tool that
leaves a setsid daemon behind and returns, and a tool (LangGraph: a node) that swallows every
cancellation. The first turn completes, and by the time its result is in, the daemon (re-parented
to the worker) is gone: the end-of-turn sweep. The second, cancelled, never reports ``aborted``
while the tool runs on: it ends ``killed`` (cause ``user``) after the grace and a new worker serves
the next turn. (Claude Agent SDK: the tool runs in the CLI, the stand-in's ``Bash``; a CLI that
ignores every cancel is ``tests/test_adapters_claude.py``'s.) Cancel mid-stream, a tool blocked in
C and a deadline are in each framework's own test file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import pytest

from supervisor import Supervisor
from tests.support.adapterkit import gone, wait_for_event, wait_for_file
from tests.support.agents_server import agents_server

pytestmark = pytest.mark.anyio

URL_VAR = "TURNPOOL_TEST_OPENAI_URL"

# framework: (agent that leaves a daemon (its input: the pid file), agent that ignores a cancel,
# its input, the event it shows once the tool runs)
CASES = {
    "pydantic-ai": (
        "tests.agents.pydantic_agents:daemonizer",
        "tests.agents.pydantic_agents:stubborn",
        "go",
        "tool_call",
    ),
    "langgraph": (
        "tests.agents.langgraph_agents:daemonizer",
        "tests.agents.langgraph_agents:stubborn",
        {"n": 0},
        "framework",
    ),
    "openai-agents": (
        "tests.agents.openai_agents_agents:assistant",
        "tests.agents.openai_agents_agents:assistant",
        "stubborn MARK",  # the tool writes "started" to MARK once it runs
        "tool_call",
    ),
    "claude": ("tests.agents.claude_agents:assistant", None, None, None),
}


@asynccontextmanager
async def model_server(framework: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """The OpenAI Agents SDK's loopback model server, for that framework only."""
    if framework != "openai-agents":
        yield
        return
    server = agents_server()
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        monkeypatch.setenv(URL_VAR, server.base_url)
        yield
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("framework", list(CASES))
async def test_a_setsid_daemon_and_a_tool_ignoring_cancel(
    framework: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if framework == "claude":
        pytest.importorskip("claude_agent_sdk", reason="the claude extra is not installed")
    leaves, ignores, stubborn_input, running = CASES[framework]
    pidfile = tmp_path / "daemon.pid"
    daemon_input = str(pidfile) if framework != "langgraph" else {"pidfile": str(pidfile)}
    if framework in ("openai-agents", "claude"):
        daemon_input = f"daemon {pidfile}"
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(model_server(framework, monkeypatch))
        sup = await stack.enter_async_context(Supervisor(workers=1, spares=0, grace=0.3, kill_after=1.0))
        with anyio.fail_after(60):
            done = await sup.run(leaves, daemon_input)
        daemon = int(pidfile.read_text())
        daemon_gone = gone(daemon)  # looked at before anything else ends: the turn's own sweep
        if ignores is None:
            return _check_daemon(done, daemon_gone, framework)
        mark = tmp_path / "started"
        if stubborn_input == "stubborn MARK":
            stubborn_input = f"stubborn {mark}"
        handle = await sup.submit(ignores, stubborn_input)
        await wait_for_event(handle, str(running))
        if mark.name in str(stubborn_input):
            assert await anyio.to_thread.run_sync(wait_for_file, mark) == "started"  # the tool runs
        await handle.cancel()
        with anyio.fail_after(60):
            killed = await handle.result()
            fresh = await sup.run(leaves, daemon_input)
    _check_daemon(done, daemon_gone, framework)
    assert killed.outcome == "killed" and killed.cause == {"kind": "user"}, killed
    assert killed.worker_pid is not None and gone(killed.worker_pid)  # its worker, and all of its tree
    assert fresh.outcome == "completed" and fresh.worker_pid != killed.worker_pid


def _check_daemon(done: object, daemon_gone: bool, framework: str) -> None:
    assert getattr(done, "outcome", None) == "completed", done
    if framework != "langgraph":
        assert getattr(done, "output", None) == "done", done
    assert daemon_gone
