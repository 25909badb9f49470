"""The memory watchdog: cancels a turn whose worker tree passed ``max_rss_mb``.

Every ``rss_interval`` seconds it measures the proportional set size (PSS) of the tree of each
worker running a turn not already cancelled, and cancels that turn with cause ``memory`` when it is
over the limit; the escalation ladder does the rest. A turn whose ``Started`` is stuck behind a
blocked agent is found through its start marker (LADDER-EARLY). Runs as one task in the supervisor's task
group, only when ``max_rss_mb`` is set.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

import wire

from . import procs as _procs

if TYPE_CHECKING:
    from .supervisor import Supervisor

log = logging.getLogger("turnpool.supervisor")


# LADDER-CAUSES, MEM-PSS: memory is just a cause (memory), measured as the tree's PSS.
class MemoryWatchdog:
    """Measures each busy worker's tree and cancels a turn over the limit (cause ``memory``)."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    async def run(self) -> None:
        """Watch until cancelled (with the supervisor's task group)."""
        sup = self.sup
        assert sup.max_rss_mb is not None
        limit = sup.max_rss_mb * 2**20
        while True:
            await anyio.sleep(sup.rss_interval)
            for slot in list(sup._slots.values()):
                turn = slot.turn
                if turn is None and slot.state == "busy":
                    turn = sup._note_marked_start(slot)  # LADDER-EARLY: running, though its Started is stuck
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
                        log.warning(
                            "turn %s: worker tree of pid %s passed %s MiB", turn.id, slot.pid, sup.max_rss_mb
                        )
                        sup._cancel(turn, wire.MEMORY)
