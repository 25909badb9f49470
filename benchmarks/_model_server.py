"""The OpenAI Agents SDK's model for ``bench_adapters``: a loopback streaming Chat Completions server
(the tests' ``FakeOpenAIServer``) in a process of its own, so that neither side of the comparison
counts its CPU. Each request gets ``WORDS`` tokens, or (a user message "forever") three chunks and
then nothing until the client hangs up. ``python -m benchmarks._model_server`` prints its base URL
on the first line of stdout and serves until its stdin closes."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import anyio

from benchmarks._framework_agents import WORDS
from tests.support.openai_server import FakeOpenAIServer, Plan, chunk


class _Server(FakeOpenAIServer):
    async def _handle(self, client: Any) -> None:
        # a cancelled run's client hung up mid-stream
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await super()._handle(client)


class _Plans:
    """Stands in for the server's list of plans: ``pop(0)`` reads the request just received."""

    def __init__(self, server: FakeOpenAIServer) -> None:
        self.server = server
        words = [chunk({"role": "assistant", "content": ""})]
        words += [chunk({"content": f"w{i} "}) for i in range(WORDS)]
        self.words = Plan([*words, chunk({}, finish="stop")])
        self.forever = Plan(words[:3], stall=True)

    def pop(self, index: int) -> Plan:
        messages = self.server.requests[-1][1]["messages"]
        ask = next(m["content"] for m in messages if m["role"] == "user")
        return self.forever if ask == "forever" else self.words


async def _main() -> None:
    server = _Server([])
    server.plans = _Plans(server)  # type: ignore[assignment]
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        print(server.base_url, flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the benchmark closes our stdin
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(_main)
