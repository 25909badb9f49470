"""``python -m examples.loop_demo``: an ``AgentLoop`` turn cancelled at each detection point.

Runs ``examples.loop_agent:research`` in real worker processes: once to the end, then
cancelled while the model stream opens, between streamed events, while its tools run, and
while a tool that cannot be interrupted runs (it waits for the tool, then stops). Prints the
outcome, the on_abort reason the agent reported, and how long cancel → result took.
"""

from __future__ import annotations

import time
from contextlib import aclosing
from typing import Any

import anyio
from rich.console import Console
from rich.table import Table

from supervisor import Supervisor, TurnHandle

console = Console()
AGENT = "examples.loop_agent:research"

CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    ("runs to the end", {}, None),
    ("cancelled while the stream opens", {"open_delay": 3600}, {"type": "opening"}),
    ("cancelled between streamed events", {"event_delay": 3600}, {"type": "delta"}),
    ("cancelled while tools run", {"tool_seconds": 3600}, {"type": "tool_start", "name": "fetch"}),
    (
        "cancelled during 0.5 s blocking tools",
        {"tool_seconds": 0.5, "blocking_tools": True},
        {"type": "tool_start", "name": "fetch"},
    ),
]


async def _events_until(handle: TurnHandle, marker: dict[str, Any]) -> None:
    async with aclosing(handle.events()) as events:
        async for event in events:
            if all(event.get(k) == v for k, v in marker.items()):
                return


async def main() -> None:
    table = Table(title="AgentLoop turns (grace 5 s)")
    for col in ("case", "outcome", "on_abort reason", "streamed", "cancel → result"):
        table.add_column(col)
    async with Supervisor(workers=1, spares=0, grace=5.0) as sup:
        for label, inp, marker in CASES:
            handle = await sup.submit(AGENT, inp)
            took = ""
            if marker is not None:
                await _events_until(handle, marker)
                t0 = time.monotonic()
                await handle.cancel()
                result = await handle.result()
                took = f"{(time.monotonic() - t0) * 1000:.1f} ms"
            else:
                result = await handle.result()
            async with aclosing(handle.events()) as events:
                seen = [e async for e in events]
            reasons = ", ".join(e["reason"] for e in seen if e["type"] == "on_abort")
            text = "".join(e["text"] for e in seen if e["type"] == "delta")
            table.add_row(label, result.outcome, reasons, repr(text), took)
    console.print(table)


if __name__ == "__main__":
    anyio.run(main)
