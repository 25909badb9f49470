"""A turn's life as data: its states, the moves allowed between them, and the few facts that change
with them (the first cause, the start, the ladder's step).

TURN-STATES: every change of a ``TurnRecord``'s ``state`` goes through ``move``, which refuses a move the
table below does not allow (``IllegalMove``: a bug in the engine, never bad input). The states:

* ``queued``  — accepted, waiting for a worker (in the ``TurnQueue``, or taken back from one);
* ``handed``  — given to a worker ahead of its start (TURN-HANDED: still counts as queued);
* ``running`` — its worker reported it started (``Started``, or its start marker: LADDER-EARLY);
* ``ending``  — its result is built and held until its live children end (TURN-PARENT);
* ``ended``   — its one result is delivered (TURN-ONE-OUTCOME);
* ``kept``    — set aside at a daemon's graceful stop for its journal to run at the next start
  (DAEMON-KEEP-QUEUED); it never ends here.

A turn is created ``queued`` (``TurnRecord``); a result restored from a journal is created ``queued``
and moved straight to ``ended``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from wire import Cause

    from .turns import TurnRecord

TurnState = Literal["queued", "handed", "running", "ending", "ended", "kept"]

# TURN-STATES: the allowed moves, from each state.
MOVES: dict[str, frozenset[str]] = {
    "queued": frozenset({"handed", "ended", "kept"}),  # handed to a worker; aborted unstarted; set aside
    "handed": frozenset({"queued", "running"}),  # given back (revoked, taken back, its worker died); started
    # held behind live children; ended; LOOP-RESUME: its worker died and a retry=True turn runs again
    "running": frozenset({"ending", "ended", "queued"}),
    "ending": frozenset({"ended"}),  # its last child ended
    "ended": frozenset(),
    "kept": frozenset(),
}

# The states in which a turn still counts as waiting for a worker (``TurnBook.queued``: TURN-HANDED).
WAITING = frozenset({"queued", "handed"})
# The states in which a turn is live: accepted, not ended, not set aside.
LIVE = frozenset({"queued", "handed", "running", "ending"})


class IllegalMove(AssertionError):
    """A move the table does not allow: a bug in the engine."""


def move(turn: TurnRecord, to: TurnState) -> None:
    """Move ``turn`` to state ``to``; raises ``IllegalMove`` if ``MOVES`` does not allow it."""
    if to not in MOVES[turn.state]:
        raise IllegalMove(f"turn {turn.id}: {turn.state} → {to} is not a move a turn can make")
    turn.state = to


# TURN-FIRST-CAUSE: first cause wins; an ended turn keeps its cause.
def first_cause(turn: TurnRecord, cause: Cause) -> bool:
    """Give ``turn`` its cause if it has none yet; whether this one won."""
    if turn.cause is not None:
        return False
    turn.cause = cause
    return True


def mark_started(turn: TurnRecord, at: float) -> bool:
    """``turn`` ran from ``at`` (the first start counts; a repeat changes nothing); whether this was it."""
    if turn.started:
        return False
    turn.started = True
    turn.started_at = at
    return True


def escalated(turn: TurnRecord, step: int, now: float) -> bool:
    """The ladder's signal ``step`` (1: SIGTERM, 2: SIGKILL) went to ``turn``'s worker tree; whether
    this was the kill decision (LADDER-HANDOVER: the first signal; from then on the outcome is ``killed``)."""
    decided = not turn.escalation
    if decided:
        turn.escalated_at = now
    turn.escalation = step
    return decided


# JOURNAL-GATE: the dispatch gate's facts about a turn (``TurnRecord``: ``written`` → ``recorded`` for its
# accept row, ``clearing`` → ``dispatchable`` for its "may run" row). Without a gate all are set from the
# start.
def gate_hold(turn: TurnRecord, readmit: bool) -> None:
    """Behind a journal's gate: held until its rows are committed (a readmitted turn's accept row
    already is)."""
    turn.recorded = turn.written = readmit
    turn.dispatchable = False


def gate_written(turn: TurnRecord) -> None:
    """JOURNAL-GATE-SHARE: its accept row is handed to the journal (committed or not)."""
    turn.written = True


def gate_recorded(turn: TurnRecord) -> None:
    """JOURNAL-GATE: its accept row is committed."""
    turn.recorded = turn.written = True


def gate_clearing(turn: TurnRecord) -> None:
    """JOURNAL-GATE: its "may run" row is being written."""
    turn.clearing = True


def gate_cleared(turn: TurnRecord) -> None:
    """JOURNAL-GATE: its "may run" row is committed: it may be handed to a worker (once recorded)."""
    turn.clearing = False
    turn.dispatchable = True
