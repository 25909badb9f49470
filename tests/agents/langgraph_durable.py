"""A LangGraph graph compiled with ``TurnCheckpointer`` (tests/test_durability_langgraph.py): a planner
node (the model) calls ``charge`` (not idempotent) through a ``ToolNode``, then answers with what it
said; the input's ``kill`` names where its worker (or the process ``pid``, a daemon) is SIGKILLed,
once (``model1``, ``model2``: as the planner runs; ``in_charge``: inside the tool, after its effect;
``after_charge``: the tool returned, its writes not recorded yet; ``end``: the last checkpoint
recorded, before the graph returns)."""

from __future__ import annotations

import asyncio
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
    pid: int


def _first_time(d: str) -> bool:
    try:
        os.close(os.open(Path(d) / "killed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _kill_once(d: str, kill: str | None, where: str, pid: int = 0) -> None:
    if kill == where and _first_time(d):
        os.kill(pid or os.getpid(), signal.SIGKILL)


def _append(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@tool
async def charge(amount: int, dir: str, kill: str | None = None, pid: int = 0) -> dict[str, Any]:
    """Charge the card (not idempotent): a line in ``dir/charges`` per execution."""
    _append(Path(dir) / "charges", f"{amount}")
    _kill_once(dir, kill, "in_charge", pid)
    if kill == "after_charge" and _first_time(dir):
        # As soon as the tool returned, before its writes are recorded.
        asyncio.get_running_loop().call_soon(os.kill, pid or os.getpid(), signal.SIGKILL)
    return {"charged": amount}


def _note_open(d: str, n: int) -> None:
    with open(Path(d) / "opens", "a") as f:
        f.write(f"{n}\n")


async def planner(state: Trip) -> dict[str, Any]:
    """The model: calls ``charge`` first, then answers with what the tool said."""
    d, kill, pid = state["dir"], state.get("kill"), state.get("pid", 0)
    tools = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    _note_open(d, len(tools) + 1)
    _kill_once(d, kill, f"model{len(tools) + 1}", pid)
    if tools:
        return {"messages": [AIMessage(content=f"Done: {tools[0].content}")]}
    args: dict[str, Any] = {"amount": 5, "dir": d, "kill": kill, "pid": pid}
    call = {"name": "charge", "args": args, "id": "call_c1"}
    return {"messages": [AIMessage(content="Charging.", tool_calls=[call])]}


class KillingCheckpointer(TurnCheckpointer):
    """``kill == "end"``: SIGKILL once the last checkpoint (the planner's answer) is durable."""

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        saved = await super().aput(config, checkpoint, metadata, new_versions)
        values = checkpoint.get("channel_values", {})
        messages = values.get("messages") or []
        if messages and str(messages[-1].content).startswith("Done:"):
            _kill_once(values["dir"], values.get("kill"), "end", values.get("pid", 0))
        return saved


def _trip(on_unknown: str) -> Any:
    g = StateGraph(Trip)
    g.add_node("planner", planner)
    g.add_node("tools", ToolNode([charge]))
    g.add_edge(START, "planner")
    g.add_conditional_edges("planner", route, ["tools", END])
    g.add_edge("tools", "planner")
    return g.compile(checkpointer=KillingCheckpointer(on_unknown_outcome=on_unknown))


durable_trip = _trip("tell_model")
durable_trip_strict = _trip("fail")
