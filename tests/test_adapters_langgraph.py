"""A compiled LangGraph graph named as a turn's agent runs unchanged in a real worker, its model
streamed offline by langchain_core's ``GenericFakeChatModel``: embedded, through the daemon and in
``turnpool batch``. Its ``messages``/``updates``/``custom`` streams become the common event
vocabulary and the output is the final state with messages as dicts; a cancel mid-stream ends
``aborted`` (cause ``user``), a sync node blocked in C ends ``killed`` after the grace with its
child process gone, a deadline ends with cause ``deadline``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from supervisor import Client, Supervisor
from tests.support.adapterkit import events_of, gone, wait_for_event, wait_for_file
from tests.support.daemonkit import FAST, HTTP, ROOT, serving

pytestmark = pytest.mark.anyio

A = "tests.agents.langgraph_agents:"
PRELOAD = ("tests.agents.langgraph_agents",)  # imported once, in the zygote


async def test_graph_completes_streaming_the_common_vocabulary() -> None:
    """A tool-calling graph: tokens as deltas, the tool call and its result from the node updates,
    each node update and custom write as a ``framework`` event; the output is the final state,
    messages as dicts. A config with a ``thread_id`` reaches the graph's checkpointer; unknown keys
    next to ``prompt``/``input`` are refused."""
    async with Supervisor(workers=1, spares=0, preload=PRELOAD) as sup:
        handle = await sup.submit(A + "chat", "What is the answer?")
        with anyio.fail_after(60):
            result = await handle.result()
            thread = {"configurable": {"thread_id": "t1"}}
            first = await sup.run(A + "counter", {"input": {"n": 5}, "config": thread})
            again = await sup.run(A + "counter", {"input": None, "config": thread})
            other = await sup.run(A + "plus_one", {"n": 0})
            unknown = await sup.run(A + "chat", {"prompt": "q", "thread_id": "t1"})
        seen = await events_of(handle)
    assert result.outcome == "completed", result
    messages = result.output["messages"]
    assert [(m["type"], m["content"]) for m in messages] == [
        ("human", "What is the answer?"),
        ("ai", "Let me check."),
        ("tool", '{"key": "answer", "value": 42}'),
        ("ai", "The answer is 42."),
    ]
    text = "".join(e["text"] for e in seen if e["type"] == "delta")
    assert text == "Let me check.The answer is 42."
    assert [e for e in seen if e["type"] == "tool_call"] == [
        {"type": "tool_call", "id": "call_1", "title": "lookup", "input": {"key": "answer"}}
    ]
    assert [e for e in seen if e["type"] == "tool_call_update"] == [
        {"type": "tool_call_update", "id": "call_1", "status": "completed", "output": messages[2]["content"]}
    ]
    custom = [e["data"] for e in seen if e["type"] == "framework" and e["name"] == "custom"]
    assert custom == [{"step": "plan"}, {"step": "answer"}]
    nodes = [e["data"]["node"] for e in seen if e["type"] == "framework" and e["name"] == "update"]
    assert nodes == ["agent", "tools", "agent"]
    assert (first.output, again.output, other.output) == ({"n": 6}, {"n": 6}, {"n": 1})
    assert unknown.outcome == "failed" and unknown.error is not None
    assert unknown.error.type == "ValueError" and "'thread_id'" in unknown.error.message


async def test_cancel_mid_stream_ends_aborted_and_the_worker_serves_on() -> None:
    """A node streaming custom events forever, cancelled after its first: ``aborted`` with cause
    ``user`` well inside the grace, the same worker runs the next turn; past its deadline the same
    graph ends with cause ``deadline``."""
    async with Supervisor(workers=1, spares=0, grace=20, preload=PRELOAD) as sup:
        handle = await sup.submit(A + "forever", {"n": 0})
        first = await wait_for_event(handle, "framework")
        t0 = time.monotonic()
        assert await handle.cancel() == {"kind": "user"}
        with anyio.fail_after(60):
            result = await handle.result()
            after = await sup.run(A + "plus_one", {"n": 1})
            late = await sup.run(A + "forever", {"n": 0}, timeout=0.5)
    assert first == {"type": "framework", "name": "custom", "data": {"tick": 1}}
    assert result.outcome == "aborted" and result.cause == {"kind": "user"}, result
    assert time.monotonic() - t0 < 10
    assert after.outcome == "completed" and after.worker_pid == result.worker_pid
    assert late.outcome == "aborted" and late.cause == {"kind": "deadline"}, late


async def test_sync_node_blocked_in_c_is_killed_after_the_grace_with_nothing_left(tmp_path: Path) -> None:
    """A sync node (in a thread) that started a child and sleeps in C: the cancel ends ``astream``
    but not the node, so the turn never reports ``aborted`` while it runs; it ends ``killed`` after
    the grace, the node's child is gone, a new worker serves the next turn."""
    pidfile = tmp_path / "child.pid"
    async with Supervisor(workers=1, spares=0, grace=0.3, kill_after=1.0, preload=PRELOAD) as sup:
        handle = await sup.submit(A + "blocker", {"pidfile": str(pidfile)})
        child = int(wait_for_file(pidfile))
        await handle.cancel()
        with anyio.fail_after(60):
            result = await handle.result()
            after = await sup.run(A + "plus_one", {"n": 1})
    assert result.outcome == "killed" and result.cause == {"kind": "user"}, result
    assert gone(child)
    assert after.outcome == "completed" and after.worker_pid != result.worker_pid


