"""``GET /v1/turns/{id}/events``: a turn's events as Server-Sent Events.

Wire format (one SSE event each):

* ``event: event`` — one event the agent emitted; ``id:`` is its sequence number (0 for the
  turn's first event), ``data:`` the event as JSON;
* ``event: gap`` — events the follower can no longer get (the daemon keeps ``max_events`` per
  turn): ``data: {"from": first, "to": last}``; the next ``event`` carries ``id: last + 1``;
* ``event: end`` — the turn's ``TurnResult`` as JSON, once the turn is quiescent; then the
  response ends.

``Last-Event-ID: N`` resumes after event N (an ``EventSource`` sends it on reconnect).

Rules (``docs/http.md``):

* **A follower only observes.** Closing the stream cancels nothing.
* **A follower never holds anyone up.** Each stream pulls from the turn's retained events on its
  own (``Supervisor.follow_raw``); the agent, other followers and other requests never wait for
  it. Per stream, at most ``buffer`` encoded events wait between the reader of the turn and the
  socket, and the socket's own buffer is bounded by the server's write high-water mark; a client
  that leaves a response unread for ``--http-stall`` seconds is dropped (``_server``), and if it
  falls further behind than ``max_events`` it sees a ``gap``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from .._errors import UnknownTurn

if TYPE_CHECKING:
    from ._server import HttpFrontEnd

log = logging.getLogger("turnpool.http")

KEEPALIVE = 15.0  # seconds of silence before a comment line keeps proxies from closing the stream
MAX_BATCH = 256 * 1024  # bytes joined into one write when events are waiting
_json = msgspec.json.Encoder()


def _data(raw: Any) -> bytes:
    try:
        return _json.encode(msgspec.msgpack.decode(raw))
    except (msgspec.DecodeError, TypeError, ValueError) as exc:
        return _json.encode({"undecodable": f"{type(exc).__name__}: {exc}"})


def event_chunk(seq: int, raw: Any) -> bytes:
    return b"id: %d\nevent: event\ndata: %s\n\n" % (seq, _data(raw))


def gap_chunk(first: int, last: int) -> bytes:
    return b"event: gap\ndata: %s\n\n" % _json.encode({"from": first, "to": last})


def end_chunk(result: Any) -> bytes:
    try:
        body = _json.encode(result)
    except (TypeError, ValueError) as exc:
        body = _json.encode(
            {
                "turn_id": getattr(result, "turn_id", None),
                "outcome": getattr(result, "outcome", None),
                "unencodable": str(exc),
            }
        )
    return b"event: end\ndata: %s\n\n" % body


class EventStream:
    """An ASGI response streaming one turn's events (see the module docstring)."""

    def __init__(self, front: HttpFrontEnd, turn_id: str, after: int, buffer: int) -> None:
        self.front = front
        self.turn_id = turn_id
        self.after = after
        self.buffer = buffer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        stats = self.front.stats
        stats["sse_streams"] += 1
        stats["sse_total"] += 1
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-store"),
                        (b"x-accel-buffering", b"no"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b"retry: 2000\n\n", "more_body": True})
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_disconnect, receive, tg.cancel_scope)
                out, into = anyio.create_memory_object_stream[bytes](self.buffer)
                tg.start_soon(self._produce, out)
                await self._consume(into, send)
                tg.cancel_scope.cancel()
        finally:
            stats["sse_streams"] -= 1

    async def _watch_disconnect(self, receive: Any, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                scope.cancel()  # the client left: stop reading the turn; the turn goes on (it only observed)
                return

    async def _produce(self, out: Any) -> None:
        sup = self.front.sup
        async with out:
            expected = self.after + 1
            events = sup.follow_raw(self.turn_id)
            try:
                async for seq, raw in events:
                    if seq < expected:
                        continue
                    if seq > expected:
                        await self._put(out, gap_chunk(expected, seq - 1))
                    await self._put(out, event_chunk(seq, raw))
                    expected = seq + 1
            finally:
                await events.aclose()
            try:
                result = await sup.handle(self.turn_id).result()
            except UnknownTurn:
                return  # evicted meanwhile (keep_results): the stream ends without an ``end``
            await self._put(out, end_chunk(result))

    @staticmethod
    async def _put(out: Any, chunk: bytes) -> None:
        # Without a checkpoint while there is room: the reader of the turn runs ahead in one go and
        # the socket side gets the waiting events as one write.
        try:
            out.send_nowait(chunk)
        except anyio.WouldBlock:
            await out.send(chunk)

    async def _consume(self, into: Any, send: Any) -> None:
        async with into:
            while True:
                chunk = b""
                with anyio.move_on_after(KEEPALIVE):
                    try:
                        chunk = await into.receive()
                    except anyio.EndOfStream:
                        break
                if not chunk:
                    await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
                    continue
                parts = [chunk]
                size = len(chunk)
                ended = False
                while size < MAX_BATCH:
                    try:
                        more = into.receive_nowait()
                    except anyio.WouldBlock:
                        break
                    except anyio.EndOfStream:
                        ended = True
                        break
                    parts.append(more)
                    size += len(more)
                await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
                if ended:
                    break
        await send({"type": "http.response.body", "body": b"", "more_body": False})
