"""The loopback Chat Completions server (tests.support.openai_server) answering by what the
conversation asks for, so turns in any order get their own script: the first user message names
it ("tool", "block", "forever", "mcp", "slow MARK", "daemon PIDFILE", "stubborn MARK"; anything else:
a plain answer)."""

from __future__ import annotations

import json
from typing import Any

from tests.support.openai_server import FakeOpenAIServer, Plan, chunk


def tool_call(name: str, arguments: str) -> list[dict[str, Any]]:
    call = {"index": 0, "id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": ""}}
    return [
        chunk({"role": "assistant", "tool_calls": [call]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}),
        chunk({}, finish="tool_calls"),
    ]


def text(*pieces: str, stall: bool = False) -> Plan:
    chunks = [chunk({"role": "assistant", "content": pieces[0]})]
    chunks += [chunk({"content": p}) for p in pieces[1:]]
    if not stall:
        chunks.append(chunk({}, finish="stop"))
    return Plan(chunks, stall=stall)


class _ByConversation:
    """Stands in for the server's list of plans: ``pop(0)`` reads the request just received."""

    def __init__(self, server: FakeOpenAIServer) -> None:
        self.server = server

    def pop(self, index: int) -> Plan:
        messages = self.server.requests[-1][1]["messages"]
        ask = next(m["content"] for m in messages if m["role"] == "user")
        answered = any(m["role"] == "tool" for m in messages)
        if ask == "mcp" or ask.startswith("slow "):  # tests.agents.framework_mcp's script
            done = sum(m["role"] == "tool" for m in messages)
            if done == 0:
                return Plan(tool_call("parent", "{}"))
            if ask.startswith("slow "):
                return Plan(tool_call("slow", json.dumps({"mark": ask.removeprefix("slow ")})))
            return Plan(tool_call("add", '{"a": 2, "b": 3}')) if done == 1 else text("The sum ", "is 5.")
        if ask.startswith("daemon "):
            if any(m["role"] == "tool" for m in messages):
                return text("done")
            return Plan(tool_call("leave", json.dumps({"pidfile": ask.removeprefix("daemon ")})))
        if ask.startswith("stubborn "):
            return Plan(tool_call("stubborn_tool", json.dumps({"mark": ask.removeprefix("stubborn ")})))
        if ask == "forever":
            return text("Once ", "upon ", stall=True)
        if ask == "block":
            return Plan(tool_call("block", "{}"))
        if ask == "tool":
            return (
                text("The answer ", "is 42.") if answered else Plan(tool_call("lookup", '{"key": "answer"}'))
            )
        return text("Hello ", "there.")


def agents_server() -> FakeOpenAIServer:
    server = FakeOpenAIServer([])
    server.plans = _ByConversation(server)  # type: ignore[assignment]
    return server
