"""Wire messages between the supervisor and its workers, and the turn result.

Every message is a frozen msgspec Struct with ``forbid_unknown_fields``; each direction has
one tagged union. Messages are encoded as msgpack arrays (``array_like``): the tag comes
first, then the fields in order. Evolve the schema only by appending fields with defaults.

Payloads that the supervisor never looks into (turn input, output, event data) travel as
``msgspec.Raw``: encoded once by whoever produced them, decoded once by whoever consumes
them, never re-encoded on the way through.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ._cause import Cause

PROTOCOL_VERSION = 1
NIL = msgspec.Raw(b"\xc0")  # msgpack nil, for Raw fields that carry nothing

Outcome = Literal["completed", "failed", "aborted", "killed", "crashed"]
WorkerOutcome = Literal["completed", "failed", "aborted"]
OUTCOMES: tuple[str, ...] = ("completed", "failed", "aborted", "killed", "crashed")


class TurnError(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Why a turn failed: the exception's type name and message (never a traceback)."""

    type: str
    message: str


class TurnResult(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How a turn ended. Exactly one per turn.

    ``outcome`` is one of ``completed``, ``failed``, ``aborted``, ``killed``, ``crashed``.
    ``cause`` is the winning cancellation cause (``None`` if the turn was never cancelled);
    ``started`` says whether a worker ever began the turn; ``exit_code`` is the worker's exit
    status when it was killed or crashed (negative: the signal number).
    """

    turn_id: str
    outcome: Outcome
    output: Any = None
    error: TurnError | None = None
    cause: Cause | None = None
    started: bool = False
    worker_pid: int | None = None
    exit_code: int | None = None
    queued_s: float = 0.0
    run_s: float = 0.0
    session: str | None = None
    parent: str | None = None
    agent: str = ""
    attempts: int = 1
    submitted_at: float = 0.0  # wall-clock (epoch seconds) times of the turn's life
    started_at: float | None = None
    ended_at: float = 0.0


class _Msg(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True, tag=True):
    pass


# ---- supervisor → worker -------------------------------------------------------------


class Run(_Msg, tag="run", frozen=True):
    """Start a turn. The worker answers ``Started`` then exactly one ``End``.

    LADDER-HEIR: a ``Run`` with ``after_pid`` is held: the worker starts it only once the process
    ``after_pid`` (whose start time, in clock ticks since boot as ``/proc/PID/stat`` field 22 gives
    it, is ``after_start``: a reused pid is another process) is gone, or on ``Proceed``."""

    turn_id: str
    agent: str
    input: msgspec.Raw
    session: str | None = None
    parent: str | None = None
    after_pid: int = 0
    after_start: int = 0
    trace: str | None = None  # W3C ``traceparent`` the agent's own spans nest under (OBS-TRACE)
    # LOOP-RESUME: the attempt this run is (1: the first) and, on a later attempt, the step records of
    # the earlier ones (a msgpack array of ``Step.record`` payloads, in ``seq`` order; NIL: none).
    attempt: int = 1
    steps: msgspec.Raw = NIL


class Abort(_Msg, tag="abort", frozen=True):
    """Cooperative stop for ``turn_id``; a worker not running that turn drops it."""

    turn_id: str
    cause: Cause


class SpawnReply(_Msg, tag="spawned", frozen=True):
    """Answer to a worker's ``Spawn``: the child's result, or why it could not run."""

    req: int
    result: TurnResult | None = None
    error: TurnError | None = None


class Shutdown(_Msg, tag="shutdown", frozen=True):
    """Idle worker: exit cleanly."""


class Revoke(_Msg, tag="revoke", frozen=True):
    """Give back ``turn_id`` if it was handed ahead and has not started (answered by ``Revoked``);
    a worker that already started it, or never had it, ignores this."""

    turn_id: str


class EndAck(_Msg, tag="end_ack", frozen=True):
    """The supervisor has this turn's ``End`` (sent when the ``End`` asked for it, see ``End.ack``)."""

    turn_id: str


class Proceed(_Msg, tag="proceed", frozen=True):
    """LADDER-HEIR: the supervisor saw the exit of the worker a held ``Run`` waits for: start it now
    (if it has not started already, or been dropped)."""

    turn_id: str


class StepAck(_Msg, tag="step_ack", frozen=True):
    """LOOP-STEP-DURABLE: every step record of ``turn_id`` up to ``seq`` is durable (a daemon's journal
    committed it); ``error``: record ``seq`` was refused (why), nothing after it was kept."""

    turn_id: str
    seq: int
    error: str | None = None


ToWorker = Run | Abort | SpawnReply | Shutdown | Revoke | EndAck | Proceed | StepAck


# ---- worker → supervisor -------------------------------------------------------------


class Ready(_Msg, tag="ready", frozen=True):
    """First message of a worker: proves with the per-spawn token that the supervisor started it."""

    pid: int
    token: str
    version: int


class Heartbeat(_Msg, tag="hb", frozen=True):
    pid: int


class Started(_Msg, tag="started", frozen=True):
    turn_id: str


class Event(_Msg, tag="event", frozen=True):
    turn_id: str
    data: msgspec.Raw


class End(_Msg, tag="end", frozen=True):
    """The one end of a turn as the worker saw it."""

    turn_id: str
    outcome: WorkerOutcome
    output: msgspec.Raw = NIL
    error: TurnError | None = None
    # The worker will start another turn it was handed only once the supervisor confirms this End
    # (``EndAck``): set when this turn's ``Started`` left in an earlier frame, so that a crash in
    # the next turn cannot lose this End while the supervisor believes this turn still running.
    ack: bool = False


class Spawn(_Msg, tag="spawn", frozen=True):
    """A running turn asks for a child turn (``turn.spawn``)."""

    req: int
    parent: str
    agent: str
    input: msgspec.Raw
    session: str | None = None
    timeout: float | None = None
    grace: float | None = None
    kill_after: float | None = None


class SpawnCancel(_Msg, tag="spawn_cancel", frozen=True):
    """The parent stopped awaiting its child: cancel the child (cause ``parent``)."""

    req: int


class Revoked(_Msg, tag="revoked", frozen=True):
    """Answer to ``Revoke``: the turn was dropped unstarted; the supervisor queues it again."""

    turn_id: str


class BadFrame(_Msg, tag="bad_frame", frozen=True):
    """The worker could not decode a frame from the supervisor."""

    reason: str


class Step(_Msg, tag="step", frozen=True):
    """LOOP-STEP-DURABLE: one step record of a running turn (``worker.agent``'s records: a model response,
    a tool call started, a tool call completed), ``seq`` counting from 0 across the turn's attempts;
    ``step`` is the model step it belongs to, ``kind`` what it records. The supervisor keeps it
    (a daemon: in its journal) and answers ``StepAck`` once it is durable."""

    turn_id: str
    seq: int
    step: int
    kind: str
    record: msgspec.Raw


FromWorker = Ready | Heartbeat | Started | Event | End | Spawn | SpawnCancel | BadFrame | Revoked | Step
