"""An OpenAI Agents SDK ``Agent`` run by turnpool unchanged (``pip install 'turnpool[openai-agents]'``).

``python -m examples.openai_agents_agent`` runs ``examples.openai_agents_agent:triage`` in a real
worker against any OpenAI-compatible Chat Completions server: ``OPENAI_BASE_URL`` (for example a
local vLLM or Ollama, ``http://127.0.0.1:11434/v1``), ``OPENAI_API_KEY`` and ``EXAMPLE_MODEL``
(default ``gpt-4o-mini``). The tests run the same kind of agent against a loopback server
(``tests/test_adapters_openai_agents.py``).
"""

from __future__ import annotations

import os
from contextlib import aclosing
from typing import Any

import anyio
from agents import Agent, OpenAIChatCompletionsModel, RunContextWrapper, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(True)


@function_tool
def order_status(ctx: RunContextWrapper[Any], order_id: str) -> str:
    """The status of an order. The run's context is the turn's ``context`` input key."""
    return f"order {order_id} for customer {ctx.context.get('customer')}: shipped"


triage = Agent(
    name="triage",
    instructions="Answer questions about orders; use order_status.",
    model=OpenAIChatCompletionsModel(
        model=os.environ.get("EXAMPLE_MODEL", "gpt-4o-mini"),
        openai_client=AsyncOpenAI(api_key=os.environ.get("OPENAI_API_KEY", "none")),
    ),
    tools=[order_status],
)


async def main() -> None:
    from supervisor import Supervisor

    async with Supervisor(workers=1, spares=0) as sup:
        handle = await sup.submit(
            "examples.openai_agents_agent:triage",
            {"prompt": "Where is order 42?", "context": {"customer": "c-7"}},
        )
        async with aclosing(handle.events()) as events:
            async for event in events:
                print("event ", event)
        print("result", await handle.result())


if __name__ == "__main__":
    anyio.run(main)
