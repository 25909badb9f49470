"""A ``pydantic_ai.Agent`` named as a turn's agent runs unchanged in a real worker, on pydantic-ai's
own offline models (``TestModel``, ``FunctionModel``): embedded, through the daemon and in
``turnpool batch``. It streams the common event vocabulary and completes with the framework's
output; a cancel mid-stream ends ``aborted`` (cause ``user``), a sync tool blocked in C ends
``killed`` after the grace with its child process gone, a deadline ends with cause ``deadline``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from supervisor import Client, InvalidAgent, Supervisor
from tests.support.adapterkit import events_of, gone, wait_for_event, wait_for_file
from tests.support.daemonkit import FAST, HTTP, ROOT, serving

pytestmark = pytest.mark.anyio

A = "tests.agents.pydantic_agents:"
PRELOAD = ("tests.agents.pydantic_agents",)  # imported once, in the zygote


async def test_agents_complete_streaming_the_common_vocabulary() -> None:
    """TestModel (tools then text), FunctionModel (thinking, a tool call, streamed text) and a
    structured output: the events are turnpool's vocabulary, the deltas add up to the output, a
    pydantic model output comes back in its JSON form. Unknown input keys and a wrong input type
    end the turn ``failed`` with a one-line error naming what is wrong, an attribute that is no
    agent is refused at submit; a plain callable agent runs as before."""
    async with Supervisor(workers=1, spares=0, preload=PRELOAD) as sup:
        thinker = await sup.submit(A + "thinker", "What is the answer?")
        weather = await sup.submit(A + "weather", {"prompt": "Weather in Paris?"})
        structured = await sup.submit(A + "structured", "Rate Paris")
        with anyio.fail_after(60):
            results = [await h.result() for h in (thinker, weather, structured)]
            unknown = await sup.run(A + "thinker", {"prompt": "q", "temperature": 0})
            wrong = await sup.run(A + "thinker", [1, 2])
            lone_args = await sup.run(A + "thinker", {"prompt": "q", "deps_args": {}})
            with pytest.raises(InvalidAgent) as not_agent:
                await sup.submit(A + "not_an_agent", "q")
            plain = await sup.run("examples.agents:echo", {"text": "hi"})
        seen = [await events_of(h) for h in (thinker, weather, structured)]
    assert [r.outcome for r in results] == ["completed"] * 3, results
    assert results[0].output == "The answer is 42."
    assert seen[0] == [
        {"type": "thought", "text": "let me "},
        {"type": "thought", "text": "check"},
        {"type": "tool_call", "id": "call_1", "title": "lookup", "input": {"key": "answer"}},
        {
            "type": "tool_call_update",
            "id": "call_1",
            "status": "completed",
            "output": {"key": "answer", "value": 42},
        },
        {"type": "delta", "text": "The answer "},
        {"type": "framework", "name": "final_result", "data": {"tool_name": None, "tool_call_id": None}},
        {"type": "delta", "text": "is "},
        {"type": "delta", "text": "42."},
    ]
    assert "".join(e["text"] for e in seen[1] if e["type"] == "delta") == results[1].output
    assert json.loads(results[1].output) == {"forecast": "sunny in a"}
    calls = [e for e in seen[1] if e["type"] == "tool_call"]
    assert [c["title"] for c in calls] == ["forecast"]
    assert {
        "type": "tool_call_update",
        "id": calls[0]["id"],
        "status": "completed",
        "output": "sunny in a",
    } in seen[1]
    assert results[2].output == {"city": "Paris", "score": 7}
    assert unknown.outcome == "failed" and unknown.error is not None
    assert unknown.error.type == "ValueError"
    assert "'temperature'" in unknown.error.message and "'deps'" in unknown.error.message
    assert wrong.outcome == "failed" and wrong.error is not None and wrong.error.type == "TypeError"
    assert "str (the prompt)" in wrong.error.message
    assert lone_args.outcome == "failed" and lone_args.error is not None
    assert "'deps_args' needs 'deps'" in lone_args.error.message
    assert "builtins.dict" in str(not_agent.value) and "pydantic_ai.Agent" in str(not_agent.value)
    assert plain.outcome == "completed" and plain.output == {"text": "hi"}


async def test_cancel_mid_stream_ends_aborted_and_the_worker_serves_on() -> None:
    """A FunctionModel streaming forever, cancelled after its first delta: ``aborted`` with cause
    ``user``, well inside the grace, and the same worker runs the next turn (no kill). Past its
    deadline, the same agent ends with cause ``deadline``."""
    async with Supervisor(workers=1, spares=0, grace=20, preload=PRELOAD) as sup:
        handle = await sup.submit(A + "forever", "go on")
        first = await wait_for_event(handle, "delta")
        assert first["text"].startswith("word")
        t0 = time.monotonic()
        assert await handle.cancel() == {"kind": "user"}
        with anyio.fail_after(60):
            result = await handle.result()
            after = await sup.run(A + "thinker", "again")
            late = await sup.run(A + "forever", "go on", timeout=0.5)
    assert result.outcome == "aborted" and result.cause == {"kind": "user"}, result
    assert late.outcome == "aborted" and late.cause == {"kind": "deadline"}, late
    assert time.monotonic() - t0 < 10
    assert after.outcome == "completed" and after.worker_pid == result.worker_pid


async def test_sync_tool_blocked_in_c_is_killed_after_the_grace_with_nothing_left(tmp_path: Path) -> None:
    """A sync tool (in a thread) that started a child and sleeps in C: the cancel reaches pydantic-ai
    but not the tool, so the turn never reports ``aborted`` while the tool runs; it ends ``killed``
    after the grace, the tool's child is gone, a new worker serves the next turn. The deps come
    from the factory named in the input. An async tool that swallows every cancellation ends
    ``killed`` too."""
    pidfile = tmp_path / "child.pid"
    async with Supervisor(workers=1, spares=0, grace=0.3, kill_after=1.0, preload=PRELOAD) as sup:
        handle = await sup.submit(
            A + "blocker",
            {"prompt": "block", "deps": A + "files", "deps_args": {"pidfile": str(pidfile)}},
        )
        call = await wait_for_event(handle, "tool_call")
        child = int(wait_for_file(pidfile))
        await handle.cancel()
        with anyio.fail_after(60):
            result = await handle.result()
            after = await sup.run(A + "thinker", "again")
        stubborn = await sup.submit(A + "stubborn", "go")
        await wait_for_event(stubborn, "tool_call")
        await stubborn.cancel()
        with anyio.fail_after(60):
            ignored = await stubborn.result()
    assert call["title"] == "block"
    assert result.outcome == "killed" and result.cause == {"kind": "user"}, result
    assert gone(child)
    assert after.outcome == "completed" and after.worker_pid != result.worker_pid
    # An async tool that swallows every cancellation: the run never unwinds, the ladder ends it.
    assert ignored.outcome == "killed" and ignored.cause == {"kind": "user"}, ignored


async def test_through_the_daemon_and_over_http() -> None:
    """The same agents through ``turnpool serve``: a ``Client`` gets the streamed events and the
    output, and a cancel mid-stream ends ``aborted`` with cause ``user``; over HTTP, a submit's
    Server-Sent Events carry the same vocabulary and the result its output."""
    from tests.support.httpkit import client as http_client
    from tests.support.httpkit import follow_all
    from tests.support.httpkit import result as http_result
    from tests.support.httpkit import submit as http_submit

    with serving(*FAST, *HTTP) as d:
        async with Client.connect(d.endpoint) as client:
            handle = await client.submit(A + "thinker", "What is the answer?")
            with anyio.fail_after(60):
                result = await handle.result()
            seen = await events_of(handle)
            endless = await client.submit(A + "forever", "go on")
            await wait_for_event(endless, "delta")
            await endless.cancel()
            with anyio.fail_after(60):
                aborted = await endless.result()
        async with http_client(d) as http:
            turn_id = await http_submit(http, A + "thinker", {"prompt": "What is the answer?"})
            streamed = await follow_all(http, turn_id)
            over_http = await http_result(http, turn_id)
    assert result.outcome == "completed" and result.output == "The answer is 42."
    assert "".join(e["text"] for e in seen if e["type"] == "delta") == "The answer is 42."
    assert [e["type"] for e in seen].count("tool_call") == 1
    assert aborted.outcome == "aborted" and aborted.cause == {"kind": "user"}
    data = [item[2] for item in streamed if item[0] == "event"]
    assert data == seen, streamed
    assert over_http["outcome"] == "completed" and over_http["output"] == "The answer is 42."


def test_in_a_batch(tmp_path: Path) -> None:
    """``turnpool batch``: a pydantic-ai job completes with its output, one past its deadline ends
    with cause ``deadline``, a bad input fails: one final line each."""
    jobs = tmp_path / "jobs.jsonl"
    out = tmp_path / "out.jsonl"
    jobs.write_text(
        "\n".join(
            json.dumps(j)
            for j in [
                {"id": "ok", "agent": A + "structured", "input": "Rate Paris"},
                {"id": "late", "agent": A + "forever", "input": "go on", "timeout": 0.5},
                {"id": "bad", "agent": A + "thinker", "input": {"prompt": "q", "nope": 1}},
            ]
        )
        + "\n"
    )
    argv = [sys.executable, "-P", "-c", "from supervisor.cli.main import entry; entry()", "batch"]
    argv += [str(jobs), "-o", str(out), "--workers", "2", "--path", ROOT, "--grace", "1", "--kill-after", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 1, proc.stderr
    lines = {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines()) if rec["final"]}
    assert lines["ok"]["outcome"] == "completed" and lines["ok"]["output"] == {"city": "Paris", "score": 7}
    assert lines["late"]["outcome"] in ("aborted", "killed") and lines["late"]["cause"] == {
        "kind": "deadline"
    }
    assert lines["bad"]["outcome"] == "failed" and "'nope'" in lines["bad"]["error"]["message"]


async def test_in_an_editor_through_acp(tmp_path: Path) -> None:
    """``turnpool acp --agent`` naming the pydantic-ai agent: the editor's prompt is the run's
    prompt, tokens arrive as message chunks and the tool call as a tool call, answered
    ``end_turn``; a cancel mid-stream answers ``cancelled``."""
    from acp import text_block
    from acp.schema import ToolCallProgress, ToolCallStart

    from tests.test_acp import ONE, acp_agent

    async with acp_agent(tmp_path, A + "thinker", *ONE) as (conn, rec, sid, _):
        with anyio.fail_after(60):
            answer = await conn.prompt(session_id=sid, prompt=[text_block("What is the answer?")])
    assert answer.stop_reason == "end_turn" and rec.text() == "The answer is 42."
    assert [(u.tool_call_id, u.title) for u in rec.updates if isinstance(u, ToolCallStart)] == [
        ("call_1", "lookup")
    ]
    assert [(u.tool_call_id, u.status) for u in rec.updates if isinstance(u, ToolCallProgress)] == [
        ("call_1", "completed")
    ]
