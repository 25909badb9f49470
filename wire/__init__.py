"""turnpool's wire protocol.

Layers: ``_cause`` (the closed cancellation vocabulary and its validation), ``_messages``
(one tagged union per direction, plus ``TurnResult``), ``_codec`` (reused encoders and
decoders), ``_client`` (the client↔daemon protocol: one tagged union per direction).
This package knows nothing of who owns the sockets.
"""

from ._cause import CAUSE_KINDS, DEADLINE, DISPOSED, MEMORY, PARENT, USER, Cause, CauseKind, validate_cause
from ._client import (
    CLIENT_PROTOCOL_VERSION,
    ERROR_CODES,
    Accepted,
    Cancel,
    Cancelled,
    CancelSession,
    Credit,
    Error,
    ErrorCode,
    Events,
    Follow,
    FollowEnd,
    FromDaemon,
    GetResult,
    GetStatus,
    Hello,
    Lookup,
    Ok,
    Result,
    SessionCancelled,
    Status,
    Submit,
    ToDaemon,
    Unfollow,
    Welcome,
    WhenIdle,
    decode_from_daemon,
    decode_to_daemon,
)
from ._codec import (
    MAX_MESSAGE_SIZE,
    MAX_PAYLOAD_SIZE,
    PayloadTooLarge,
    decode_from_worker,
    decode_payload,
    decode_to_worker,
    encode,
    encode_frame,
    encode_payload,
)
from ._messages import (
    NIL,
    OUTCOMES,
    PROTOCOL_VERSION,
    Abort,
    BadFrame,
    End,
    EndAck,
    Event,
    FromWorker,
    Heartbeat,
    Outcome,
    Ready,
    Revoke,
    Revoked,
    Run,
    Shutdown,
    Spawn,
    SpawnCancel,
    SpawnReply,
    Started,
    ToWorker,
    TurnError,
    TurnResult,
    WorkerOutcome,
)

__all__ = [
    "CAUSE_KINDS", "DEADLINE", "DISPOSED", "MEMORY", "PARENT", "USER", "Cause", "CauseKind", "validate_cause",
    "MAX_MESSAGE_SIZE", "MAX_PAYLOAD_SIZE", "PayloadTooLarge", "decode_from_worker", "decode_payload",
    "decode_to_worker", "encode", "encode_frame", "encode_payload",
    "NIL", "OUTCOMES", "PROTOCOL_VERSION", "Abort", "BadFrame", "End", "EndAck", "Event", "FromWorker", "Heartbeat",
    "Outcome", "Ready", "Revoke", "Revoked", "Run", "Shutdown", "Spawn", "SpawnCancel", "SpawnReply", "Started",
    "ToWorker", "TurnError",
    "TurnResult", "WorkerOutcome",
    # client <-> daemon
    "CLIENT_PROTOCOL_VERSION", "ERROR_CODES", "Accepted", "Cancel", "CancelSession", "Cancelled", "Credit",
    "Error", "ErrorCode", "Events", "Follow", "FollowEnd", "FromDaemon", "GetResult", "GetStatus", "Hello",
    "Lookup", "Ok", "Result", "SessionCancelled", "Status", "Submit", "ToDaemon", "Unfollow", "Welcome",
    "WhenIdle",
    "decode_from_daemon", "decode_to_daemon",
]
