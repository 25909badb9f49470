"""turnpool's worker side: the process that runs turns, and the API agents are written against.

Layers: ``_turn`` (``Turn``, ``CancelSignal``: what an agent sees), ``_errors``, ``_tree``
(process-tree facts: prctl, freeze, list, signal), ``_guards`` (the worker process's
safety: parent death, the guardian, tree kill, the life pipe), ``_loop`` (the connection and the
turn runner), ``_main`` (the entry point of ``python -m worker``), ``_isolated`` / ``_toolproc`` /
``_toolchild`` (a tool call in its own process: ``isolated``, ``run_command``), ``agent`` (an agent loop with
cancellation checkpoints). Never imports ``supervisor``.
"""

from ._errors import SpawnError, TurnCancelled, WorkerError
from ._isolated import arun_command, current_call_cancelled, isolated, run_command
from ._toolerrors import CommandResult, ToolCrashed, ToolIsolationError, ToolKilled
from ._turn import CancelSignal, Turn

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
