"""An OpenAI Agents SDK ``agents.Agent`` named as a turn's agent runs unchanged in a real worker,
its model the SDK's own ``OpenAIChatCompletionsModel`` against a loopback streaming Chat
Completions server started by each test: embedded, through the daemon and in ``turnpool batch``.
Its stream becomes the common event vocabulary and the output is ``final_output``; a cancel
mid-stream ends ``aborted`` (cause ``user``), a sync tool blocked in C ends ``killed`` after the
grace with its child process gone, a deadline ends with cause ``deadline``."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from supervisor import Client, Supervisor
from tests.support.adapterkit import events_of, gone, wait_for_event, wait_for_file
from tests.support.agents_server import agents_server
from tests.support.daemonkit import FAST, HTTP, ROOT, serving
from tests.support.openai_server import FakeOpenAIServer

pytestmark = pytest.mark.anyio

A = "tests.agents.openai_agents_agents:assistant"
PRELOAD = ("tests.agents.openai_agents_agents",)  # imported once, in the zygote
URL_VAR = "TURNPOOL_TEST_OPENAI_URL"


@asynccontextmanager
async def model_server() -> AsyncIterator[FakeOpenAIServer]:
    server = agents_server()
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        yield server
        tg.cancel_scope.cancel()


async def test_agent_completes_streaming_the_common_vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool-calling run: the tool call and its output (the run's context from the input reaches
    the tool), the answer's tokens as deltas adding up to ``final_output``; unknown keys are
    refused."""
    async with model_server() as server:
        monkeypatch.setenv(URL_VAR, server.base_url)
        async with Supervisor(workers=1, spares=0, preload=PRELOAD) as sup:
            handle = await sup.submit(A, {"prompt": "tool", "context": {"user": 7}})
            with anyio.fail_after(60):
                result = await handle.result()
                plain = await sup.run(A, "hi")
                unknown = await sup.run(A, {"prompt": "hi", "temperature": 0})
            seen = await events_of(handle)
    assert result.outcome == "completed" and result.output == "The answer is 42.", result
    assert seen == [
        {"type": "framework", "name": "agent_updated", "data": {"agent": "assistant"}},
        {"type": "tool_call", "id": "call_lookup", "title": "lookup", "input": {"key": "answer"}},
        {
            "type": "tool_call_update",
            "id": "call_lookup",
            "status": "completed",
            "output": {"key": "answer", "value": 42, "context": {"user": 7}},
        },
        {"type": "delta", "text": "The answer "},
        {"type": "delta", "text": "is 42."},
    ]
    assert plain.outcome == "completed" and plain.output == "Hello there."
    assert unknown.outcome == "failed" and unknown.error is not None
    assert unknown.error.type == "ValueError" and "'temperature'" in unknown.error.message
    assert "'context'" in unknown.error.message


async def test_cancel_deadline_and_a_blocked_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(One supervisor for the three: importing the SDK costs seconds per worker here.)

    A model stream that never ends, cancelled after its first delta: the run's own cancel and the
    turn's scope stop it, ``aborted`` with cause ``user`` well inside the grace, the HTTP stream is
    closed, the same worker runs the next turn. Past its deadline it ends with cause ``deadline``.
    A sync function tool (in a thread) that started a child and sleeps in C: the run's cancel does
    not reach it, so the turn never reports ``aborted`` while it runs; it ends ``killed`` after the
    grace, the tool's child is gone, a new worker serves the next turn."""
    pidfile = tmp_path / "child.pid"
    async with model_server() as server:
        monkeypatch.setenv(URL_VAR, server.base_url)
        async with Supervisor(workers=1, spares=0, grace=20, preload=PRELOAD) as sup:
            handle = await sup.submit(A, "forever")
            first = await wait_for_event(handle, "delta")
            t0 = time.monotonic()
            assert await handle.cancel() == {"kind": "user"}
            with anyio.fail_after(60):
                result = await handle.result()
                await server.disconnected.wait()
                after = await sup.run(A, "hi")
                late = await sup.run(A, "forever", timeout=0.5)
            elapsed = time.monotonic() - t0

            blocked = await sup.submit(
                A, {"prompt": "block", "context": {"pidfile": str(pidfile)}}, grace=0.3, kill_after=1.0
            )
            call = await wait_for_event(blocked, "tool_call")
            child = int(await anyio.to_thread.run_sync(wait_for_file, pidfile))
            await blocked.cancel()
            with anyio.fail_after(60):
                killed = await blocked.result()
                fresh = await sup.run(A, "hi")
    assert first == {"type": "delta", "text": "Once "}
    assert result.outcome == "aborted" and result.cause == {"kind": "user"}, result
    assert elapsed < 10
    assert after.outcome == "completed" and after.worker_pid == result.worker_pid
    assert late.outcome == "aborted" and late.cause == {"kind": "deadline"}, late
    assert call["title"] == "block"
    assert killed.outcome == "killed" and killed.cause == {"kind": "user"}, killed
    assert gone(child)
    assert fresh.outcome == "completed" and fresh.worker_pid != killed.worker_pid


