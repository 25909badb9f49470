"""Connects a ``Journal`` to a ``Daemon``: records every turn, and recovers after a restart.

Recording: a client's submit is acknowledged only once its row is committed; child turns
(``turn.spawn``) are recorded as they are accepted; starts and ends as they happen.

Recovery, before clients can connect:

* turns that ended are registered again, so their results can be fetched by id;
* turns that were queued run again, in their original order (sessions keep their order);
* turns that were running when the daemon died end ``crashed`` (the supervisor was lost),
  unless they were submitted with ``retry=True``: those are queued again, ``attempts`` + 1;
* unfinished child turns end with their parent gone: ``aborted`` (cause ``parent``) if they
  never started, ``crashed`` if they were running — a child never outlives its parent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import anyio
import msgspec

import wire
from wire import TurnError, TurnResult

from ._core import Supervisor
from ._daemon import Daemon
from ._journal import Journal, RecoveredTurn
from ._turns import TurnRecord

log = logging.getLogger("turnpool.daemon")

SUPERVISOR_LOST = TurnError("SupervisorLost", "the daemon stopped while this turn was running")


def attach_journal(daemon: Daemon, journal: Journal) -> None:
    """Record every turn the daemon accepts in ``journal`` and recover unfinished ones at start.
    Call before ``daemon.serve()``."""

    def accepted(turn: TurnRecord) -> Any:
        loop = asyncio.get_running_loop()
        committed = anyio.Event()
        journal.accepted(turn, lambda: loop.call_soon_threadsafe(committed.set))
        return committed.wait()  # the submit is acknowledged once the row is committed

    def child_accepted(turn: TurnRecord) -> None:
        if turn.parent is not None:  # clients' turns are recorded (and gated) by ``accepted``
            journal.accepted(turn)

    def started(turn: TurnRecord, pid: int) -> None:
        journal.started(turn.id, pid)

    def ended(turn: TurnRecord, result: TurnResult) -> None:
        journal.ended(result)

    def event(turn: TurnRecord, data: msgspec.Raw) -> None:
        journal.event(turn.id, turn.events_base + len(turn.events) - 1, bytes(data))

    def startup(sup: Supervisor) -> None:
        recover(sup, journal)
        sup._accept_hooks.append(child_accepted)

    daemon.startup_hooks.append(startup)
    daemon.accept_hooks.append(accepted)
    daemon.start_hooks.append(started)
    daemon.end_hooks.append(ended)
    if journal.journal_events:
        daemon.event_hooks.append(event)


def _lost(turn: RecoveredTurn, outcome: str, cause: wire.Cause | None, error: TurnError | None) -> TurnResult:
    now = time.time()
    return TurnResult(turn_id=turn.turn_id, outcome=outcome, cause=cause, error=error,  # type: ignore[arg-type]
                      started=turn.state == "running", session=turn.session, parent=turn.parent,
                      agent=turn.agent, attempts=turn.attempts, ended_at=now)


def recover(sup: Supervisor, journal: Journal) -> dict[str, int]:
    """Bring ``sup`` back to what the journal says; returns counts of what was done."""
    counts = {"results": 0, "requeued": 0, "retried": 0, "crashed": 0, "orphaned": 0}
    for result in journal.recent_results(sup.keep_results):
        sup._restore_result(result)
        counts["results"] += 1
    for turn in journal.recover():
        if turn.parent is not None:
            if turn.state == "running":
                result = _lost(turn, "crashed", None, SUPERVISOR_LOST)
            else:
                result = _lost(turn, "aborted", wire.PARENT, None)
            journal.ended(result)
            sup._restore_result(result)
            counts["orphaned"] += 1
            continue
        attempts = turn.attempts
        if turn.state == "running":
            if not turn.retry:
                result = _lost(turn, "crashed", None, SUPERVISOR_LOST)
                journal.ended(result)
                sup._restore_result(result)
                counts["crashed"] += 1
                continue
            attempts += 1
            journal.requeued(turn.turn_id, attempts)
            counts["retried"] += 1
        else:
            counts["requeued"] += 1
        sup._accept(turn.agent, msgspec.Raw(turn.input), session=turn.session, timeout=turn.timeout,
                    grace=turn.grace, kill_after=turn.kill_after, turn_id=turn.turn_id, parent=None,
                    retry=turn.retry, attempts=attempts)
    journal.flush()
    if any(counts[k] for k in ("requeued", "retried", "crashed", "orphaned")):
        log.warning("journal %s: recovered after a restart: %s", journal.path, counts)
    return counts
