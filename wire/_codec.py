"""Encoders and decoders, made once and reused.

A frame on the worker link is a msgpack array of messages, so a burst (``Started`` then
``End`` of a quick turn, or a run of events) costs one ZeroMQ message.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ._worker_protocol import FromWorker, ToWorker

# 32 MiB: far above any sensible prompt or event, small enough to refuse abuse.
MAX_MESSAGE_SIZE = 32 * 1024 * 1024
# A payload (input, output, event) must leave room for the message around it: a frame above
# MAX_MESSAGE_SIZE is dropped by the receiving socket together with the connection.
MAX_PAYLOAD_SIZE = MAX_MESSAGE_SIZE - 64 * 1024
# A turn's error is cut to these many characters at the source (the worker), so that a result —
# the output (at most MAX_PAYLOAD_SIZE) or the error, plus its ids (turn id, session and parent
# at most 256 characters each, the agent at most MAX_AGENT_CHARS) — always fits in one message.
MAX_ERROR_CHARS = 8 * 1024
MAX_ERROR_TYPE_CHARS = 256
MAX_AGENT_CHARS = 1024
# LINK-DEPTH: msgspec encodes and decodes nested values by recursion, bounded by the interpreter's
# recursion limit (about 1000 levels in all); a deeper value is refused as a ``ValueError`` saying so.
TOO_DEEP = "nests too deeply (more levels of lists or objects than about 900)"


def cut_error_text(text: str, limit: int) -> str:
    """``text``, cut to at most ``limit`` characters with a note saying how long it was."""
    if len(text) <= limit:
        return text
    note = f"... [cut: {len(text)} characters]"
    return text[: max(0, limit - len(note))] + note


class PayloadTooLarge(ValueError):
    """Raised by ``encode_payload`` (so by ``submit``, ``Turn.emit``, ``Turn.spawn``, and for an
    agent's output) when the encoded value exceeds ``MAX_PAYLOAD_SIZE``."""


_encoder = msgspec.msgpack.Encoder()
_to_worker = msgspec.msgpack.Decoder(list[ToWorker])
_from_worker = msgspec.msgpack.Decoder(list[FromWorker])

encode = _encoder.encode


def encode_payload(value: Any, *, what: str = "value", exact: bool = False) -> msgspec.Raw:
    """Encode a user value (turn input, output, event) once; raise ``TypeError`` if it can't be.

    With ``exact`` (a turn's input, LINK-EXACT), a value msgspec would silently turn into a string
    is refused too (``check_round_trip``)."""
    try:
        data = _encoder.encode(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{what} is not encodable with msgspec: {exc}") from None
    except RecursionError:  # LINK-DEPTH: a value nested past the interpreter's recursion limit
        raise ValueError(f"{what} {TOO_DEEP}") from None
    if len(data) > MAX_PAYLOAD_SIZE:
        raise PayloadTooLarge(f"{what} is {len(data)} bytes encoded; the limit is {MAX_PAYLOAD_SIZE}")
    raw = msgspec.Raw(data)
    if exact:
        check_round_trip(value, raw, what=what)
    return raw


def check_round_trip(value: Any, raw: msgspec.Raw, *, what: str = "value") -> None:
    """Refuse a value that msgspec encoded but that would not come back as itself (LINK-EXACT).

    msgspec writes ``Decimal``, ``UUID``, ``date``, ``time``, ``timedelta``, a naive
    ``datetime`` or a string-valued ``Enum`` as strings: the agent would get ``"1.5"`` for
    ``Decimal("1.5")`` without a word. Such a value raises ``TypeError`` naming where it is
    (``$.k[1]``) and what to send instead. A timezone-aware ``datetime`` travels as a msgpack
    timestamp and comes back a ``datetime``: it is accepted. Cheap when nothing is wrong: the
    decoded value is compared with the original once (C code); only a mismatch (tuples and sets
    also come back as lists) walks the value to find the culprit."""
    try:
        back = msgspec.msgpack.decode(raw)
    except RecursionError:  # LINK-DEPTH: encodable here, but too deep to decode where it is read
        raise ValueError(f"{what} {TOO_DEEP}") from None
    if back == value:
        return
    found = _stringified(value, back, "$")
    if found is not None:
        path, kind = found
        raise TypeError(
            f"{what} at {path} is a {kind}, which msgspec would turn into a string: send it as one "
            "(str(x), x.isoformat()) or as a number, so that the agent gets what was sent"
        )


def _stringified(value: Any, back: Any, path: str) -> tuple[str, str] | None:
    """The first place where ``value`` came back as a string it was not; ``None`` if nowhere."""
    if isinstance(value, str):
        return None
    if isinstance(back, str):
        return path, type(value).__name__
    if isinstance(value, dict) and isinstance(back, dict):
        for (k, v), (bk, bv) in zip(value.items(), back.items(), strict=False):
            if isinstance(bk, str) and not isinstance(k, str):
                return f"{path} (a key)", type(k).__name__
            found = _stringified(v, bv, f"{path}.{bk}" if isinstance(bk, str) else f"{path}[{bk!r}]")
            if found is not None:
                return found
    elif isinstance(value, (list, tuple, set, frozenset)) and isinstance(back, list):
        for i, (v, bv) in enumerate(zip(value, back, strict=False)):
            found = _stringified(v, bv, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def decode_payload(raw: msgspec.Raw | bytes | None) -> Any:
    if raw is None:
        return None
    return msgspec.msgpack.decode(raw)


def encode_frame(messages: list[Any]) -> bytes:
    return _encoder.encode(messages)


def decode_to_worker(frame: bytes) -> list[ToWorker]:
    """Decode a supervisor→worker frame; raises ``msgspec.DecodeError`` (incl. validation)."""
    return _to_worker.decode(frame)


def decode_from_worker(frame: bytes) -> list[FromWorker]:
    return _from_worker.decode(frame)
