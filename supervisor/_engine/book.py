"""The turn book: the turn table, the queue and the counters they share, in one object every part
that reads or writes turns is given (instead of the ``Supervisor``).

``table`` holds every turn's record (``TurnTable``: the live ones and the retained ended ones);
``queue`` the turns waiting for a worker (``TurnQueue``). The counters are the engine's arithmetic
about them, each changed in one place: ``active`` (accepted, not ended: admission adds, delivery or
DAEMON-KEEP-QUEUED takes), ``running`` (started, not ended: ``Dispatcher.start_turn`` adds,
``Finisher.finish`` takes), ``handed`` (handed ahead, not started: they still count as queued, TURN-HANDED),
``lent`` (slots lent by parents waiting on a child, TURN-LEND) and ``input_bytes`` (the inputs of turns not
ended, MEM-INPUTS). ``phase`` is the engine's (``new`` → ``running`` → ``closing`` → ``closed``: only a
running engine admits turns), ``disposing`` is set when disposal begins (TURN-DISPOSAL: disposal wins) and
``wall_offset`` turns the loop clock's readings into epoch seconds.
"""

from __future__ import annotations

from typing import Literal

from .turns import TurnQueue, TurnTable

Phase = Literal["new", "running", "closing", "closed"]


class TurnBook:
    """The turn table, the queue and their counters; see the module docstring."""

    __slots__ = (
        "active",
        "disposing",
        "handed",
        "input_bytes",
        "lent",
        "phase",
        "queue",
        "running",
        "table",
        "wall_offset",
    )

    def __init__(self, table: TurnTable, queue: TurnQueue) -> None:
        self.table = table
        self.queue = queue
        self.active = 0  # turns accepted and not yet ended
        self.running = 0  # turns a worker reported started (or its marker did) and not yet ended
        self.handed = 0  # turns handed ahead to a worker, not started yet (they count as queued)
        self.lent = 0  # slots lent by parents waiting on a spawned child
        self.input_bytes = 0  # the inputs of turns not ended: added at admission, taken at delivery
        self.phase: Phase = "new"
        self.disposing = False
        self.wall_offset = 0.0

    def queued(self) -> int:
        """Turns waiting for a worker: in the queue, or handed ahead and not started (TURN-HANDED)."""
        return len(self.queue) + self.handed
