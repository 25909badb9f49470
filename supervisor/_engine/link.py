"""The worker link: the supervisor's one ROUTER socket on a private ipc endpoint, which every
worker's DEALER connects to.

It owns the socket, the edge-triggered read of its FD and the batching of outgoing frames (each
worker gets one frame per batch of messages). It knows nothing of turns: each decoded message
goes to ``on_message(slot, msg)``, a refused frame to ``on_bad_frame()``; a batch of incoming frames
is bracketed by ``on_batch_start()``
and ``on_batch_end()`` so the owner can defer work (dispatch) to the end of the batch, whose
sends then still go out as one frame per worker.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import signal
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import msgspec
import sniffio
import zmq
import zmq.asyncio

import wire
from wire import worker_link
from worker.zmqlink import EVENTS as _EVENTS
from worker.zmqlink import NOBLOCK as _NOBLOCK
from worker.zmqlink import NOBLOCK_MORE as _NOBLOCK_MORE
from worker.zmqlink import POLLIN as _POLLIN
from worker.zmqlink import RCVMORE as _RCVMORE
from worker.zmqlink import LoopFlush, ReadableEdge, open_socket

from . import procs as _procs
from .pool import WorkerSlot
from .workspace import ensure_private

log = logging.getLogger("turnpool.supervisor")

# LINK-FAIR: frames handled per receive batch, and how long the reader callback may go on reading
# batches before the loop runs what they woke (followers, other clients' requests). The time
# bound matters where handling a frame is costly (a daemon fanning each event out to many
# followers): 256 such frames held the loop for ≈ 10 ms, and another client's turns crawled.
BATCH_FRAMES = 64
FAIR_SLICE = 0.0005
# LINK-QUIET: an immediate send this long after the last one leaves at once even if no frame was read
# in between (a task submitting long turns one by one keeps each turn's latency).
QUIET_GAP = 0.001
FAIR_FRAMES = 256  # and at most this many frames, however cheap: a follower's lag stays bounded


class WorkerLink:
    """The ROUTER socket workers connect to, read in a reader callback and written in batches."""

    def __init__(
        self,
        *,
        on_message: Callable[[WorkerSlot, Any], None],
        on_batch_start: Callable[[], None],
        on_batch_end: Callable[[], None],
        on_bad_frame: Callable[[], None],
    ) -> None:
        self.on_message = on_message
        self.on_batch_start = on_batch_start
        self.on_batch_end = on_batch_end
        self.on_bad_frame = on_bad_frame  # a frame refused here (not a worker's, undecodable)
        # Identity frame -> slot: a frame from an identity not here is a bad frame (SEC-FORGE).
        self.peers: dict[bytes, WorkerSlot] = {}
        self.endpoint = ""
        self._bound: tuple[int, int] | None = None  # WORKER-REBIND: the socket file we bound (device, inode)
        self.rebinds = 0  # WORKER-REBIND: times the endpoint was bound again after its file was deleted
        self.batching = False  # inside the receive loop: frames go out once the batch is handled
        self._dirty: list[WorkerSlot] = []  # slots with messages waiting in slot.out
        self._ctx: zmq.asyncio.Context | None = None
        self.socket: zmq.asyncio.Socket | None = None  # the ROUTER (exposed for tests' monitors)
        self._sync: zmq.Socket[bytes] | None = None  # a blocking shadow of it, for NOBLOCK I/O
        self._loop: asyncio.AbstractEventLoop | None = None
        self._edge: ReadableEdge | None = None  # LINK-EDGE: the socket's reader on the loop
        # CLIENT-BATCHES: a flush of what was sent outside a receive batch, once the loop turns (set by
        # run()).
        self._pass = LoopFlush(self._deferred_flush)
        # LINK-QUIET (LINK-COALESCE without a callback per send): something was sent at once since frames
        # were last read, and when; the next send outside a batch then waits for the loop to turn.
        self._sent_quiet = False
        self._sent_at = 0.0
        self._context = contextvars.Context()  # set by run(): the context callbacks run in (API-ASYNCIO)

    def bind(self, endpoint: str) -> None:
        """Bind the ROUTER: no queue limits (the supervisor bounds turns, not frames), a frame to
        a vanished worker is an error (ROUTER_MANDATORY), frames above the wire's maximum dropped."""
        self.endpoint = endpoint
        self._ctx = zmq.asyncio.Context()
        sock = open_socket(self._ctx, zmq.ROUTER)  # WORKER-SHORT-SLICE
        for opt, val in (
            (zmq.LINGER, 0),
            (zmq.SNDHWM, 0),
            (zmq.RCVHWM, 0),
            (zmq.ROUTER_MANDATORY, 1),
            (zmq.MAXMSGSIZE, wire.MAX_MESSAGE_SIZE),
        ):
            sock.setsockopt(opt, val)
        sock.bind(endpoint)
        self.socket = sock
        self._sync = zmq.Socket.shadow(sock.underlying)
        self._edge = ReadableEdge(self._sync, self.on_readable)
        self._bound = self._where()

    def _path(self) -> str | None:
        """The socket file of an ``ipc://`` endpoint (None: abstract or not ipc)."""
        if not self.endpoint.startswith("ipc://") or self.endpoint.startswith("ipc://@"):
            return None
        return self.endpoint[len("ipc://") :]

    def _where(self) -> tuple[int, int] | None:
        path = self._path()
        if path is None:
            return None
        try:
            st = os.lstat(path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None

    # WORKER-REBIND: the endpoint a new worker connects to is there, made again if it was deleted.
    def ensure_bound(self) -> None:
        """Before a worker starts: if the endpoint's socket file is gone or is not the one we bound
        (an agent or a temp cleaner deleted it, or the private directory with it), make the
        directory again (0700, ours) and bind the endpoint anew. The old binding stays: the workers
        connected through it stay connected. ``OSError`` (with the reason) if that is impossible."""
        path = self._path()
        if path is None or self.socket is None:
            return
        where = self._where()
        if where is not None and where == self._bound:
            return
        log.warning("the worker endpoint %s was removed: binding it again", path)
        ensure_private(Path(path).parent)
        try:
            self.socket.bind(self.endpoint)
        except zmq.ZMQError as exc:
            raise OSError(exc.errno, f"cannot bind the worker endpoint {path} again: {exc}") from None
        self._bound = self._where()
        self.rebinds += 1

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()

    async def run(self) -> None:
        """Frames from workers are handled in a reader callback on the socket's FD, not by a
        task awaiting ``recv``: no future and no task switch per wake-up (≈ 100 µs less per
        round trip than zmq.asyncio's ``recv_multipart`` here). This task only owns the
        registration."""
        assert self._edge is not None
        loop = asyncio.get_running_loop()
        self._loop = loop
        # API-ASYNCIO: the callback runs outside any task, where anyio cannot tell the loop's library by
        # itself (it asks sniffio, which looks for a current task): under plain ``asyncio.run``, or a
        # loop Jupyter runs, an anyio call in a message handler (a task started, a cancel scope)
        # raised NoEventLoopError. Say it once, in the context every callback of this link runs in.
        sniffio.current_async_library_cvar.set("asyncio")
        self._context = contextvars.copy_context()
        self._pass = LoopFlush(self._deferred_flush, loop, self._context)
        try:
            await self._edge.watch(self._context)  # LINK-EDGE; the FD's handle runs in a copy of this context
        finally:
            self._loop = None
            self._pass.loop = None

    def on_readable(self) -> None:
        """The reader callback: read and handle what the workers sent (LINK-FAIR, see ``_read``)."""
        self._sent_quiet = False  # LINK-QUIET: the loop turned
        self._read(fair=True)

    def _read(self, *, fair: bool) -> None:
        """Read frames until ZeroMQ has none left, handling them in batches of ``BATCH_FRAMES``.

        Read until ``zmq.Again`` rather than polling ``EVENTS`` before each frame: a ``recv``
        that finds nothing costs ≈ 0.3 µs here, a ``getsockopt(EVENTS)`` ≈ 1.2 µs (and the
        ``Again`` is paid once per wake-up, not once per frame). Two ``recv`` calls and one
        ``RCVMORE`` look per frame instead of ``recv_multipart`` (≈ 2 µs).

        LINK-FAIR (``fair``): once batches have taken ``FAIR_SLICE`` (0.5 ms), or ``FAIR_FRAMES``
        frames were read, the rest waits for the
        next loop iteration (scheduled here: the FD is edge-triggered and will not fire again for
        frames already queued), so the tasks those frames woke - a follower reading a turn's
        events, a ``result()`` waiter, another client's request in a daemon - run in between. A
        worker streaming events faster than this process handles them can no longer keep the
        loop inside this callback while a follower's buffer overflows."""
        sync = self._sync
        if sync is None or sync.closed:
            return
        recv = sync.recv
        more_parts = sync.get
        started = time.monotonic()
        frames = 0
        lone = True  # LINK-LONE: the first frame of this wake-up may be the only one
        while True:
            batch: list[tuple[bytes, bytes]] = []
            empty = False
            try:
                while len(batch) < BATCH_FRAMES:
                    ident = recv(_NOBLOCK)
                    body = recv(_NOBLOCK)
                    if more_parts(_RCVMORE):
                        # A worker's frame is one part: a multipart message is refused whole
                        # (its parts must never be read as identity and body of the next frames).
                        while more_parts(_RCVMORE):
                            recv(_NOBLOCK)
                        self.on_bad_frame()
                        continue
                    batch.append((ident, body))
                    if lone:
                        # LINK-LONE: after a wake-up's first frame, one look at EVENTS (≈ 1.6 µs)
                        # instead of the ``recv`` that raises ``zmq.Again`` (≈ 4.4 µs): a lone
                        # frame - one turn's Started and End - is the common case one at a time.
                        lone = False
                        if not cast(int, more_parts(_EVENTS)) & _POLLIN:
                            empty = True
                            break
            except zmq.Again:
                empty = True
            except zmq.ZMQError as exc:
                log.debug("worker link read failed: %s", exc)
                empty = True
            if batch:
                frames += len(batch)
                self._handle(batch)
            if empty:
                return
            if (
                fair
                and self._edge is not None
                and (frames >= FAIR_FRAMES or time.monotonic() - started >= FAIR_SLICE)
            ):
                self._edge.again()  # LINK-EDGE: the FD will not fire again for frames already queued
                return

    def _handle(self, batch: list[tuple[bytes, bytes]]) -> None:
        """One receive batch, bracketed so the owner defers its dispatch to the batch's end."""
        self.batching = True
        self.on_batch_start()
        try:
            self._handle_batch(batch)
        except Exception:  # a bug in one message's handling must not stop the link (logged)
            log.exception("error while handling frames from workers")
        finally:
            try:
                self.on_batch_end()
            finally:
                self.batching = False
                if self._dirty:
                    self.flush()

    def _handle_batch(self, batch: list[tuple[bytes, bytes]]) -> None:
        peers = self.peers
        on_message = self.on_message
        decode = worker_link.decode_from_worker
        for ident, body in batch:
            slot = peers.get(ident)
            if slot is None:
                self.on_bad_frame()
                continue
            try:
                messages = decode(body)
            except msgspec.DecodeError as exc:
                self.on_bad_frame()
                log.warning("undecodable frame from worker %s: %s", slot.id, exc)
                continue
            for msg in messages:
                on_message(slot, msg)

    def drain(self) -> None:
        """Handle every frame ZeroMQ already holds (a dead worker's last words come first),
        without yielding between batches."""
        self._read(fair=False)

    def send(self, slot: WorkerSlot, msg: Any) -> None:
        """Queue ``msg`` for ``slot``; it goes out at the end of the receive batch or, outside one,
        now if nothing was sent since the event loop last turned, else with everything sent
        until it turns (LINK-COALESCE): the first message of a burst keeps its latency (a lone
        ``run()``, the turn a warm spare takes over), and a task that sends many in a row - a
        batch's lanes woken together by their results, a loop of ``submit`` - hands each worker
        one more frame for all the rest instead of one frame per turn."""
        out = slot.out
        out.append(msg)
        if len(out) == 1:
            self._dirty.append(slot)
        if self.batching:
            return
        loop = self._loop
        if loop is None:
            self.flush()  # not serving yet (or any more): nothing would run a deferred flush
        elif self._pass.due:
            return
        else:
            # LINK-QUIET: the first send since frames were last read (or since the last immediate
            # send, 1 ms ago or more) leaves now, and schedules nothing: a lone ``run()`` costs
            # no extra loop iteration. A second one before the loop turns waits for it, with
            # everything sent until then (LINK-COALESCE).
            now = time.monotonic()
            if not self._sent_quiet or now - self._sent_at >= QUIET_GAP:
                self._sent_quiet = True
                self._sent_at = now
                self.flush()
            else:
                self._pass.soon()

    def _deferred_flush(self) -> None:
        """The loop turned: send what was queued since the last immediate send."""
        self._sent_quiet = False
        if self._dirty and not self.batching and self._sync is not None and not self._sync.closed:
            self.flush()

    def flush(self) -> None:
        """Send each worker's batched messages as one frame."""
        sync = self._sync
        assert sync is not None
        dirty, self._dirty = self._dirty, []
        for slot in dirty:
            out, slot.out = slot.out, []
            if not out:
                continue  # emptied meanwhile (a worker forgotten at its exit)
            try:
                # Two sends with plain-int flags, not ``send_multipart`` (its enum ``|`` and list).
                sync.send(slot.ident, _NOBLOCK_MORE)
                sync.send(worker_link.encode_frame(out), _NOBLOCK)
            except zmq.ZMQError as exc:
                # The worker is gone (its exit event settles its turns) or its connection dropped
                # (it cannot be reached, so it would hold its turns forever): make sure it is gone.
                log.debug("send to worker %s failed: %s", slot.id, exc)
                if slot.state in ("idle", "busy", "stopping"):
                    log.warning(
                        "worker %s (pid %s) unreachable (%s): killing its tree", slot.id, slot.pid, exc
                    )
                    slot.doomed = True
                    _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)
        # LINK-EDGE: a send can consume the readable edge (the reader itself re-checks after each batch).
        if dirty and not self.batching and self._edge is not None:
            self._edge.after_send()
