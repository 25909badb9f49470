"""A pydantic-ai ``Agent`` run by turnpool unchanged (``pip install 'turnpool[pydantic-ai]'``).

``python -m examples.pydantic_ai_agent`` runs ``examples.pydantic_ai_agent:support`` in a real worker
(pydantic-ai's offline ``TestModel``: it calls every tool, then answers) and prints its events and
result. With a real model, only the ``Agent(...)`` line changes:
``Agent("openai:gpt-5.2", ...)``; the same name works with ``turnpool submit``, ``turnpool batch``,
the HTTP API and ``turnpool acp --agent examples.pydantic_ai_agent:support``.
"""

from __future__ import annotations

from contextlib import aclosing
from dataclasses import dataclass

import anyio
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.test import TestModel


@dataclass
class Shop:
    name: str


def shop(name: str = "turnpool store") -> Shop:
    """The deps factory a turn names in its input:
    ``{"prompt": ..., "deps": "examples.pydantic_ai_agent:shop"}``."""
    return Shop(name)


support = Agent(TestModel(), deps_type=Shop, instructions="Answer questions about orders.")


@support.tool
def order_status(ctx: RunContext[Shop], order_id: str) -> str:
    return f"order {order_id} at {ctx.deps.name}: shipped"


async def main() -> None:
    from supervisor import Supervisor

    async with Supervisor(workers=1, spares=0) as sup:
        handle = await sup.submit(
            "examples.pydantic_ai_agent:support",
            {"prompt": "Where is my order?", "deps": "examples.pydantic_ai_agent:shop"},
        )
        async with aclosing(handle.events()) as events:
            async for event in events:
                print("event ", event)
        print("result", await handle.result())


if __name__ == "__main__":
    anyio.run(main)
