"""A compiled LangGraph graph run by turnpool unchanged (``pip install 'turnpool[langgraph]'``).

``python -m examples.langgraph_agent`` runs ``examples.langgraph_agent:graph`` in a real worker: a
chat node whose model is langchain_core's offline ``GenericFakeChatModel`` (it streams a scripted
answer token by token), and a ``custom`` stream write. Any other chat model (``ChatOpenAI``, ...)
works the same way; so does any graph, with any input.
"""

from __future__ import annotations

import itertools
from contextlib import aclosing
from typing import Any

import anyio
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, MessagesState, StateGraph

model = GenericFakeChatModel(messages=itertools.cycle(["Your order shipped yesterday."]))


async def chat(state: MessagesState) -> dict[str, Any]:
    get_stream_writer()({"status": "answering"})
    return {"messages": [await model.ainvoke(state["messages"])]}


_builder = StateGraph(MessagesState)
_builder.add_node("chat", chat)
_builder.add_edge(START, "chat")
_builder.add_edge("chat", END)
# A checkpointer: turns that pass the same thread_id in their config continue one conversation
# (in the worker's memory here; a durable BaseCheckpointSaver keeps it across workers).
graph = _builder.compile(checkpointer=InMemorySaver())


async def main() -> None:
    from supervisor import Supervisor

    async with Supervisor(workers=1, spares=0) as sup:
        handle = await sup.submit(
            "examples.langgraph_agent:graph",
            {"prompt": "Where is my order?", "config": {"configurable": {"thread_id": "customer-1"}}},
        )
        async with aclosing(handle.events()) as events:
            async for event in events:
                print("event ", event)
        result = await handle.result()
        print("result", result.outcome, [m["content"] for m in result.output["messages"]])


if __name__ == "__main__":
    anyio.run(main)
