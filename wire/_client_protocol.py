"""Messages between a client and the serve daemon.

One ZeroMQ message carries one message (a msgpack array: tag first, then the fields). The
client opens with ``Hello`` and the daemon answers ``Welcome`` with its protocol version and
the largest message its socket accepts, so a client refuses an oversized request itself
instead of being disconnected by ``MAXMSGSIZE`` without a word.

Every request carries ``req``, an id chosen by the client and unique on its connection: the
daemon echoes it in every reply, so many requests (and many event streams) can be in flight on
one DEALER. A ``Follow`` is answered by zero or more ``Events`` then one ``FollowEnd`` (or an
``Error``). Anything that goes wrong is an ``Error`` with a closed ``code`` and a message; a
frame that does not decode gets ``Error(req=0, code="malformed")``.

A client that stops waiting (its task was cancelled) sends ``Abandon`` so the daemon frees the
request; the turn is never touched. ``Ok(req=0)`` is a liveness probe the daemon may send to a
client at any time (it learns from the socket whether the client is still there): clients ignore
a reply whose ``req`` they did not ask for.

Versions: the client sends its version in ``Hello``; the daemon accepts every version from
``MIN_CLIENT_PROTOCOL_VERSION`` to ``CLIENT_PROTOCOL_VERSION`` and answers ``Welcome`` with the
version both speak; the protocol grows by addition (CLIENT-PROTOCOL). Version 3 is the first released one.

Batches (rule CLIENT-BATCHES of docs/design.md): the client's ``Hello`` is a single message; from then on the
client sends batches — msgpack arrays of messages, handled in order — and the daemon answers in
batches (its ``Welcome`` included). A client packs the requests made in one pass of its event
loop (a thousand concurrent submits: a few frames), the daemon the replies made in one pass of its
own (acks, results and events coalesced per client). A single message is read wherever a batch
may come (the daemon's liveness probe, errors it was owed, replies to a peer before its Hello).
A follower that fell behind the turn's buffer is not ended: the next ``Events`` simply starts at
a higher ``seq``, and the client yields ``EventsDropped`` for the gap.
``decode_*_frame`` tells a batch from a single message by its first element (an array, not a tag).

Turn input and event data travel as ``msgspec.Raw``: the client encodes them once, the daemon
hands the bytes to its supervisor and its workers untouched.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec

from ._cause import Cause
from ._worker_protocol import TurnResult

CLIENT_PROTOCOL_VERSION = 3
MIN_CLIENT_PROTOCOL_VERSION = 3

ErrorCode = Literal[
    "malformed",  # the frame did not decode (or was not a single frame)
    "protocol",  # the client speaks another protocol version
    "unknown_turn",  # no such turn id (never accepted, or its result was evicted)
    "invalid_agent",  # the agent is not written "package.module:attr"
    "bad_type",  # an argument of the wrong type
    "bad_value",  # an argument with a value out of range
    "queue_full",  # the daemon's queue already holds max_queue turns
    "shutting_down",  # the daemon is draining or disposing: it accepts no new turn
    "journal_unavailable",  # the daemon cannot write its journal: the turn was not accepted
    "internal",  # a bug in the daemon: reported, never fatal
    "lagged",  # a follower stopped reading until its send queue filled: its stream ends
    "dropped",  # this client stopped reading until its send queue filled: the request was dropped
    "too_large",  # the reply would not fit in one message (the turn is unharmed)
    "turn_id_conflict",  # the turn_id is already used by another request (agent, input or session)
]
# CLIENT-PROTOCOL: the client protocol grows by addition: a new code is added here, never renamed.
ERROR_CODES: tuple[str, ...] = get_args(ErrorCode)


class _CMsg(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True, tag=True):
    pass


# ---- client → daemon -----------------------------------------------------------------


class Hello(_CMsg, tag="hello", frozen=True):
    """First request of a connection: the client's protocol version."""

    req: int
    version: int


class Submit(_CMsg, tag="submit", frozen=True):
    """Accept a turn (idempotent by ``turn_id``). With ``wait`` the ``Accepted`` reply is followed
    by the turn's ``Result`` under the same ``req`` (``run`` in one round trip)."""

    req: int
    agent: str
    input: msgspec.Raw
    session: str | None = None
    timeout: float | None = None
    grace: float | None = None
    kill_after: float | None = None
    turn_id: str | None = None
    wait: bool = False
    retry: bool = False  # with a journal: run again if a daemon restart interrupted it
    trace: str | None = None  # the caller's W3C trace context (``traceparent``), carried to the worker


class Cancel(_CMsg, tag="cancel", frozen=True):
    req: int
    turn_id: str
    cause: Cause


class CancelSession(_CMsg, tag="cancel_session", frozen=True):
    req: int
    session: str
    cause: Cause


class GetResult(_CMsg, tag="result", frozen=True):
    """Wait for the turn's result (answered when the turn is quiescent)."""

    req: int
    turn_id: str


class Follow(_CMsg, tag="follow", frozen=True):
    """Stream the turn's events from the oldest retained one; ends with ``FollowEnd``.

    ``window`` > 0 is flow control: the daemon sends at most that many events beyond those the
    client has granted with ``Credit`` (0: no limit)."""

    req: int
    turn_id: str
    window: int = 0


class Credit(_CMsg, tag="credit", frozen=True):
    """The client consumed ``n`` more events of the follow ``req``: the daemon may send ``n`` more."""

    req: int
    n: int


class Unfollow(_CMsg, tag="unfollow", frozen=True):
    """Stop the event stream opened by the ``Follow`` whose id is ``req``."""

    req: int


