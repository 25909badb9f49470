"""The supervisor package's errors: one base, named for what broke."""

from __future__ import annotations


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
        super().__init__(f"unknown turn id {turn_id!r}")
        self.turn_id = turn_id

    def __reduce__(self) -> tuple[type[UnknownTurn], tuple[str]]:
        # Pickled (a Ray node supervisor's answer) it is rebuilt from its id, not its message.
        return (type(self), (self.turn_id,))

    def __str__(self) -> str:  # LookupError would repr() the message
        return str(self.args[0])


class InvalidAgent(TurnpoolError, ValueError):
    """Raised by ``submit``/``run`` when the agent is not written ``"package.module:attr"``."""


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
