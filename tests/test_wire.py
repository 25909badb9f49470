"""The wire: strict, frozen messages; the closed cause vocabulary; frames that never crash a loop."""

from __future__ import annotations

import msgspec
import pytest

import wire
from wire import Cause, validate_cause, worker_link


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
        worker_link.Run("t1", "m:f", raw, "s", None),
        worker_link.Abort("t1", wire.USER),
        worker_link.SpawnReply(3, error=wire.TurnError("X", "y")),
        worker_link.Shutdown(),
    ]
    decoded = worker_link.decode_to_worker(worker_link.encode_frame(to_worker))
    assert [type(m) for m in decoded] == [type(m) for m in to_worker]
    assert decoded[1] == worker_link.Abort("t1", Cause("user"))
    assert wire.decode_payload(decoded[0].input) == {"a": [1, 2]}
    from_worker = [
        worker_link.Ready(1, "tok", worker_link.PROTOCOL_VERSION),
        worker_link.Started("t1"),
        worker_link.Event("t1", raw),
        worker_link.End("t1", "completed", raw),
        worker_link.Spawn(1, "t1", "m:f", raw),
        worker_link.SpawnCancel(1),
        worker_link.Heartbeat(1),
        worker_link.BadFrame("x"),
    ]
    assert [type(m) for m in worker_link.decode_from_worker(worker_link.encode_frame(from_worker))] == [
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
            worker_link.decode_to_worker(frame)
    with pytest.raises(msgspec.DecodeError):
        worker_link.decode_from_worker(enc([["end", "t1", "exploded"]]))


def test_turn_result_encodes_to_json_with_plain_cause() -> None:
    """A TurnResult is JSON-encodable for the CLI, with the cause as a plain object."""
    result = wire.TurnResult(turn_id="t", outcome="aborted", cause=wire.USER)
    assert msgspec.json.decode(msgspec.json.encode(result))["cause"] == {"kind": "user"}


def test_each_link_has_its_own_namespace() -> None:
    """The two links' messages live in two namespaces, ``wire.worker_link`` (supervisor↔worker) and
    ``wire.client_link`` (client↔daemon): no name is in both, and ``wire`` itself holds only what
    both links carry (causes, results, the payload codec), never a link's message."""
    from wire import client_link

    worker_names, client_names = set(worker_link.__all__), set(client_link.__all__)
    assert worker_names & client_names == set()
    assert {"Run", "Abort", "Event", "End", "Ready", "FromWorker", "ToWorker"} <= worker_names
    assert {"Hello", "Submit", "Cancel", "Cancelled", "Events", "FromDaemon", "ToDaemon"} <= client_names
    assert set(wire.__all__) & (worker_names | client_names) == set()
    for name in worker_names | client_names:
        assert not hasattr(wire, name), name
    for space in (worker_link, client_link):
        for name in space.__all__:
            assert hasattr(space, name), name