class Abandon(_CMsg, tag="abandon", frozen=True):
    """(Version 2.) The client no longer waits for request ``req`` (a ``GetResult``, ``Follow``,
    ``WhenIdle`` or ``Submit`` with ``wait``): the daemon frees it and sends nothing more for it.
    Never a cancel: the turn goes on. No reply."""

    req: int


class Lookup(_CMsg, tag="lookup", frozen=True):
    """Does the daemon know this turn? Answered ``Ok`` or ``Error(unknown_turn)``."""

    req: int
    turn_id: str


class GetStatus(_CMsg, tag="status", frozen=True):
    req: int


class WhenIdle(_CMsg, tag="when_idle", frozen=True):
    """Answered ``Ok`` once no turn is queued or running."""

    req: int


class Reload(_CMsg, tag="reload", frozen=True):
    """Version 3: recycle every worker gracefully (``turnpool reload``), answered ``Reloaded``."""

    req: int


ToDaemon = (
    Hello
    | Submit
    | Cancel
    | CancelSession
    | GetResult
    | Follow
    | Credit
    | Unfollow
    | Lookup
    | GetStatus
    | WhenIdle
    | Abandon
    | Reload
)


# ---- daemon → client -----------------------------------------------------------------


class Welcome(_CMsg, tag="welcome", frozen=True):
    req: int
    version: int
    max_message_size: int
    pid: int


class Accepted(_CMsg, tag="accepted", frozen=True):
    """The turn is accepted; ``existing`` when the ``turn_id`` was already known (not run again)."""

    req: int
    turn_id: str
    existing: bool = False


class Cancelled(_CMsg, tag="cancelled", frozen=True):
    """The winning cause (``None``: the turn had ended without being cancelled)."""

    req: int
    cause: Cause | None


class SessionCancelled(_CMsg, tag="session_cancelled", frozen=True):
    req: int
    turn_ids: list[str]


class Result(_CMsg, tag="result", frozen=True):
    req: int
    result: TurnResult


class Events(_CMsg, tag="events", frozen=True):
    """Events of a followed turn; ``seq`` numbers the first one (a gap: older events were dropped)."""

    req: int
    seq: int
    data: list[msgspec.Raw]


class FollowEnd(_CMsg, tag="follow_end", frozen=True):
    req: int


class Status(_CMsg, tag="status", frozen=True):
    req: int
    status: dict[str, Any]


class Ok(_CMsg, tag="ok", frozen=True):
    req: int


class Reloaded(_CMsg, tag="reloaded", frozen=True):
    """Every worker was marked for replacement: ``workers`` of them, ``busy`` of those still finishing
    a turn on the old code (each is replaced when its turn ends)."""

    req: int
    workers: int
    busy: int


class Error(_CMsg, tag="error", frozen=True):
    """Why a request failed; ``req`` is 0 when the request could not even be read."""

    req: int
    code: ErrorCode
    message: str


FromDaemon = (
    Welcome
    | Accepted
    | Cancelled
    | SessionCancelled
    | Result
    | Events
    | FollowEnd
    | Status
    | Ok
    | Reloaded
    | Error
)


_to_daemon = msgspec.msgpack.Decoder(ToDaemon)
_from_daemon = msgspec.msgpack.Decoder(FromDaemon)
_to_daemon_batch = msgspec.msgpack.Decoder(list[ToDaemon])
_from_daemon_batch = msgspec.msgpack.Decoder(list[FromDaemon])
# A batch frame packs at most about this many bytes of messages (a larger single message goes alone).
BATCH_BYTES = 64 * 1024


def _is_batch(frame: bytes) -> bool:
    """Whether ``frame`` is an array of messages (a batch) rather than one message: a message is
    an array whose first element is its tag (a string); a batch's first element is an array."""
    if not frame:
        return False
    head = frame[0]
    if 0x90 <= head <= 0x9F:
        at = 1
    elif head == 0xDC:
        at = 3
    elif head == 0xDD:
        at = 5
    else:
        return False
    if len(frame) <= at:  # an empty array is no batch (a batch holds at least one message): malformed
        return False
    first = frame[at]
    return 0x90 <= first <= 0x9F or first in (0xDC, 0xDD)


def encode_batch(messages: list[bytes]) -> bytes:
    """One batch frame from messages already encoded one by one (each with ``wire.encode``)."""
    n = len(messages)
    if n < 16:
        head = bytes((0x90 | n,))
    elif n < 0x10000:
        head = b"\xdc" + n.to_bytes(2, "big")
    else:
        head = b"\xdd" + n.to_bytes(4, "big")
    return head + b"".join(messages)


def decode_to_daemon_frame(frame: bytes) -> list[ToDaemon]:
    """The requests in a client→daemon frame: a batch, or one message (a ``Hello``)."""
    if _is_batch(frame):
        return _to_daemon_batch.decode(frame)
    return [_to_daemon.decode(frame)]


def decode_from_daemon_frame(frame: bytes) -> list[FromDaemon]:
    """The replies in a daemon→client frame: a batch, or one message (a probe, an owed error)."""
    if _is_batch(frame):
        return _from_daemon_batch.decode(frame)
    return [_from_daemon.decode(frame)]


def decode_to_daemon(frame: bytes) -> ToDaemon:
    """Decode a client→daemon frame; raises ``msgspec.DecodeError`` (incl. validation)."""
    return _to_daemon.decode(frame)


def decode_from_daemon(frame: bytes) -> FromDaemon:
    """Decode a daemon→client frame; raises ``msgspec.DecodeError`` (incl. validation)."""
    return _from_daemon.decode(frame)
