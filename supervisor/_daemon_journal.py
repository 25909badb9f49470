"""Connects a ``Journal`` to a ``Daemon``'s hook sites: accepted (acknowledged after commit), started, ended.

Recording only: restart recovery (re-queueing what was queued, ending what was running) is not
done here yet; unfinished turns found at start are reported in the log.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio
import msgspec

from wire import TurnResult

from ._daemon import Daemon
from ._journal import Journal
from ._turns import TurnRecord

log = logging.getLogger("turnpool.daemon")


def attach_journal(daemon: Daemon, journal: Journal) -> None:
    """Record every turn the daemon accepts in ``journal``. Call before ``daemon.serve()``."""
    unfinished = journal.recover()
    if unfinished:
        log.warning("journal %s holds %d turns left unfinished by a previous daemon; they are not recovered",
                    journal.path, len(unfinished))

    def accepted(turn: TurnRecord) -> Any:
        loop = asyncio.get_running_loop()
        committed = anyio.Event()
        journal.accepted(turn, lambda: loop.call_soon_threadsafe(committed.set))
        return committed.wait()  # the submit is acknowledged once the row is committed

    def started(turn: TurnRecord, pid: int) -> None:
        journal.started(turn.id, pid)

    def ended(turn: TurnRecord, result: TurnResult) -> None:
        journal.ended(result)

    def event(turn: TurnRecord, data: msgspec.Raw) -> None:
        journal.event(turn.id, turn.events_base + len(turn.events) - 1, bytes(data))

    daemon.accept_hooks.append(accepted)
    daemon.start_hooks.append(started)
    daemon.end_hooks.append(ended)
    if journal.journal_events:
        daemon.event_hooks.append(event)
