"""The supervisor package's errors: one base, named for what broke."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wire.client_link import ErrorCode


SHOWN_ID_CHARS = 64  # an id longer than this is cut in error messages (its length is said)


def shown_id(value: object) -> str:
    """``repr(value)`` for an error message, cut when long: a 5000-character id must not flood a
    terminal or a log line; its start and its length are enough to recognise it."""
    text = repr(value)
    if not isinstance(value, str) or len(value) <= SHOWN_ID_CHARS:
        return text
    return f"{value[:SHOWN_ID_CHARS]!r}… ({len(value)} characters)"


class TurnpoolError(Exception):
    """Base of every error turnpool raises at its API boundary."""


class QueueFull(TurnpoolError):
    """Raised by ``submit``/``run`` when the bounded queue already holds ``max_queue`` turns."""


class SupervisorClosed(TurnpoolError):
    """Raised by ``submit``, ``run``, ``cancel`` and friends once the supervisor is shutting down or
    closed."""


class UnknownTurn(TurnpoolError, LookupError):
    """Raised by ``handle``, ``cancel`` and ``result`` for a turn id the supervisor does not know."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(f"unknown turn id {shown_id(turn_id)}")
        self.turn_id = turn_id

    def __reduce__(self) -> tuple[type[UnknownTurn], tuple[str]]:
        # Pickled (a Ray node supervisor's answer) it is rebuilt from its id, not its message.
        return (type(self), (self.turn_id,))

    def __str__(self) -> str:  # LookupError would repr() the message
        return str(self.args[0])


class InvalidAgent(TurnpoolError, ValueError):
    """Raised by ``submit``/``run`` when the agent is not written ``"package.module:attr"``."""


class AgentNotAllowed(InvalidAgent):
    """Raised by ``submit``/``run`` (and refused to ``turn.spawn``) when the agent is well written but
    matches none of the pool's ``allow_agents`` patterns (``serve --allow-agent``): it is never
    imported. Through a daemon the client raises ``InvalidAgent`` with the same message."""


class TurnIdConflict(TurnpoolError, ValueError):
    """Raised by ``submit``/``run`` (``Supervisor``, ``Client`` and the blocking twins) when the
    ``turn_id`` is already used by another request: another agent, input or session (``differs``
    names which, the message too). The same id with the same request is idempotent instead: the
    existing turn, never run twice. Ids the daemon knows only from its journal count too."""

    FIELDS = ("agent", "input", "session")

    def __init__(self, turn_id: str, differs: tuple[str, ...] = (), message: str | None = None) -> None:
        shown = turn_id if len(turn_id) <= 80 else turn_id[:77] + "..."
        super().__init__(
            message
            or f"turn id {shown!r} is already used by another request: its {' and '.join(differs)} "
            f"{'differs' if len(differs) == 1 else 'differ'}. A turn_id names one request (the same "
            "agent, input and session): resubmitting that request returns the existing turn; use "
            "a new id for a new request"
        )
        self.turn_id = turn_id
        self.differs = differs

    @classmethod
    def from_message(cls, turn_id: str, message: str) -> TurnIdConflict:
        """The error a daemon described (``turn_id_conflict``), its fields read back from the text."""
        said = message.split("another request: its ", 1)[-1].split(". ", 1)[0]
        return cls(turn_id, tuple(f for f in cls.FIELDS if f in said.split()), message)


class WorkerStartError(TurnpoolError):
    """Raised by ``Supervisor.__aenter__`` when workers cannot be started (the reason is given)."""


class ProtocolError(TurnpoolError):
    """Raised by ``Client.connect`` when the daemon speaks another protocol version."""


class DaemonUnavailable(TurnpoolError, ConnectionError):
    """Raised by ``Client`` calls when no daemon answers at the endpoint (named in the message)."""


class AuthenticationFailed(DaemonUnavailable):
    """Raised by ``Client.connect`` (and ``SyncClient``) when the daemon refused this client's CURVE
    key (not in its ``--curve-clients`` directory) or the client does not hold the daemon's key:
    a daemon is there, but it will not talk to this client."""


class FollowerDropped(TurnpoolError):
    """Raised by ``events()`` on a ``Client`` handle when the daemon dropped this follower: it fell
    further behind than the events the daemon keeps per turn (``--max-events``), or its client
    stopped reading until its send queue filled. The events it missed are gone; following again
    resumes from the oldest event still kept. The turn is unaffected."""


class DaemonShuttingDown(SupervisorClosed):
    """Raised by ``Client.submit``/``run`` when the serve daemon is draining or disposing."""


class DaemonAlreadyRunning(TurnpoolError):
    """Raised by ``Daemon.serve`` (``turnpool serve``) when a live daemon already holds the endpoint."""


class JournalUnavailable(TurnpoolError):
    """Raised by ``Client.submit``/``run`` (and ``SyncClient``'s) when the serve daemon cannot write its
    journal (disk full, read-only, file deleted or replaced): it acknowledges nothing it cannot make
    durable, so the turn was not accepted. The message names the journal's error."""


# The error code of each way a submit is refused on the client link, both ways in one table: the
# daemon answers with the code of the first class the exception is an instance of (subclasses
# before their bases), and the client raises the first class listed for a code.
SUBMIT_ERROR_CODES: tuple[tuple[type[Exception], ErrorCode], ...] = (
    (InvalidAgent, "invalid_agent"),
    (QueueFull, "queue_full"),
    (DaemonShuttingDown, "shutting_down"),
    (SupervisorClosed, "shutting_down"),
    (JournalUnavailable, "journal_unavailable"),
    (TurnIdConflict, "turn_id_conflict"),  # API-TURN-ID (client protocol 3; older clients read bad_value)
    (TypeError, "bad_type"),
    (ValueError, "bad_value"),
)
