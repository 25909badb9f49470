"""The daemon's per-client state, and how it is bounded and freed (rules CLIENT-STATE, CLIENT-ISOLATED and
CLIENT-NO-SKIP of ``docs/design.md``).

A client is a routing id on the daemon's ROUTER. Everything the daemon holds for it lives here:
its protocol version, its pending requests (result waits, follows, ``when_idle``), each with a
cancel scope, and the errors it is owed. That state goes away

* when the client abandons a request (``Abandon``, ``Unfollow``) — CLIENT-STATE;
* when the client is gone (CLIENT-STATE): ZeroMQ's socket monitor reports each closed connection with
  its file descriptor; the clients last heard on that descriptor are *suspects*, and a probe
  (a send under ``ROUTER_MANDATORY``: ``EHOSTUNREACH`` means gone) settles each one. A slow
  sweep probes every client holding requests, in case the monitor missed a disconnect;
* when the client stops reading (CLIENT-ISOLATED): a send that finds its queue at ``SNDHWM`` fails with
  ``EAGAIN``; its requests are dropped at once and it is owed one error per request
  (``lagged`` for a follow, ``dropped`` otherwise), delivered as soon as its queue has room.

``FollowStream`` is one follow's flow control: ``window`` events (and ``STREAM_BYTES`` bytes)
beyond what the client has credited (CLIENT-NO-SKIP).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, cast

import anyio

from wire import client_link

from .._errors import JournalUnavailable

# An ``Events`` message carries at most this many bytes of events (or a single larger event):
# a catching-up follower costs one send per batch, not one per event, and a client that never
# reads holds at most SNDHWM such batches in the daemon.
EVENTS_BATCH_BYTES = 64 * 1024
# CLIENT-NO-WINDOW: a follow without a window (no credit: nothing tells the daemon what its client read) sends
# batches of at most this many bytes, each in a frame of its own (``batch_frames``), so a client that never
# reads holds at most this many bytes of window-less events per message of its CLIENT_SNDHWM-message queue:
# 4 MiB, however many window-less follows it has, not 16 MiB, before the daemon drops it.
WINDOWLESS_BATCH_BYTES = 16 * 1024
# CLIENT-SLICE: a batch holds at most this many events (however small they are), so cutting one
# slices a bounded part of the turn's buffer; a stream starts by slicing ``BATCH_GUESS``.
BATCH_EVENTS = 8192
BATCH_GUESS = 1024
# A follow that has just sent waits this long before its next batch, so a flood is sent in a few
# hundred batches a second per follower instead of one send per event; an idle stream sends at once.
COALESCE = 0.005
# EVENTS-KEEP: a follower with this many events waiting (or all its credit's worth) gets them at once,
# coalesced or not: each send still carries at least this many (or a whole window).
COALESCE_FULL = 1024
# Bytes a windowed follow may have in flight (sent, not yet credited), whatever its window.
STREAM_BYTES = 4 * 1024 * 1024
# How long after a disconnect the suspects are probed (the ROUTER drops the routing id a moment
# after the monitor reports the closed descriptor), and how long a suspect that still answers
# stays suspected (a descriptor reused by a new client) before it is cleared.
PROBE_DELAY = 0.05
SUSPECT_FOR = 1.0
# The slow sweep: every client holding requests is probed this often (a missed disconnect).
SWEEP_EVERY = 30.0
# Owed errors are retried this often while a client's queue is full.
OWED_RETRY = 0.25


MAX_OWED = 1024


class Peer:
    """One client connection (one routing id)."""

    __slots__ = ("alone", "fd", "ident", "out", "out_bytes", "owed", "suspect_since", "tasks", "version")

    def __init__(self, ident: bytes, fd: int) -> None:
        self.ident = ident
        self.fd = fd
        self.version = 0  # no Hello yet: its replies go one message per frame, never batched
        self.tasks: dict[int, tuple[anyio.CancelScope | Waiter, str]] = {}  # req -> (scope, kind)
        # Errors to deliver once its queue has room; bounded, so a client that keeps asking and never
        # reads cannot grow it (it then misses the oldest notices, never more than MAX_OWED kept).
        # Messages (or, for a version-3 client, batch frames already encoded) that did not fit its queue.
        self.owed: deque[Any] = deque(maxlen=MAX_OWED)
        self.suspect_since: float | None = None
        # CLIENT-BATCHES: replies to a version-3 client made in this pass of the loop, encoded, not sent yet.
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.alone: list[int] = []  # CLIENT-NO-WINDOW: which of ``out`` go in a frame of their own

    def hold(self, req: int, scope: anyio.CancelScope | Waiter, kind: str) -> None:
        """Register a request that waits (CLIENT-STATE); a client reusing a live request id replaces that
        request."""
        old = self.tasks.get(req)
        if old is not None:
            old[0].cancel()
        self.tasks[req] = (scope, kind)


def batch_frames(out: list[bytes], alone: list[int]) -> list[bytes]:
    """CLIENT-BATCHES: a client's replies of one pass (encoded, in order) as batch frames of at most
    ``BATCH_BYTES`` each (or one larger reply). CLIENT-NO-WINDOW: the replies at the positions ``alone``
    (ascending: a window-less follow's events) each get a frame of their own: merged, four such 16 KiB
    batches of a client's follows filled a 64 KiB frame, and its queue held 16 MiB of them, not 4 MiB."""
    frames: list[bytes] = []
    start = 0
    for i in alone:
        _merge(out[start:i], frames)
        frames.append(client_link.encode_batch([out[i]]))
        start = i + 1
    _merge(out[start:] if start else out, frames)
    return frames


def _merge(replies: list[bytes], frames: list[bytes]) -> None:
    chunk: list[bytes] = []
    size = 0
    for frame in replies:
        if chunk and size + len(frame) > client_link.BATCH_BYTES:
            frames.append(client_link.encode_batch(chunk))
            chunk, size = [], 0
        chunk.append(frame)
        size += len(frame)
    if chunk:
        frames.append(client_link.encode_batch(chunk))


class Waiter:
    """A request answered by a callback rather than a task (a result wait, an ack waiting for the
    journal): registered under its client like a task's cancel scope, and cancelled the same way
    (``Abandon``, a disconnect, a full queue), at a fraction of an ``anyio.CancelScope``'s cost."""

    __slots__ = ("cancel_called",)

    def __init__(self) -> None:
        self.cancel_called = False

    def cancel(self) -> None:
        self.cancel_called = True


class Gate:
    """JOURNAL-GATE-WAIT: what a submit waits for before it is acknowledged (the journal's commit of its row):
    settled once, with ``None`` or an exception. Its callbacks run the moment it settles, in order
    (an ``asyncio.Future`` schedules each through ``call_soon``: a handle and a context copy per
    ack, and with thousands of acks in flight their garbage collections cost more than the acks).
    Awaitable for the front ends that await it; the future behind that is made only then."""

    __slots__ = ("_callback", "_callbacks", "_future", "done", "error")

    def __init__(self) -> None:
        self.done = False
        self.error: BaseException | None = None
        self._callback: Callable[[Gate], None] | None = None  # the first (mostly the only) one
        self._callbacks: list[Callable[[Gate], None]] | None = None
        self._future: asyncio.Future[None] | None = None

    def add_done_callback(self, fn: Callable[[Gate], None]) -> None:
        if self.done:
            fn(self)
        elif self._callback is None:
            self._callback = fn
        elif self._callbacks is None:
            self._callbacks = [fn]
        else:
            self._callbacks.append(fn)

    def settle(self, error: BaseException | None = None) -> None:
        if self.done:
            return
        self.done, self.error = True, error
        first, self._callback = self._callback, None
        if first is not None:
            first(self)
        more, self._callbacks = self._callbacks, None
        if more is not None:
            for fn in more:
                fn(self)
        fut = self._future
        if fut is not None and not fut.done():
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

    def __await__(self) -> Generator[Any, None, None]:
        if not self.done:
            if self._future is None:
                self._future = asyncio.get_running_loop().create_future()
            yield from self._future.__await__()
            return
        if self.error is not None:
            raise self.error


def gate_error(gate: Any) -> BaseException | None:
    """The exception a settled gate (a ``Gate`` or an ``asyncio.Future``) ended with, or ``None``."""
    if isinstance(gate, Gate):
        return gate.error
    if gate.cancelled():
        return JournalUnavailable("cancelled")
    return cast(BaseException | None, gate.exception())


class Ack(Waiter):
    """A submit waiting for its gates (JOURNAL-GATE-WAIT): its cancel scope under the client and its gates'
    callback in one object — a closure, its cells and a counter per submit were most of what the
    garbage collector walked with thousands of acks waiting for a commit."""

    __slots__ = ("acked", "existing", "fallback", "gates", "ident", "left", "req", "turn_id", "wait")

    def __init__(
        self,
        acked: Callable[[Ack], None],
        ident: bytes,
        req: int,
        turn_id: str,
        gates: list[Any],
        wait: bool,
        existing: bool,
        fallback: Callable[..., Any],
    ) -> None:
        super().__init__()
        self.acked, self.ident, self.req, self.turn_id = acked, ident, req, turn_id
        self.gates, self.left, self.wait, self.existing, self.fallback = (
            gates,
            len(gates),
            wait,
            existing,
            fallback,
        )

    def __call__(self, _gate: Any) -> None:
        self.left -= 1
        if not self.left:
            self.acked(self)  # every gate is done: answer the submit


class ClientTable:
    """Every client the daemon knows, by routing id and by the descriptor it was last heard on, and
    what they hold: the follow streams (by client and request, and by followed turn) and the
    counters of clients gone, stalled or lagging. The daemon's parts that serve clients are given
    this table, never the ``Daemon``."""

    def __init__(self) -> None:
        self.peers: dict[bytes, Peer] = {}
        self.by_fd: dict[int, set[bytes]] = {}
        self.suspects: set[bytes] = set()
        self.streams: dict[tuple[bytes, int], FollowStream] = {}  # (client, req) -> its follow
        self.turn_streams: dict[str, set[FollowStream]] = {}  # turn id -> the streams following it
        self.disconnected_total = 0  # clients freed because they disconnected (ordinary)
        self.gone = 0  # of those, clients that still had requests pending: dropped work
        self.stalled = 0  # clients whose requests were dropped because they stopped reading
        self.lagged_followers = 0  # follows that fell behind the events kept (told so, CLIENT-NO-SKIP)

    def speaks(self, ident: bytes, version: int) -> bool:
        """Whether the client ``ident`` speaks at least protocol ``version``."""
        peer = self.peers.get(ident)
        return peer is not None and peer.version >= version

    def get(self, ident: bytes, fd: int) -> Peer:
        peer = self.peers.get(ident)
        if peer is None:
            peer = self.peers[ident] = Peer(ident, fd)
            if fd >= 0:
                self.by_fd.setdefault(fd, set()).add(ident)
        return peer

    def disconnected(self, fd: int, now: float) -> None:
        """The monitor saw descriptor ``fd`` close: the clients heard on it become suspects."""
        for ident in self.by_fd.get(fd, ()):
            peer = self.peers.get(ident)
            if peer is not None:
                peer.suspect_since = now
                self.suspects.add(ident)

    def forget(self, ident: bytes) -> Peer | None:
        """Remove a client; its tasks are the caller's to cancel."""
        peer = self.peers.pop(ident, None)
        self.suspects.discard(ident)
        if peer is not None and peer.fd >= 0:
            idents = self.by_fd.get(peer.fd)
            if idents is not None:
                idents.discard(ident)
                if not idents:
                    del self.by_fd[peer.fd]
        return peer

    def waits(self) -> int:
        return sum(len(p.tasks) for p in self.peers.values())


# CLIENT-FLOW: followers are flow-controlled (window and credit).
class FollowStream:
    """One follow: its cancel scope and, with a window, what the client still allows.

    ``window`` > 0: at most ``window`` events and ``STREAM_BYTES`` bytes (or one event) beyond
    what the client has credited. ``window`` 0 (a version-1 client's choice): no credit, bounded
    only by the socket's high-water mark.
    """

    __slots__ = ("_more", "credit", "guess", "inflight", "inflight_bytes", "scope", "turn_id")

    def __init__(self, window: int, turn_id: str) -> None:
        self.scope = anyio.CancelScope()
        self.turn_id = turn_id
        self.credit: int | None = window if window > 0 else None
        self.inflight: deque[int] = deque()  # sizes of events sent and not yet credited
        self.inflight_bytes = 0
        self._more: anyio.Event | None = None
        self.guess = BATCH_GUESS  # CLIENT-SLICE: how many events to slice for the next batch

    def allowance(self) -> tuple[int | None, int | None]:
        """How many events and bytes may go now (``None``: no limit); (0, _) means wait."""
        if self.credit is None:
            return None, None
        if self.credit <= 0:
            return 0, 0
        room = STREAM_BYTES - self.inflight_bytes
        if room <= 0 and self.inflight:
            return 0, 0
        return self.credit, max(room, 1)

    def spent(self, sizes: list[int]) -> None:
        """The batch of events of these sizes went out: they use credit until the client grants more."""
        if self.credit is None:
            return
        self.credit -= len(sizes)
        self.inflight.extend(sizes)
        self.inflight_bytes += sum(sizes)

    async def wait(self) -> None:
        """Until the client grants credit (or ``wake`` is called: the turn ended)."""
        self._more = anyio.Event()
        await self._more.wait()

    def grant(self, n: int) -> None:
        if self.credit is None:
            return
        self.credit += n
        inflight = self.inflight
        for _ in range(min(n, len(inflight))):
            self.inflight_bytes -= inflight.popleft()
        self.wake()

    def wake(self) -> None:
        if self._more is not None:
            self._more.set()
