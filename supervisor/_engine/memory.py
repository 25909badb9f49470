"""The memory watchdog: cancels a turn whose worker tree passed ``max_rss_mb``.

Every ``rss_interval`` seconds it measures the proportional set size (PSS) of the tree of each
worker running a turn not already cancelled, and cancels that turn with cause ``memory`` when it is
over the limit; the escalation ladder does the rest. A turn whose ``Started`` is stuck behind a
blocked agent is found through its start marker (LADDER-EARLY). Runs as one task in the supervisor's task
group, only when ``max_rss_mb`` is set.

Its collaborators: the pool's slots, the ``EngineOptions`` (``max_rss_mb``, ``rss_interval``), the
``Dispatcher`` (start notes) and the ``Escalation`` (the cancel).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

import wire

from . import procs as _procs

if TYPE_CHECKING:
    from .dispatch import Dispatcher
    from .escalation import Escalation
    from .pool import WorkerSlot
    from .settings import EngineOptions

log = logging.getLogger("turnpool.supervisor")


# LADDER-CAUSES, MEM-PSS: memory is just a cause (memory), measured as the tree's PSS.
class MemoryWatchdog:
    """Measures each busy worker's tree and cancels a turn over the limit (cause ``memory``)."""

    def __init__(
        self,
        slots: dict[str, WorkerSlot],
        options: EngineOptions,
        dispatcher: Dispatcher,
        escalation: Escalation,
    ) -> None:
        self.slots = slots  # the pool's slots (the same dict)
        self.options = options
        self.dispatcher = dispatcher
        self.escalation = escalation

    async def run(self) -> None:
        """Watch until cancelled (with the supervisor's task group)."""
        most = self.options.max_rss_mb
        assert most is not None
        limit = most * 2**20
        while True:
            await anyio.sleep(self.options.rss_interval)
            for slot in list(self.slots.values()):
                turn = slot.turn
                if turn is None and slot.state == "busy":
                    # LADDER-EARLY: running, though its Started is stuck
                    turn = self.dispatcher.note_marked_start(slot)
                if (
                    slot.state == "busy"
                    and turn is not None
                    and turn.state == "running"
                    and turn.cause is None
                ):
                    # PSS, not summed RSS: N forked children of a worker share its pages. Read in a
                    # thread: smaps_rollup walks page tables (≈ 0.1 ms per process, more when large).
                    used = await anyio.to_thread.run_sync(_procs.memory_of_tree, slot.pid)
                    if slot.turn is not turn or turn.cause is not None or turn.state != "running":
                        continue  # it moved on while we measured
                    if used > limit:
                        log.warning("turn %s: worker tree of pid %s passed %s MiB", turn.id, slot.pid, most)
                        self.escalation.cancel(turn, wire.MEMORY)
