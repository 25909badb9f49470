"""What a batch between the router and a node supervisor looks like on the way: msgpack bytes.

RAY-BATCHES: a submit batch and a results batch each travel as one ``bytes`` object, encoded
with msgspec, not as a list of Python objects for Ray to pickle. Ray's pickler calls back into
Python for every object of a list it pickles (cloudpickle's ``reducer_override``); a byte string
it copies as one buffer. A turn's input is encoded once, on the driver, where it is checked
(LINK-EXACT), and travels as those bytes to the node's engine (``Supervisor.accept_encoded``).

Nothing here imports Ray: both the router and the node supervisor use it.
"""

from __future__ import annotations

import msgspec

from wire import Cause, TurnResult

# One request: agent, encoded input, session, timeout, grace, kill_after, turn_id, retry, attempts and
# (RAY-STEP-RECORDS) the step records of its earlier attempts as (kind, record) pairs.
Request = tuple[
    str,
    msgspec.Raw,
    str | None,
    float | None,
    float | None,
    float | None,
    str,
    bool,
    int,
    list[tuple[str, bytes]],
]

_encoder = msgspec.msgpack.Encoder()
_requests = msgspec.msgpack.Decoder(list[Request])
_results = msgspec.msgpack.Decoder(list[TurnResult])
_cancel_reply = msgspec.msgpack.Decoder(tuple[Cause | None, TurnResult | None])


def encode_requests(rows: list[Request]) -> bytes:
    return _encoder.encode(rows)


def decode_requests(data: bytes) -> list[Request]:
    return _requests.decode(data)


def encode_results(results: list[TurnResult]) -> bytes:
    return _encoder.encode(results)


def decode_results(data: bytes) -> list[TurnResult]:
    return _results.decode(data)


def encode_cancel_reply(winner: Cause | None, result: TurnResult | None) -> bytes:
    """A cancel's reply (RAY-CANCEL-REPLY): the winning cause and the end, if it came in time.
    Bytes, so Ray sends the reply without pickling anything."""
    return _encoder.encode((winner, result))


def decode_cancel_reply(data: bytes) -> tuple[Cause | None, TurnResult | None]:
    return _cancel_reply.decode(data)
