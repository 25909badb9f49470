"""Compiled LangGraph graphs run by name through the pool (``tests.agents.langgraph_agents:NAME``),
with langchain_core's ``GenericFakeChatModel`` streaming the model's tokens offline."""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any, TypedDict

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from tests.agents.daemon_tool import leave_daemon


@tool
def lookup(key: str) -> dict[str, Any]:
    """Look a key up (a sync tool: LangGraph runs it in the loop's default executor)."""
    return {"key": key, "value": 42}


async def agent(state: MessagesState) -> dict[str, Any]:
    """First step: says it will look, and calls ``lookup``; after the tool: the answer. Each
    step's text is streamed token by token by the fake model."""
    answered = any(isinstance(m, ToolMessage) for m in state["messages"])
    get_stream_writer()({"step": "answer" if answered else "plan"})
    text = "The answer is 42." if answered else "Let me check."
    reply = await GenericFakeChatModel(messages=iter([text])).ainvoke(state["messages"])
    if answered:
        return {"messages": [reply]}
    call = {"name": "lookup", "args": {"key": "answer"}, "id": "call_1"}
    return {"messages": [AIMessage(content=reply.content, id=reply.id, tool_calls=[call])]}


def route(state: MessagesState) -> str:
    last = state["messages"][-1]
    return "tools" if getattr(last, "tool_calls", None) else END


_g = StateGraph(MessagesState)
_g.add_node("agent", agent)
_g.add_node("tools", ToolNode([lookup]))
_g.add_edge(START, "agent")
_g.add_conditional_edges("agent", route, ["tools", END])
_g.add_edge("tools", "agent")
chat = _g.compile()


class Count(TypedDict):
    n: int


def bump(state: Count) -> Count:
    return {"n": state.get("n", 0) + 1}


# A checkpointed graph: turns that carry the same thread_id in their config continue its state.
_c = StateGraph(Count)
_c.add_node("bump", bump)
_c.add_edge(START, "bump")
_c.add_edge("bump", END)
counter = _c.compile(checkpointer=InMemorySaver())
plus_one = _c.compile()  # the same graph without a checkpointer: the input is the whole state


async def tick(state: Count) -> Count:
    """Writes a custom event every 10 ms, never ending: only a cancel stops it."""
    writer = get_stream_writer()
    n = 0
    while True:
        n += 1
        writer({"tick": n})
        await asyncio.sleep(0.01)  # allowed: the agent's or tool's own work under test, not a wait


_f = StateGraph(Count)
_f.add_node("tick", tick)
_f.add_edge(START, "tick")
_f.add_edge("tick", END)
forever = _f.compile()


class Files(TypedDict):
    pidfile: str


def block(state: Files) -> Files:
    """A sync node (run in a thread) that starts a child, then blocks in C."""
    child = subprocess.Popen(["sleep", "3600"])
    with open(state["pidfile"], "w") as f:
        f.write(str(child.pid))
    time.sleep(3600)  # allowed: the agent's or tool's own work under test, not a wait
    return state


_b = StateGraph(Files)
_b.add_node("block", block)
_b.add_edge(START, "block")
_b.add_edge("block", END)
blocker = _b.compile()


def leave(state: Files) -> Files:
    """A sync node that leaves a setsid daemon behind and returns."""
    leave_daemon(state["pidfile"])
    return state


_d = StateGraph(Files)
_d.add_node("leave", leave)
_d.add_edge(START, "leave")
_d.add_edge("leave", END)
daemonizer = _d.compile()


async def swallow(state: Count) -> Count:
    """Writes one custom event, then swallows every cancellation: the run can never unwind."""
    get_stream_writer()({"stubborn": True})
    while True:
        try:
            await asyncio.sleep(3600)  # allowed: the agent's or tool's own work under test, not a wait
        except asyncio.CancelledError:
            continue


_s = StateGraph(Count)
_s.add_node("swallow", swallow)
_s.add_edge(START, "swallow")
_s.add_edge("swallow", END)
stubborn = _s.compile()