async def test_through_the_daemon_and_over_http() -> None:
    """The same agent through ``turnpool serve``: a ``Client`` gets the streamed events and the
    output, a cancel mid-stream ends ``aborted`` with cause ``user``; over HTTP a submit's
    Server-Sent Events carry the same vocabulary and the result its output."""
    from tests.support.httpkit import client as http_client
    from tests.support.httpkit import follow_all
    from tests.support.httpkit import result as http_result
    from tests.support.httpkit import submit as http_submit

    async with model_server() as server:
        with serving(*FAST, *HTTP, "--workers", "1", env_extra={URL_VAR: server.base_url}) as d:
            async with Client.connect(d.endpoint) as client:
                handle = await client.submit(A, "tool")
                with anyio.fail_after(60):
                    result = await handle.result()
                seen = await events_of(handle)
                endless = await client.submit(A, "forever")
                await wait_for_event(endless, "delta")
                await endless.cancel()
                with anyio.fail_after(60):
                    aborted = await endless.result()
            async with http_client(d) as http:
                turn_id = await http_submit(http, A, {"prompt": "tool", "context": {"user": 7}})
                streamed = await follow_all(http, turn_id)
                over_http = await http_result(http, turn_id)
    assert result.outcome == "completed" and result.output == "The answer is 42."
    assert "".join(e["text"] for e in seen if e["type"] == "delta") == "The answer is 42."
    assert [e["type"] for e in seen].count("tool_call") == 1
    assert aborted.outcome == "aborted" and aborted.cause == {"kind": "user"}
    data = [item[2] for item in streamed if item[0] == "event"]
    assert [e["type"] for e in data] == [e["type"] for e in seen], streamed
    assert "".join(e["text"] for e in data if e["type"] == "delta") == "The answer is 42."
    assert over_http["outcome"] == "completed" and over_http["output"] == "The answer is 42."


async def test_in_a_batch(tmp_path: Path) -> None:
    """``turnpool batch``: a job completes with the agent's output, one past its deadline ends
    with cause ``deadline``, a bad input fails: one final line each."""
    jobs = tmp_path / "jobs.jsonl"
    out = tmp_path / "out.jsonl"
    jobs.write_text(
        "\n".join(
            json.dumps(j)
            for j in [
                {"id": "ok", "agent": A, "input": "tool"},
                {"id": "late", "agent": A, "input": "forever", "timeout": 0.5},
                {"id": "bad", "agent": A, "input": {"prompt": "q", "nope": 1}},
            ]
        )
        + "\n"
    )
    argv = [sys.executable, "-P", "-c", "from supervisor.cli.main import entry; entry()", "batch"]
    argv += [str(jobs), "-o", str(out), "--workers", "1", "--path", ROOT, "--grace", "1", "--kill-after", "1"]
    async with model_server() as server:
        with anyio.fail_after(120):
            proc = await anyio.run_process(argv, check=False, env={**os.environ, URL_VAR: server.base_url})
    assert proc.returncode == 1, proc.stderr
    lines = {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines()) if rec["final"]}
    assert lines["ok"]["outcome"] == "completed" and lines["ok"]["output"] == "The answer is 42."
    assert lines["late"]["outcome"] in ("aborted", "killed") and lines["late"]["cause"] == {
        "kind": "deadline"
    }
    assert lines["bad"]["outcome"] == "failed" and "'nope'" in lines["bad"]["error"]["message"]


async def test_in_an_editor_through_acp(tmp_path: Path) -> None:
    """``turnpool acp --agent`` naming the agent: the editor's prompt is the run's input, tokens
    arrive as message chunks and the tool call as a tool call, answered ``end_turn``; a
    ``session/cancel`` mid-stream answers ``cancelled``."""
    from acp import text_block
    from acp.schema import AgentMessageChunk, ToolCallProgress, ToolCallStart

    from tests.test_acp import ONE, acp_agent

    async with model_server() as server:
        env = {URL_VAR: server.base_url}
        async with acp_agent(tmp_path, A, *ONE, env=env) as (conn, rec, sid, _):
            with anyio.fail_after(60):
                answer = await conn.prompt(session_id=sid, prompt=[text_block("tool")])
            text = rec.text()
            async with anyio.create_task_group() as tg:
                replies = []

                async def ask() -> None:
                    replies.append(await conn.prompt(session_id=sid, prompt=[text_block("forever")]))

                tg.start_soon(ask)
                with anyio.fail_after(60):
                    await rec.wait_for(
                        lambda u: isinstance(u, AgentMessageChunk) and u.content.text == "Once "
                    )
                    await conn.cancel(session_id=sid)
    assert answer.stop_reason == "end_turn" and text == "The answer is 42."
    assert [(u.tool_call_id, u.title) for u in rec.updates if isinstance(u, ToolCallStart)] == [
        ("call_lookup", "lookup")
    ]
    assert [(u.tool_call_id, u.status) for u in rec.updates if isinstance(u, ToolCallProgress)] == [
        ("call_lookup", "completed")
    ]
    assert replies[0].stop_reason == "cancelled", replies
