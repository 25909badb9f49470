"""Framework agents whose one tool is a ``worker.isolated`` call that writes 2 GiB under
``memory_mb=256`` (``tests.agents.tools_frameworks:NAME``), each on the framework's own offline model:
pydantic-ai's ``FunctionModel``, LangGraph with langchain_core's ``GenericFakeChatModel``, the OpenAI
Agents SDK's ``OpenAIChatCompletionsModel`` against the loopback server the test started (its URL in
``TURNPOOL_TEST_OPENAI_URL``). Each model answers with what its tool call gave back, so the turn's
output shows what the model was told."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent as OpenAIAgent
from agents import OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool as lc_tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

import worker
from tests.agents.tools import hog
from worker.adapters.pydantic_ai import durable

_hog = worker.isolated(hog, memory_mb=256)


def _told(parts: list[Any]) -> str | None:
    for part in parts:
        text = str(getattr(part, "content", ""))
        if "tool killed" in text:
            return text
    return None


# ---- pydantic-ai: the killed call is a failed tool result its model sees ------------------------


async def _pydantic_model(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
    told = _told([p for m in messages for p in m.parts])
    if told is not None:
        yield f"told: {told}"
        return
    yield {0: DeltaToolCall(name="allocate", json_args="{}", tool_call_id="c1")}


pydantic_hog = Agent(FunctionModel(stream_function=_pydantic_model))


@pydantic_hog.tool_plain
def allocate() -> int:
    """Allocate 2 GiB."""
    return int(_hog())


# ---- LangGraph: ToolNode(handle_tool_errors=worker.ToolIsolationError) --------------------------


@lc_tool
def allocate_lc() -> int:
    """Allocate 2 GiB."""
    return int(_hog())


async def _agent(state: MessagesState) -> dict[str, Any]:
    told = _told([m for m in state["messages"] if isinstance(m, ToolMessage)])
    if told is not None:
        reply = await GenericFakeChatModel(messages=iter([f"told: {told}"])).ainvoke(state["messages"])
        return {"messages": [reply]}
    call = {"name": "allocate_lc", "args": {}, "id": "c1"}
    return {"messages": [AIMessage(content="", tool_calls=[call])]}


def _route(state: MessagesState) -> str:
    return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END


_g = StateGraph(MessagesState)
_g.add_node("agent", _agent)
_g.add_node("tools", ToolNode([allocate_lc], handle_tool_errors=worker.ToolIsolationError))
_g.add_edge(START, "agent")
_g.add_conditional_edges("agent", _route, ["tools", END])
_g.add_edge("tools", "agent")
langgraph_hog = _g.compile()


# ---- OpenAI Agents SDK: failure_error_function gives the model the error's text ------------------

set_tracing_disabled(True)
_client = AsyncOpenAI(
    base_url=os.environ.get("TURNPOOL_TEST_OPENAI_URL", "http://127.0.0.1:9/v1"),
    api_key="test",
    max_retries=0,
)


def _tell(ctx: Any, error: Exception) -> str:
    """The SDK's default hides every tool error's text from the model: a stopped call says why."""
    return str(error)


@function_tool(failure_error_function=_tell)
def allocate_oa() -> int:
    """Allocate 2 GiB."""
    return int(_hog())


def _openai_agent(tool: Any) -> OpenAIAgent[Any]:
    return OpenAIAgent(
        name="hog",
        instructions="Allocate.",
        model=OpenAIChatCompletionsModel(model="test-model", openai_client=_client),
        tools=[tool],
    )


openai_hog = _openai_agent(allocate_oa)


@function_tool(name_override="allocate_oa")
def allocate_oa_default() -> int:
    """Allocate 2 GiB (the SDK's default failure function: the model gets a fixed text)."""
    return int(_hog())


openai_hog_default = _openai_agent(allocate_oa_default)


# ---- pydantic-ai on step records (``worker.adapters.pydantic_ai.durable``) -------------------------


def _pydantic_reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """``_pydantic_model``'s answers, whole (a durable run's requests are not streamed)."""
    told = _told([p for m in messages for p in m.parts])
    if told is not None:
        return ModelResponse(parts=[TextPart(f"told: {told}")])
    return ModelResponse(parts=[ToolCallPart("allocate", {}, tool_call_id="c1")])


_durable_agent = Agent(FunctionModel(function=_pydantic_reply))


@_durable_agent.tool_plain(name="allocate")
def allocate_durable() -> int:
    """Allocate 2 GiB."""
    return int(_hog())


pydantic_durable_hog = durable(_durable_agent)
