"""A pydantic-ai agent run on turnpool's step records (tests/test_durability_pydantic_ai.py): a
``FunctionModel`` calls ``charge`` (not idempotent), then ``reserve`` (idempotent), then answers with
what they returned. ``PLAN`` (set from a file the test writes) says where its worker (or the
process ``pid``, a daemon) is SIGKILLed, once: ``model2`` (as the second model request is made),
``in_charge`` / ``in_reserve`` (inside the tool, after its effect)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from worker.adapters.pydantic_ai import durable
from worker.agent import current_call


def _plan() -> dict[str, Any]:
    return json.loads(Path(os.environ.get("TP_PA_PLAN", "/nonexistent")).read_text())


def _kill_once(where: str) -> None:
    plan = _plan()
    if plan.get("kill") != where:
        return
    try:
        os.close(os.open(Path(plan["dir"]) / "killed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(plan.get("pid") or os.getpid(), signal.SIGKILL)


def _append(name: str, line: str) -> None:
    with open(Path(_plan()["dir"]) / name, "a") as f:
        f.write(line + "\n")


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = [p for msg in messages for p in getattr(msg, "parts", ()) if isinstance(p, ToolReturnPart)]
    _append("opens", str(len(returns) + 1))
    _kill_once(f"model{len(returns) + 1}")
    if not returns:
        return ModelResponse(parts=[ToolCallPart("charge", {"amount": 5}, tool_call_id="c1")])
    if len(returns) == 1:
        return ModelResponse(parts=[ToolCallPart("reserve", {"seat": "12A"}, tool_call_id="c2")])
    return ModelResponse(parts=[TextPart("Done: " + " | ".join(str(r.content) for r in returns))])


trip_agent = Agent(FunctionModel(_model))


@trip_agent.tool_plain
def charge(amount: int) -> str:
    _append("charges", current_call().idempotency_key)
    _kill_once("in_charge")
    return f"charged {amount}"


@trip_agent.tool_plain
def reserve(seat: str) -> str:
    _append("reserves", current_call().idempotency_key)
    _kill_once("in_reserve")
    return f"reserved {seat}"


trip = durable(trip_agent, idempotent_tools=("reserve",))
trip_strict = durable(trip_agent, on_unknown_outcome="fail")
