"""Claude Agent SDK options named as a turn's agent: a real ``ClaudeSDKClient`` session (the SDK's
own code) whose CLI is a stand-in speaking the SDK's stream-json protocol
(``tests/agents/fake_claude_cli.py``, pointed at by ``cli_path``): the real ``claude`` CLI needs a
model service. The CLI is a child of the worker: a cancel sends the SDK's ``interrupt()`` and ends
``aborted``; a CLI that ignores interrupt, stdin EOF and SIGTERM ends ``killed`` after the grace; the
CLI and the process it started are gone either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from supervisor import Client, Supervisor, TurnHandle
from tests.support.adapterkit import events_of, gone
from tests.support.daemonkit import FAST, HTTP, ROOT, serving

pytestmark = pytest.mark.anyio

pytest.importorskip("claude_agent_sdk", reason="the claude extra is not installed")

A = "tests.agents.claude_agents:assistant"
WHOLE = "tests.agents.claude_agents:whole"
MUTE = "tests.agents.claude_agents:mute"
PRELOAD = ("tests.agents.claude_agents",)


async def cli_pids(handle: TurnHandle, deltas: int = 2) -> tuple[int, int]:
    """The stand-in CLI's pid and its child's (its ``system.init`` event), once ``deltas`` streamed."""
    pids = None
    with anyio.fail_after(60):
        async with aclosing(handle.events()) as events:
            async for event in events:
                if event["type"] == "framework" and event["name"] == "system.init":
                    pids = (event["data"]["cli_pid"], event["data"]["child_pid"])
                elif event["type"] == "delta" and pids is not None:
                    deltas -= 1
                    if deltas == 0:
                        return pids
    raise AssertionError("the turn ended before streaming")


HELLO = [
    {"type": "thought", "text": "The user greets me."},
    {"type": "tool_call", "id": "toolu_1", "title": "Bash", "input": {"command": "echo hi"}},
    {"type": "tool_call_update", "id": "toolu_1", "status": "completed", "output": "hi"},
]


async def test_sessions_stream_complete_cancel_and_are_killed_with_their_cli(tmp_path: Path) -> None:
    """(One supervisor for all: importing the SDK costs a second per worker here.) A session streams
    the common vocabulary and completes with the result's text, with partial messages (token
    deltas) and without (whole blocks); an unknown input key fails the turn; a cancel mid-stream
    reaches the CLI as the SDK's interrupt and ends ``aborted`` (cause ``user``) with the CLI and
    its child gone; past a deadline, cause ``deadline``, even one that comes while the SDK is still
    connecting; a CLI that ignores interrupt, stdin EOF and
    SIGTERM ends ``killed`` after the grace, the CLI and its child gone, and a new worker serves on."""
    async with Supervisor(workers=1, spares=0, grace=0.5, kill_after=0.5, preload=PRELOAD) as sup:
        hello = await sup.submit(A, "hello there")
        whole = await sup.submit(WHOLE, {"prompt": "hello there", "session_id": "s1"})
        with anyio.fail_after(60):
            results = [await hello.result(), await whole.result()]
            unknown = await sup.run(A, {"prompt": "hello", "temperature": 0})
        seen = [await events_of(h) for h in (hello, whole)]

        mark = tmp_path / "interrupted"
        endless = await sup.submit(A, f"forever {mark}", grace=20)
        cli, child = await cli_pids(endless)
        assert await endless.cancel() == {"kind": "user"}
        with anyio.fail_after(60):
            aborted = await endless.result()
            late = await sup.run(A, "forever", timeout=0.5, grace=20)
            connecting = await sup.run(MUTE, "hello", timeout=0.5, grace=20)

        stubborn = await sup.submit(A, "stubborn")
        stubborn_cli, stubborn_child = await cli_pids(stubborn)
        await stubborn.cancel()
        with anyio.fail_after(60):
            killed = await stubborn.result()
            fresh = await sup.run(A, "hello")
    assert [r.outcome for r in results] == ["completed"] * 2, results
    assert [r.output for r in results] == ["Hello from Claude."] * 2
    assert [e for e in seen[0] if e["type"] != "framework"] == HELLO + [
        {"type": "delta", "text": t} for t in ("Hello ", "from ", "Claude.")
    ]
    assert [e for e in seen[1] if e["type"] != "framework"] == [
        *HELLO,
        {"type": "delta", "text": "Hello from Claude."},
    ]
    assert (
        unknown.outcome == "failed" and unknown.error is not None and "'temperature'" in unknown.error.message
    )
    assert aborted.outcome == "aborted" and aborted.cause == {"kind": "user"}, aborted
    assert mark.read_text() == "interrupted"  # the SDK's interrupt() reached the CLI
    assert gone(cli) and gone(child)
    assert late.outcome == "aborted" and late.cause == {"kind": "deadline"}, late
    # a deadline while the SDK still connects (its CLI never answers): no interrupt() of a session
    # that never was, and no SDK error in place of the cancel
    assert connecting.outcome == "aborted" and connecting.cause == {"kind": "deadline"}, connecting
    assert killed.outcome == "killed" and killed.cause == {"kind": "user"}, killed
    assert gone(stubborn_cli) and gone(stubborn_child)
    assert fresh.outcome == "completed" and fresh.worker_pid != killed.worker_pid


async def test_through_the_daemon_and_over_http() -> None:
    """``turnpool serve``: a ``Client`` gets the events and the output and cancels a session
    mid-stream (``aborted``, the CLI gone); over HTTP the turn's Server-Sent Events carry the same
    events and the result its output."""
    from tests.support.httpkit import client as http_client
    from tests.support.httpkit import follow_all
    from tests.support.httpkit import result as http_result
    from tests.support.httpkit import submit as http_submit

    with serving(*FAST, *HTTP, "--workers", "1", "--grace", "5") as d:
        async with Client.connect(d.endpoint) as client:
            handle = await client.submit(A, "hello there")
            with anyio.fail_after(60):
                result = await handle.result()
            seen = await events_of(handle)
            endless = await client.submit(A, "forever")
            cli, child = await cli_pids(endless)
            await endless.cancel()
            with anyio.fail_after(60):
                aborted = await endless.result()
        async with http_client(d) as http:
            turn_id = await http_submit(http, A, "hello there")
            streamed = await follow_all(http, turn_id)
            over_http = await http_result(http, turn_id)
    assert result.outcome == "completed" and result.output == "Hello from Claude."
    assert aborted.outcome == "aborted" and aborted.cause == {"kind": "user"}, aborted
    assert gone(cli) and gone(child)
    data = [item[2] for item in streamed if item[0] == "event"]
    strip = [e for e in data if e["type"] != "framework"]
    assert strip == [e for e in seen if e["type"] != "framework"], streamed
    assert over_http["outcome"] == "completed" and over_http["output"] == "Hello from Claude."


def test_in_a_batch(tmp_path: Path) -> None:
    """``turnpool batch``: a session completes with its result text; one past its deadline ends with
    cause ``deadline``: one final line each."""
    jobs, out = tmp_path / "jobs.jsonl", tmp_path / "out.jsonl"
    lines = [
        {"id": "ok", "agent": A, "input": "hello"},
        {"id": "late", "agent": A, "input": "forever", "timeout": 0.5},
    ]
    jobs.write_text("".join(json.dumps(j) + "\n" for j in lines))
    argv = [sys.executable, "-P", "-c", "from supervisor.cli.main import entry; entry()", "batch", str(jobs)]
    argv += ["-o", str(out), "--workers", "2", "--path", ROOT, "--grace", "1", "--kill-after", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 1, proc.stderr
    records = {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines()) if rec["final"]}
    assert records["ok"]["outcome"] == "completed" and records["ok"]["output"] == "Hello from Claude."
    assert records["late"]["outcome"] in ("aborted", "killed") and records["late"]["cause"] == {
        "kind": "deadline"
    }


async def test_in_an_editor_through_acp(tmp_path: Path) -> None:
    """``turnpool acp --agent`` naming the options: the editor's prompt is the session's prompt, the
    tokens arrive as message chunks and the tool use as a tool call, answered ``end_turn``."""
    from acp import text_block
    from acp.schema import ToolCallProgress, ToolCallStart

    from tests.test_acp import ONE, acp_agent

    async with acp_agent(tmp_path, A, *ONE) as (conn, rec, sid, _):
        with anyio.fail_after(60):
            answer = await conn.prompt(session_id=sid, prompt=[text_block("hello there")])
    assert answer.stop_reason == "end_turn" and rec.text() == "Hello from Claude."
    assert [(u.tool_call_id, u.title) for u in rec.updates if isinstance(u, ToolCallStart)] == [
        ("toolu_1", "Bash")
    ]
    assert [(u.tool_call_id, u.status) for u in rec.updates if isinstance(u, ToolCallProgress)] == [
        ("toolu_1", "completed")
    ]
