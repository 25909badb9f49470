"""The supervisor↔worker link's messages, one namespace: ``ToWorker`` (``Run``, ``Abort``, ...)
and ``FromWorker`` (``Ready``, ``Event``, ``End``, ...), the link's version, and its frame codec
(a frame is a msgpack array of messages). Defined in ``_worker_protocol`` and ``_codec``; what
both links share (causes, results, payloads) is ``wire``'s own."""

from ._codec import decode_from_worker, decode_to_worker, encode_frame
from ._worker_protocol import (
    PROTOCOL_VERSION,
    Abort,
    BadFrame,
    End,
    EndAck,
    Event,
    FromWorker,
    Heartbeat,
    Proceed,
    Ready,
    Revoke,
    Revoked,
    Run,
    Shutdown,
    Spawn,
    SpawnCancel,
    SpawnReply,
    Started,
    Step,
    StepAck,
    ToWorker,
    WorkerOutcome,
)

__all__ = [
    "PROTOCOL_VERSION",
    "Abort",
    "BadFrame",
    "End",
    "EndAck",
    "Event",
    "FromWorker",
    "Heartbeat",
    "Proceed",
    "Ready",
    "Revoke",
    "Revoked",
    "Run",
    "Shutdown",
    "Spawn",
    "SpawnCancel",
    "SpawnReply",
    "Started",
    "Step",
    "StepAck",
    "ToWorker",
    "WorkerOutcome",
    "decode_from_worker",
    "decode_to_worker",
    "encode_frame",
]
