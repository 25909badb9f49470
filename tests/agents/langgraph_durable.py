"""A LangGraph graph compiled with ``TurnCheckpointer`` (tests/test_durability_langgraph.py): a planner
node (the model) calls ``charge`` (not idempotent) through a ``ToolNode``, then answers with what it
said; the input's ``kill`` names where its worker is SIGKILLed, once (``model1``, ``model2``: as the
planner runs; ``in_charge``: inside the tool, after its effect)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

from tests.agents.langgraph_agents import route
from worker.adapters.langgraph import TurnCheckpointer


class Trip(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    dir: str
    kill: str | None


def _kill_once(d: str, kill: str | None, where: str) -> None:
    if kill != where:
        return
    try:
        os.close(os.open(Path(d) / "killed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


@tool
def charge(amount: int, dir: str, kill: str | None = None) -> dict[str, Any]:
    """Charge the card (not idempotent): a line in ``dir/charges`` per execution."""
    with open(Path(dir) / "charges", "a") as f:
        f.write(f"{amount}\n")
    _kill_once(dir, kill, "in_charge")
    return {"charged": amount}


def _note_open(d: str, n: int) -> None:
    with open(Path(d) / "opens", "a") as f:
        f.write(f"{n}\n")


async def planner(state: Trip) -> dict[str, Any]:
    """The model: calls ``charge`` first, then answers with what the tool said."""
    d, kill = state["dir"], state.get("kill")
    tools = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    _note_open(d, len(tools) + 1)
    _kill_once(d, kill, f"model{len(tools) + 1}")
    if tools:
        return {"messages": [AIMessage(content=f"Done: {tools[0].content}")]}
    call = {"name": "charge", "args": {"amount": 5, "dir": d, "kill": kill}, "id": "call_c1"}
    return {"messages": [AIMessage(content="Charging.", tool_calls=[call])]}


def _trip(on_unknown: str) -> Any:
    g = StateGraph(Trip)
    g.add_node("planner", planner)
    g.add_node("tools", ToolNode([charge]))
    g.add_edge(START, "planner")
    g.add_conditional_edges("planner", route, ["tools", END])
    g.add_edge("tools", "planner")
    return g.compile(checkpointer=TurnCheckpointer(on_unknown_outcome=on_unknown))


durable_trip = _trip("tell_model")
durable_trip_strict = _trip("fail")
