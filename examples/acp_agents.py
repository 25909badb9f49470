"""Example agents for ``turnpool acp`` (``"examples.acp_agents:NAME"``).

Each gets the prompt as its input ``{"text", "prompt", "session_id", "cwd"}`` and speaks to the
editor through the event shapes of ``supervisor.acp.events``: ``{"type": "delta", "text"}``
for reply chunks, ``{"type": "tool_call", ...}`` / ``{"type": "tool_call_update", ...}`` for
tool calls. Try one in an editor with ``turnpool acp --agent examples.acp_agents:chat --path .``
(from the checkout's root: ``examples`` is not installed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import anyio

import worker


def _text(turn: worker.Turn) -> str:
    inp = turn.input
    return inp.get("text", "") if isinstance(inp, dict) else str(inp or "")


async def chat(turn: worker.Turn) -> dict[str, Any]:
    """Streams a reply word by word around one tool call (``count_words``) that runs and completes."""
    text = _text(turn)
    await turn.emit({"type": "delta", "text": "Counting your words. "})
    await turn.emit(
        {
            "type": "tool_call",
            "id": "count-1",
            "title": "count_words",
            "kind": "think",
            "status": "in_progress",
            "input": {"chars": len(text)},
        }
    )
    words = text.split()
    await turn.checkpoint()
    await turn.emit(
        {
            "type": "tool_call_update",
            "id": "count-1",
            "status": "completed",
            "output": {"words": len(words)},
            "text": f"{len(words)} words",
        }
    )
    for word in ["You", "wrote", f"{len(words)}", "words."]:
        await turn.emit({"type": "delta", "text": word + " "})
    return {"words": len(words)}


async def echo(turn: worker.Turn) -> None:
    """Sends the prompt's text back as one message chunk, however large."""
    await turn.emit({"type": "delta", "text": _text(turn)})


async def slow(turn: worker.Turn) -> dict[str, Any]:
    """Cooperative: starts a ``sleep`` tool call and sleeps ``seconds`` (default 60, or the prompt's
    text if it is a number) in awaits, so a cancel stops it at once."""
    try:
        seconds = float(_text(turn))
    except ValueError:
        seconds = 60.0
    await turn.emit({"type": "delta", "text": f"Sleeping {seconds:g}s. "})
    await turn.emit(
        {
            "type": "tool_call",
            "id": "sleep-1",
            "title": f"sleep {seconds:g}s",
            "kind": "execute",
            "status": "in_progress",
            "input": {"seconds": seconds},
        }
    )
    await anyio.sleep(seconds)
    await turn.emit({"type": "tool_call_update", "id": "sleep-1", "status": "completed"})
    return {"slept": seconds}


async def stubborn(turn: worker.Turn) -> None:
    """Ignores cancellation: starts a tool call, then spins without ever awaiting. Only the
    supervisor's escalation (SIGTERM after the grace) stops it."""
    await turn.emit({"type": "delta", "text": "Working, and not listening. "})
    await turn.emit(
        {"type": "tool_call", "id": "spin-1", "title": "spin", "kind": "execute", "status": "in_progress"}
    )
    x = 0
    while True:
        x += 1


_CHILD = "import sys; sys.stdout.write('child says hi on stdout\\n'); sys.stdout.flush()"


async def noisy(turn: worker.Turn) -> dict[str, Any]:
    """Misbehaves on the standard streams: prints, writes fd 1 directly, has a child print, and
    reads stdin. None of it may reach the ACP channel; then it replies normally."""
    print("agent print() on stdout", flush=True)
    os.write(1, b"agent raw write on fd 1\n")
    sys.stderr.write("agent on stderr\n")
    subprocess.run([sys.executable, "-c", _CHILD], check=True)  # noqa: ASYNC221 (blocking is the point)
    stolen = sys.stdin.read()  # must be empty: the protocol's stdin is not shared
    await turn.emit({"type": "delta", "text": f"still clean (read {len(stolen)} bytes from stdin)"})
    return {"stdin_bytes": len(stolen)}


def sync_reply(turn: worker.Turn) -> str:
    """A plain ``def`` agent: its returned string becomes the reply (no streaming)."""
    return f"you said: {_text(turn)}"
