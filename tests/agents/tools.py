"""Agents used only by tests/test_isolated_tools.py (``tests.agents.tools:NAME``): an AgentLoop with
a scripted model whose tools are ``worker.isolated`` calls, run in a real worker."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path
from typing import Any

import worker
from worker.agent import AgentLoop, Finish, Response, ScriptedModel, TextDelta, ToolCall, tool


def hog() -> int:
    return len(b"\x01" * (2 << 30))


def _mark(pidfile: str) -> None:
    Path(pidfile).write_text(str(os.getpid()))


def coop(pidfile: str) -> str:
    _mark(pidfile)
    try:
        while not worker.current_call_cancelled():
            time.sleep(0.01)  # allowed: the tool's own work between its cancellation checks
    except KeyboardInterrupt:
        pass
    return "stopped"


def stubborn(pidfile: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    _mark(pidfile)
    while True:
        time.sleep(1)  # allowed: the tool under test blocks for good


def csleep(pidfile: str) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    _mark(pidfile)
    ctypes.CDLL("libc.so.6").sleep(1000)  # allowed: the tool under test blocks in C until it is killed


async def memory(turn: worker.Turn) -> Any:
    """The model asks for a tool that allocates 2 GiB under memory_mb=256, is told, and answers."""
    model = ScriptedModel(
        [
            Response([ToolCall("c1", "hog", {}), Finish("tool_calls")]),
            Response([TextDelta("it was too big"), Finish("stop")]),
        ]
    )
    loop = AgentLoop(model, tools=[tool(worker.isolated(hog, memory_mb=256), name="hog")], turn=turn)
    result = await loop.run("allocate")
    return {"text": getattr(result, "text", None), "history": [repr(m) for m in loop.history]}


async def three(turn: worker.Turn) -> Any:
    """Three isolated calls at once (cooperative, SIGTERM-ignoring, a C sleep) that never end."""
    folder = turn.input["dir"]
    opts = {"grace": 0.5, "kill_after": 0.5, "timeout": 120}
    tools = [tool(worker.isolated(fn, **opts), name=fn.__name__) for fn in (coop, stubborn, csleep)]
    calls = [ToolCall(fn, fn, {"pidfile": f"{folder}/{fn}"}) for fn in ("coop", "stubborn", "csleep")]
    model = ScriptedModel([Response([*calls, Finish("tool_calls")]), Response([Finish("stop")])])
    await AgentLoop(model, tools=tools, turn=turn).run("go")
    return "unreachable"


def sync_stubborn(turn: worker.Turn) -> Any:
    """A plain ``def`` agent (run in a thread) blocked in an isolated call that ignores SIGINT and
    SIGTERM: the turn's abort reaches the call's ladder, and the agent then honours the cancel."""
    try:
        worker.isolated(stubborn, grace=0.3, kill_after=0.3, timeout=120)(f"{turn.input['dir']}/stubborn")
    except worker.ToolKilled as exc:
        if exc.reason == "cancelled":
            turn.signal.raise_if_cancelled()
        raise
    return "unreachable"


def parent() -> int:
    return os.getppid()


def whose_calls(turn: worker.Turn) -> Any:
    """Who forked this turn's isolated call and who ran the turn (TOOL-WARM: a template, not the worker)."""
    return {"parent": worker.isolated(parent)(), "worker": os.getpid()}


def command_parents(turn: worker.Turn) -> Any:
    """The parent of each of three commands, and that parent's parent (TOOL-SPAWNER: a spawner, the
    child of the commands template), and who ran the turn."""
    out = []
    for _ in range(3):
        ppid = int(worker.run_command(["sh", "-c", "echo $PPID"]).stdout)
        with open(f"/proc/{ppid}/stat") as f:
            grand = int(f.read().rsplit(")", 1)[1].split()[1])
        out.append([ppid, grand])
    return {"parents": out, "worker": os.getpid()}


def sleeper(pidfile: str) -> None:
    _mark(pidfile)
    while True:
        time.sleep(1)  # allowed: the tool under test blocks for good