async def test_through_the_daemon_and_over_http() -> None:
    """The same graphs through ``turnpool serve``: a ``Client`` gets the streamed events and the
    final state, a cancel mid-stream ends ``aborted`` with cause ``user``; over HTTP a submit's
    Server-Sent Events carry the same vocabulary and the result the final state."""
    from tests.support.httpkit import client as http_client
    from tests.support.httpkit import follow_all
    from tests.support.httpkit import result as http_result
    from tests.support.httpkit import submit as http_submit

    with serving(*FAST, *HTTP) as d:
        async with Client.connect(d.endpoint) as client:
            handle = await client.submit(A + "chat", {"prompt": "What is the answer?"})
            with anyio.fail_after(60):
                result = await handle.result()
            seen = await events_of(handle)
            endless = await client.submit(A + "forever", {"n": 0})
            await wait_for_event(endless, "framework")
            await endless.cancel()
            with anyio.fail_after(60):
                aborted = await endless.result()
        async with http_client(d) as http:
            turn_id = await http_submit(http, A + "chat", "What is the answer?")
            streamed = await follow_all(http, turn_id)
            over_http = await http_result(http, turn_id)
    assert result.outcome == "completed" and result.output["messages"][-1]["content"] == "The answer is 42."
    assert "".join(e["text"] for e in seen if e["type"] == "delta") == "Let me check.The answer is 42."
    assert aborted.outcome == "aborted" and aborted.cause == {"kind": "user"}
    data = [item[2] for item in streamed if item[0] == "event"]
    assert [e["type"] for e in data] == [e["type"] for e in seen], streamed
    assert "".join(e["text"] for e in data if e["type"] == "delta") == "Let me check.The answer is 42."
    assert over_http["outcome"] == "completed"
    assert over_http["output"]["messages"][-1]["content"] == "The answer is 42."


def test_in_a_batch(tmp_path: Path) -> None:
    """``turnpool batch``: a graph job completes with its final state, one past its deadline ends
    with cause ``deadline``, a bad input fails: one final line each."""
    jobs = tmp_path / "jobs.jsonl"
    out = tmp_path / "out.jsonl"
    jobs.write_text(
        "\n".join(
            json.dumps(j)
            for j in [
                {"id": "ok", "agent": A + "plus_one", "input": {"n": 41}},
                {"id": "late", "agent": A + "forever", "input": {"n": 0}, "timeout": 0.5},
                {"id": "bad", "agent": A + "chat", "input": {"input": {}, "nope": 1}},
            ]
        )
        + "\n"
    )
    argv = [sys.executable, "-P", "-c", "from supervisor.cli.main import entry; entry()", "batch"]
    argv += [str(jobs), "-o", str(out), "--workers", "2", "--path", ROOT, "--grace", "1", "--kill-after", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 1, proc.stderr
    lines = {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines()) if rec["final"]}
    assert lines["ok"]["outcome"] == "completed" and lines["ok"]["output"] == {"n": 42}
    assert lines["late"]["outcome"] in ("aborted", "killed") and lines["late"]["cause"] == {
        "kind": "deadline"
    }
    assert lines["bad"]["outcome"] == "failed" and "'nope'" in lines["bad"]["error"]["message"]


async def test_in_an_editor_through_acp(tmp_path: Path) -> None:
    """``turnpool acp --agent`` naming the graph: the editor's prompt is the user's message, tokens
    arrive as message chunks and the tool call as a tool call, answered ``end_turn``."""
    from acp import text_block
    from acp.schema import ToolCallProgress, ToolCallStart

    from tests.test_acp import ONE, acp_agent

    async with acp_agent(tmp_path, A + "chat", *ONE) as (conn, rec, sid, _):
        with anyio.fail_after(60):
            answer = await conn.prompt(session_id=sid, prompt=[text_block("What is the answer?")])
    assert answer.stop_reason == "end_turn" and rec.text() == "Let me check.The answer is 42."
    assert [(u.tool_call_id, u.title) for u in rec.updates if isinstance(u, ToolCallStart)] == [
        ("call_1", "lookup")
    ]
    assert [(u.tool_call_id, u.status) for u in rec.updates if isinstance(u, ToolCallProgress)] == [
        ("call_1", "completed")
    ]
