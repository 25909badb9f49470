"""The worker's side of the link to the supervisor: messages posted and batched per loop
iteration, the stale flusher's hand-off (LADDER-EARLY), events (``Turn.emit``) and child turns
(``Turn.spawn``). ``WorkerLoop`` (``_loop.py``) runs the turns over it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import msgspec
import zmq

import wire
from wire import worker_link
from wire.worker_link import SpawnReply

from ._errors import SpawnError
from ._flusher import StaleFlusher
from .zmqlink import NOBLOCK as _NOBLOCK
from .zmqlink import LoopFlush, ReadableEdge

_EMPTY = msgspec.Raw(b"")


class Connection:
    """The worker's side of the link. Outgoing messages are batched per loop iteration:
    a turn that ends without suspending sends ``Started`` and ``End`` in one frame.

    A batch that waits a whole tick because a turn never gives the loop back is sent by the
    stale flusher's thread (``worker/_flusher.py``, rule LADDER-EARLY): every use of the socket holds
    ``lock``, since a ZeroMQ socket must not be used by two threads at once."""

    def __init__(self, sock: zmq.Socket[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self._sock = sock
        self._loop = loop
        self._out: list[Any] = []
        self._spawns: dict[int, asyncio.Future[Any]] = {}
        self._next_req = 0
        # LINK-EDGE: the socket's reader (set and attached by ``WorkerLoop``'s serve), re-run when a send
        # hid a readable edge.
        self.edge = ReadableEdge(sock)
        self._pass = LoopFlush(self.flush, loop)  # CLIENT-BATCHES: what is posted in one pass leaves together
        self.frames = 0  # frames sent so far: tells whether a Started already left
        self.batches = 0  # batches begun: the stale flusher tells a batch that waits by it
        self.lock = threading.RLock()
        self.flusher: StaleFlusher | None = None
        self._event_prefix: tuple[str | None, bytes] = (None, b"")  # (turn id, frame prefix)

    def post(self, msg: Any) -> None:
        if not self._out:
            self.batches += 1
            self._pass.soon()
            self._out.append(msg)
            # WORKER-PARK: a parked stale flusher must watch this batch (looked at after the append:
            # the flusher parks only after seeing no batch waiting, see ``StaleFlusher._run``).
            flusher = self.flusher
            if flusher is not None and flusher.parked:
                flusher.poke()
            return
        self._out.append(msg)

    def flush(self) -> None:
        if self._out:
            with self.lock:
                out, self._out = self._out, []
                if not out:  # the stale flusher sent it meanwhile
                    return
                self.frames += 1
                self._sock.send(worker_link.encode_frame(out), _NOBLOCK)
                self.edge.after_send()  # LINK-EDGE: a message that arrived meanwhile is not stranded

    def flush_stale(self, batch: int) -> None:
        """Called by the stale flusher's thread: send batch ``batch`` if the event loop has not
        (a turn holds the main thread). In place, without swapping the list: the main thread may
        be appending to it between two bytecodes; what it adds stays for the next flush."""
        if not self.lock.acquire(blocking=False):
            return  # the main thread is using the socket: it is not stuck
        try:
            out = self._out
            n = len(out)
            if self.batches != batch or not n:
                return
            frame = worker_link.encode_frame(out[:n])
            del out[:n]
            self.frames += 1
            self._sock.send(frame, _NOBLOCK)
            self.edge.after_send_threadsafe()
        except zmq.ZMQError:
            pass  # the link is going: the worker's own watchers deal with it
        finally:
            self.lock.release()

    def send_now(self, msg: Any) -> None:
        self._out.append(msg)
        self.flush()

    def emit(self, turn_id: str, event: Any) -> bool:
        """Send one event now (EVENTS-ON-WIRE: on the wire when this returns), in one frame with whatever
        was posted before it (a turn's ``Started``), which must not be overtaken. True when the
        event loop has turned since the previous emit (its look at the socket ran): the caller
        need not yield to it (EVENTS-EMIT-NOW)."""
        data = wire.encode_payload(event, what="event")
        with self.lock:
            out = self._out
            if out:
                out.append(worker_link.Event(turn_id, data))
                self._out = []
                frame = worker_link.encode_frame(out)
            else:
                # A frame of one Event is a fixed prefix (per turn) and the payload's bytes: the
                # msgpack of ``[Event(turn_id, data)]`` (array-like) ends with ``data`` verbatim.
                if self._event_prefix[0] != turn_id:
                    self._event_prefix = (
                        turn_id,
                        worker_link.encode_frame([worker_link.Event(turn_id, _EMPTY)]),
                    )
                frame = self._event_prefix[1] + data
            self.frames += 1
            self._sock.send(frame, _NOBLOCK)
        # The send may have consumed the FD's readable edge (LINK-EDGE): look at the socket once the
        # agent gives the loop a turn (at once if it awaits anything, within EMIT_YIELD_INTERVAL if
        # it only emits), not after every event: a streaming turn would pay ≈ 1.2 µs per event for
        # it, more than the send.
        return self.edge.look_soon()

    async def spawn(
        self,
        parent: str,
        agent: str,
        input: Any,
        session: str | None,
        timeout: float | None,  # noqa: ASYNC109 - the child turn's deadline, carried to the supervisor
        grace: float | None,
        kill_after: float | None,
    ) -> wire.TurnResult:
        raw = wire.encode_payload(input, what="input")
        self._next_req += 1
        req = self._next_req
        fut = self._loop.create_future()
        self._spawns[req] = fut
        self.send_now(worker_link.Spawn(req, parent, agent, raw, session, timeout, grace, kill_after))
        try:
            reply: SpawnReply = await fut
        except BaseException:
            if not fut.done():
                self.send_now(worker_link.SpawnCancel(req))
            raise
        finally:
            self._spawns.pop(req, None)
        if reply.error is not None:
            raise SpawnError(f"{reply.error.type}: {reply.error.message}")
        assert reply.result is not None
        return reply.result

    def spawn_reply(self, msg: SpawnReply) -> None:
        fut = self._spawns.get(msg.req)
        if fut is not None and not fut.done():
            fut.set_result(msg)
