"""turnpool's worker side: the process that runs turns, and the API agents are written against.

Layers: ``_turn`` (``Turn``, ``CancelSignal``: what an agent sees), ``_errors``, ``_tree``
(process-tree facts: prctl, freeze, list, signal), ``_guards`` (the worker process's
safety: parent death, the guardian, tree kill, the life pipe), ``_loop`` (the connection and the
turn runner), ``_main`` (the entry point of ``python -m worker``), ``agent`` (an agent loop with cancellation
checkpoints). Never imports ``supervisor``.
"""

from ._errors import SpawnError, TurnCancelled, WorkerError
from ._turn import CancelSignal, Turn

__all__ = ["CancelSignal", "SpawnError", "Turn", "TurnCancelled", "WorkerError"]
