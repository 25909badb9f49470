"""Claude Agent SDK options run by turnpool unchanged (``pip install 'turnpool[claude]'``).

``python -m examples.claude_agent`` runs ``examples.claude_agent:assistant`` in a real worker: a
``ClaudeSDKClient`` session whose ``claude`` CLI (the one bundled with the SDK, or
``EXAMPLE_CLAUDE_CLI``) is a child of the worker, so a cancel or a deadline ends it and everything it
started. The real CLI needs its model service (``ANTHROPIC_API_KEY``). The tests run the SDK
against a stand-in CLI instead: ``EXAMPLE_CLAUDE_CLI=$PWD/tests/agents/fake_claude_cli.py python -m
examples.claude_agent`` (``tests/test_adapters_claude.py``).
"""

from __future__ import annotations

import os
from contextlib import aclosing

import anyio
from claude_agent_sdk import ClaudeAgentOptions

assistant = ClaudeAgentOptions(
    cli_path=os.environ.get("EXAMPLE_CLAUDE_CLI"),  # absolute: workers run in a directory of their own
    include_partial_messages=True,  # token deltas as turnpool "delta" events
    max_turns=3,
)


async def main() -> None:
    from supervisor import Supervisor

    async with Supervisor(workers=1, spares=0) as sup:
        handle = await sup.submit("examples.claude_agent:assistant", "hello, in one sentence")
        async with aclosing(handle.events()) as events:
            async for event in events:
                print("event ", event)
        print("result", await handle.result())


if __name__ == "__main__":
    anyio.run(main)
