"""turnpool's wire protocol.

Two links, two namespaces: ``wire.worker_link`` (supervisor↔worker: one tagged union per
direction, its frame codec) and ``wire.client_link`` (client↔daemon: one tagged union per
direction, error codes, batches). This package's own names are what both links carry: the closed
cancellation vocabulary (``_cause``), a turn's result and error (``_worker_protocol``), and the
payload codec and size limits (``_codec``). This package knows nothing of who owns the sockets.
"""

from . import client_link, worker_link
from ._cause import CAUSE_KINDS, DEADLINE, DISPOSED, MEMORY, PARENT, USER, Cause, CauseKind, validate_cause
from ._codec import (
    MAX_AGENT_CHARS,
    MAX_ERROR_CHARS,
    MAX_ERROR_TYPE_CHARS,
    MAX_MESSAGE_SIZE,
    MAX_PAYLOAD_SIZE,
    TOO_DEEP,
    PayloadTooLarge,
    cut_error_text,
    decode_payload,
    encode,
    encode_payload,
)
from ._worker_protocol import NIL, OUTCOMES, Outcome, TurnError, TurnResult

__all__ = [
    "CAUSE_KINDS",
    "DEADLINE",
    "DISPOSED",
    "MAX_AGENT_CHARS",
    "MAX_ERROR_CHARS",
    "MAX_ERROR_TYPE_CHARS",
    "MAX_MESSAGE_SIZE",
    "MAX_PAYLOAD_SIZE",
    "MEMORY",
    "NIL",
    "OUTCOMES",
    "PARENT",
    "TOO_DEEP",
    "USER",
    "Cause",
    "CauseKind",
    "Outcome",
    "PayloadTooLarge",
    "TurnError",
    "TurnResult",
    "client_link",
    "cut_error_text",
    "decode_payload",
    "encode",
    "encode_payload",
    "validate_cause",
    "worker_link",
]
