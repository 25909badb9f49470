"""Framework agents for ``bench_adapters`` (``benchmarks._framework_agents:NAME``): each streams
``WORDS`` tokens as fast as its framework can, or forever (for cancel timings): pydantic-ai and
LangGraph on their offline models, the OpenAI Agents SDK against a loopback model server, the
Claude Agent SDK with a stand-in CLI."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
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


# The OpenAI Agents SDK: its own OpenAIChatCompletionsModel against a loopback streaming Chat
# Completions server the benchmark starts (its URL in BENCH_OPENAI_URL when the pool's workers
# import this module); the server streams WORDS tokens, or a few and then nothing ("forever").
def openai_agent(url: str) -> Any:
    from agents import Agent as OpenAIAgent
    from agents import OpenAIChatCompletionsModel, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=url, api_key="bench", max_retries=0)
    return OpenAIAgent(name="bench", model=OpenAIChatCompletionsModel(model="bench", openai_client=client))


openai_words = openai_agent(os.environ.get("BENCH_OPENAI_URL", "http://127.0.0.1:9/v1"))


# The Claude Agent SDK: a ClaudeSDKClient session with the stand-in CLI of turnpool's tests (the
# SDK's stream-json protocol, no model service), streaming token deltas.
def claude_options() -> Any:
    from claude_agent_sdk import ClaudeAgentOptions

    cli = Path(__file__).resolve().parent.parent / "tests" / "agents" / "fake_claude_cli.py"
    return ClaudeAgentOptions(cli_path=str(cli), include_partial_messages=True)


claude_session = claude_options()
