"""Framework agents for ``bench_adapters`` (``benchmarks._framework_agents:NAME``): each streams
``WORDS`` tokens as fast as its framework can, or forever (for cancel timings)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langgraph.graph import END, START, MessagesState, StateGraph
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

WORDS = 2000


async def _words(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
    for i in range(WORDS):
        yield f"w{i} "


async def _forever(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
    while True:
        yield "w "
        await asyncio.sleep(0.001)


pydantic_words = Agent(FunctionModel(stream_function=_words))
pydantic_forever = Agent(FunctionModel(stream_function=_forever))

TEXT = " ".join(f"w{i}" for i in range(WORDS // 2))  # split on spaces, kept: WORDS - 1 tokens


async def _chat(state: MessagesState) -> dict[str, Any]:
    model = GenericFakeChatModel(messages=iter([TEXT]))
    return {"messages": [await model.ainvoke(state["messages"])]}


async def _chat_forever(state: MessagesState) -> dict[str, Any]:
    while True:
        model = GenericFakeChatModel(messages=iter(["w w w w"]))
        await model.ainvoke(state["messages"])
        await asyncio.sleep(0.001)


def _graph(node: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("chat", node)
    builder.add_edge(START, "chat")
    builder.add_edge("chat", END)
    return builder.compile()


langgraph_words = _graph(_chat)
langgraph_forever = _graph(_chat_forever)
