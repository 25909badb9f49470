"""The wire: strict, frozen messages; the closed cause vocabulary; frames that never crash a loop."""

from __future__ import annotations

import msgspec
import pytest

import wire
from wire import Cause, validate_cause


def test_cause_accepts_exactly_the_closed_union() -> None:
    """Each supported kind is accepted from an exact dict and returned as an immutable Cause."""
    for kind in ("user", "parent", "deadline", "memory", "disposed"):
        cause = validate_cause({"kind": kind})
        assert cause == {"kind": kind} and cause.kind == kind and cause["kind"] == kind
    assert validate_cause(None) == {"kind": "user"}


def test_accepted_cause_is_detached_and_immutable() -> None:
    """Mutating the caller's dict afterwards changes nothing; the Cause itself cannot be changed."""
    raw = {"kind": "parent"}
    cause = validate_cause(raw)
    raw["kind"] = "user"
    assert cause == {"kind": "parent"}
    with pytest.raises(AttributeError):
        cause.kind = "user"  # type: ignore[misc]
    assert hash(cause) == hash(validate_cause({"kind": "parent"}))


class _DictSubclass(dict):
    pass


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("user", TypeError),
        (b"user", TypeError),
        (["user"], TypeError),
        ((("kind", "user"),), TypeError),
        (ValueError("user"), TypeError),
        (_DictSubclass(kind="user"), TypeError),
        ({"kind": "user", "reason": "x"}, ValueError),
        ({"kind": "timeout"}, ValueError),
        ({"kind": "USER"}, ValueError),
        ({}, ValueError),
        ({"kind": None}, TypeError),
        ({"kind": ["user"]}, TypeError),
        (42, TypeError),
    ],
)
def test_bad_causes_are_rejected(value: object, error: type[Exception]) -> None:
    """Strings, extra keys, unknown kinds, lists, exceptions, subclass instances → TypeError/ValueError."""
    with pytest.raises(error):
        validate_cause(value)


def test_messages_round_trip_and_are_frozen() -> None:
    """Every message survives encode → decode; messages are immutable."""
    raw = wire.encode_payload({"a": [1, 2]})
    to_worker = [
        wire.Run("t1", "m:f", raw, "s", None),
        wire.Abort("t1", wire.USER),
        wire.SpawnReply(3, error=wire.TurnError("X", "y")),
        wire.Shutdown(),
    ]
    decoded = wire.decode_to_worker(wire.encode_frame(to_worker))
    assert [type(m) for m in decoded] == [type(m) for m in to_worker]
    assert decoded[1] == wire.Abort("t1", Cause("user"))
    assert wire.decode_payload(decoded[0].input) == {"a": [1, 2]}
    from_worker = [
        wire.Ready(1, "tok", wire.PROTOCOL_VERSION),
        wire.Started("t1"),
        wire.Event("t1", raw),
        wire.End("t1", "completed", raw),
        wire.Spawn(1, "t1", "m:f", raw),
        wire.SpawnCancel(1),
        wire.Heartbeat(1),
        wire.BadFrame("x"),
    ]
    assert [type(m) for m in wire.decode_from_worker(wire.encode_frame(from_worker))] == [
        type(m) for m in from_worker
    ]
    with pytest.raises(AttributeError):
        decoded[1].turn_id = "other"  # type: ignore[misc]


def test_bad_frames_raise_decode_errors_only() -> None:
    """Garbage, unknown tags, extra fields and bad causes are all ``msgspec.DecodeError`` (incl.
    validation errors), which the receive loops count and drop."""
    enc = msgspec.msgpack.encode
    bad = [
        b"\xff\x00garbage",
        enc([["no-such-tag", "x"]]),
        enc([["abort", "t1", {"kind": "bogus"}]]),
        enc([["abort", "t1", {"kind": "user", "extra": 1}]]),
        enc([["abort", "t1", {"kind": "user"}, "unexpected-extra-field"]]),
        enc({"not": "a list"}),
        enc([["run"]]),
    ]
    for frame in bad:
        with pytest.raises(msgspec.DecodeError):
            wire.decode_to_worker(frame)
    with pytest.raises(msgspec.DecodeError):
        wire.decode_from_worker(enc([["end", "t1", "exploded"]]))


def test_turn_result_encodes_to_json_with_plain_cause() -> None:
    """A TurnResult is JSON-encodable for the CLI, with the cause as a plain object."""
    result = wire.TurnResult(turn_id="t", outcome="aborted", cause=wire.USER)
    assert msgspec.json.decode(msgspec.json.encode(result))["cause"] == {"kind": "user"}
