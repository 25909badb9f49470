"""The engine's turn policy as a public face, for unit tests and tools that drive it without
processes: a fake link (a send callback that records), a fake pool (a dict of ``WorkerSlot``), and a
manual clock (``Timers(clock)`` with ``Timers.fire_due``). Not user API: the user API is
``supervisor.__all__``; these names may change with the engine (like ``supervisor.lowlevel``).

- ``TurnBook``: the turn table, the queue and their counters (``queued()``: the queue-depth figure).
- ``EngineOptions``: ``Supervisor(...)``'s arguments as one frozen value (``EngineOptions()`` has
  the defaults; ``EngineOptions.checked`` validates as ``Supervisor`` does).
- ``MOVES``, ``move``, ``IllegalMove``, ``first_cause``, ``mark_started``, ``escalated``: a turn's
  states and the moves allowed between them (TURN-STATES), the first cause (TURN-FIRST-CAUSE), the start, the
  ladder's step; ``gate_recorded``, ``gate_cleared``: a journal's rows committed for a turn (JOURNAL-GATE).
- The parts, each built from its collaborators as ``Supervisor.__init__`` builds them: ``Admission``,
  ``Dispatcher``, ``Escalation``, ``Finisher``, ``ChildTurns``; ``Hooks``; ``Timers``.
- ``TurnRecord``, ``TurnTable``, ``TurnQueue``, ``WorkerSlot``: the records they work on.
"""

from ._engine.admission import Admission
from ._engine.book import TurnBook
from ._engine.children import ChildTurns
from ._engine.dispatch import Dispatcher
from ._engine.ending import Finisher
from ._engine.escalation import Escalation
from ._engine.hooks import Hooks
from ._engine.pool import WorkerSlot
from ._engine.settings import EngineOptions
from ._engine.states import (
    MOVES,
    IllegalMove,
    escalated,
    first_cause,
    gate_cleared,
    gate_recorded,
    mark_started,
    move,
)
from ._engine.timers import Timers
from ._engine.turns import TurnQueue, TurnRecord, TurnTable

__all__ = [
    "MOVES",
    "Admission",
    "ChildTurns",
    "Dispatcher",
    "EngineOptions",
    "Escalation",
    "Finisher",
    "Hooks",
    "IllegalMove",
    "Timers",
    "TurnBook",
    "TurnQueue",
    "TurnRecord",
    "TurnTable",
    "WorkerSlot",
    "escalated",
    "first_cause",
    "gate_cleared",
    "gate_recorded",
    "mark_started",
    "move",
]
