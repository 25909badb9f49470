"""turnpool's worker side: the process that runs turns, and the API agents are written against.

Layers: ``_turn`` (``Turn``, ``CancelSignal``: what an agent sees), ``_errors``, ``_tree``
(process-tree facts: prctl, freeze, list, signal), ``_guards`` (the worker process's
safety: parent death, the guardian, tree kill, the life pipe), ``_loop`` (the connection and the
turn runner), ``_main`` (the entry point of ``python -m worker``), ``_isolated`` / ``_toolproc`` /
``_toolchild`` (a tool call in its own process: ``isolated``, ``run_command``), ``agent`` (an agent loop with
cancellation checkpoints). Never imports ``supervisor``.

WORKER-LAZY: each public name is imported on first use (PEP 562), so that ``import worker`` alone costs
nothing and a process that only uses ``isolated`` (an isolated call's template: TOOL-WARM) never
imports the turn runner, its event loop or ZeroMQ. The zygote resolves them all before it forks
(``_load_all``), so that no worker imports after its fork.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._errors import SpawnError, TurnCancelled, WorkerError
    from ._isolated import arun_command, current_call_cancelled, isolated, run_command
    from ._toolerrors import CommandResult, ToolCrashed, ToolIsolationError, ToolKilled
    from ._turn import CancelSignal, Turn

# Where each public name lives.
_HOME = {
    "CancelSignal": "_turn",
    "CommandResult": "_toolerrors",
    "SpawnError": "_errors",
    "ToolCrashed": "_toolerrors",
    "ToolIsolationError": "_toolerrors",
    "ToolKilled": "_toolerrors",
    "Turn": "_turn",
    "TurnCancelled": "_errors",
    "WorkerError": "_errors",
    "arun_command": "_isolated",
    "current_call_cancelled": "_isolated",
    "isolated": "_isolated",
    "run_command": "_isolated",
}

__all__ = [
    "CancelSignal",
    "CommandResult",
    "SpawnError",
    "ToolCrashed",
    "ToolIsolationError",
    "ToolKilled",
    "Turn",
    "TurnCancelled",
    "WorkerError",
    "arun_command",
    "current_call_cancelled",
    "isolated",
    "run_command",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # once: the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _load_all() -> None:
    """Import every public name now (the zygote, before it forks: WORKER-LAZY)."""
    for name in __all__:
        __getattr__(name)
