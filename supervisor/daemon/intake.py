"""Reading clients' requests off the daemon's ROUTER: frames in a reader callback on the socket's
edge-triggered FD (CLIENT-BATCHES), a bounded slice of requests per call (DAEMON-INTAKE-SLICE), the rest of a
frame kept in a backlog that shares each later call with what other clients sent meanwhile
(DAEMON-INTAKE-FAIR; a client's own later frames wait behind its backlog). Each request goes to ``handle``; a
frame that is not one well-formed request batch costs one error reply (``malformed``, CLIENT-BAD-FRAME).

Its collaborators: the ``ClientTable`` (a client is known from its first frame), ``handle`` (one
request), ``malformed`` (a bad frame), ``pay`` (a client that sends again may read again: the errors
it is owed go first) and ``sync``, the ROUTER, given once it is bound (``Daemon._receive``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from wire import client_link
from worker.zmqlink import EVENTS as _EVENTS
from worker.zmqlink import NOBLOCK as _NOBLOCK
from worker.zmqlink import POLLIN as _POLLIN
from worker.zmqlink import RCVMORE as _RCVMORE
from worker.zmqlink import ReadableEdge

if TYPE_CHECKING:
    from .clients import ClientTable, Peer

# Frames read from clients per reader callback before the loop gets a turn (CLIENT-BATCHES).
READ_BATCH = 512
# DAEMON-INTAKE-SLICE: requests handled per reader callback. A burst of batch frames (``submit_many`` packs
# about a thousand submits into a frame) is handled a slice at a time, so that between slices the loop reads
# the journal's commit replies and hands it the next rows: the writer commits while the daemon accepts,
# instead of waiting for the whole burst and then holding every dispatch behind one commit.
READ_MESSAGES = 256
# DAEMON-INTAKE-FAIR: while a backlog waits, it gets this share of a call's budget and frames read meanwhile
# the rest: a client whose frame is not in the backlog is answered within a slice, not after the
# whole backlog (one frame of a raw client may hold a hundred thousand requests). A client with
# requests in the backlog has its later frames queued behind them (its own order).
BACKLOG_SHARE = READ_MESSAGES // 2
# ... and at most this many frames wait in the backlog: past that, nothing more is read until it
# shrinks (ZeroMQ's queue, bounded by its high-water mark, holds the rest, as before DAEMON-INTAKE-FAIR).
BACKLOG_FRAMES = 64


class Intake:
    """The daemon's reading side of the client link (see the module docstring)."""

    def __init__(
        self,
        clients: ClientTable,
        handle: Callable[[bytes, Any], None],
        malformed: Callable[[bytes, str], None],
        pay: Callable[[Peer], None],
    ) -> None:
        self.clients = clients
        self.handle = handle
        self.malformed = malformed
        self.pay = pay
        self.sync: zmq.Socket[bytes] | None = None  # the ROUTER, once bound
        self.edge: ReadableEdge | None = None  # LINK-EDGE: set once the daemon's socket is bound
        # DAEMON-INTAKE-SLICE: requests decoded but not handled yet (the rest of a frame past the budget of
        # one call), in arrival order: (client, the frame's requests, the first not handled).
        self.backlog: collections.deque[tuple[bytes, list[Any], int]] = collections.deque()
        self.behind: dict[bytes, int] = {}  # DAEMON-INTAKE-FAIR: client -> its frames in the backlog

    def on_readable(self) -> None:
        # ZeroMQ's FD is edge-triggered: drain until EVENTS says nothing is left, a bounded number
        # of requests per call (then again from the loop, LINK-EDGE), so a flood never starves other work.
        sync = self.sync
        if sync is None or sync.closed:
            return
        budget = READ_MESSAGES
        if self.backlog:
            # DAEMON-INTAKE-FAIR: part of the slice for the backlog, the rest for what other clients sent.
            budget = self.drain(BACKLOG_SHARE) + READ_MESSAGES - BACKLOG_SHARE
            if len(self.backlog) >= BACKLOG_FRAMES:
                self.recheck()
                return
        # LINK-FLAGS: plain-int flags, bytes instead of ``zmq.Frame`` objects for clients already known.
        getsockopt: Callable[[int], int] = sync.getsockopt  # type: ignore[assignment]
        recv = sync.recv
        peers = self.clients.peers
        for _ in range(READ_BATCH):
            if budget <= 0 or len(self.backlog) >= BACKLOG_FRAMES:
                break
            if not getsockopt(_EVENTS) & _POLLIN:
                if self.backlog:
                    self.recheck()  # DAEMON-INTAKE-FAIR: nothing new, the backlog goes on at the next call
                return
            try:
                ident = recv(_NOBLOCK)
                fd = None
                if ident in peers:
                    body = recv(_NOBLOCK)
                else:
                    # A new client: its first frame tells which descriptor it came in on, which is
                    # how a disconnect reported by the monitor finds its client (CLIENT-STATE).
                    frame = recv(_NOBLOCK, copy=False)
                    try:
                        fd = frame.get(zmq.SRCFD)
                    except zmq.ZMQError:
                        fd = -1
                    body = frame.bytes
                extra = 0
                while getsockopt(_RCVMORE):
                    recv(_NOBLOCK)  # a request is one frame: a multipart one is refused whole
                    extra += 1
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            budget = self._on_frame(ident, body, fd, extra, budget)
        self.recheck()

    def recheck(self) -> None:
        """Read again soon, from the loop (once, however often asked before it runs: LINK-EDGE)."""
        if self.edge is not None:
            self.edge.again()

    def _on_frame(self, ident: bytes, body: bytes, fd: int | None, extra: int, budget: int) -> int:
        """Handle one frame from a client, at most ``budget`` of its requests now (DAEMON-INTAKE-SLICE: the
        rest wait in the backlog, ahead of anything read later); returns what is left of the budget."""
        clients = self.clients
        peer = clients.peers.get(ident)
        if peer is None:
            peer = clients.get(ident, -1 if fd is None else fd)
        if peer.owed:
            self.pay(peer)  # it sends again: it may read again
        if extra:
            self.malformed(ident, f"a request is one frame, got {extra + 1}")
            return budget - 1
        try:
            messages = client_link.decode_to_daemon_frame(body)
        except msgspec.DecodeError as exc:
            self.malformed(ident, f"undecodable request: {exc}")
            return budget - 1
        handle = self.handle
        behind = self.behind
        if ident in behind:  # DAEMON-INTAKE-FAIR: behind its own requests still in the backlog
            behind[ident] += 1
            self.backlog.append((ident, messages, 0))
            return budget - 1
        if len(messages) > budget:
            for msg in messages[:budget]:
                handle(ident, msg)
            behind[ident] = 1
            self.backlog.append((ident, messages, budget))
            return 0
        for msg in messages:
            handle(ident, msg)
        return budget - len(messages)

    def drain(self, budget: int | None) -> int:
        """Handle requests from the backlog, oldest first, at most ``budget`` (``None``: all of
        them, as the daemon stops: every request it read is answered); returns what is left of
        the budget."""
        backlog = self.backlog
        behind = self.behind
        handle = self.handle
        while backlog:
            ident, messages, start = backlog.popleft()
            end = len(messages) if budget is None else min(len(messages), start + budget)
            for k in range(start, end):
                handle(ident, messages[k])
            if end < len(messages):
                backlog.appendleft((ident, messages, end))
                return 0
            left = behind.pop(ident) - 1
            if left:
                behind[ident] = left
            if budget is not None:
                budget -= end - start
                if budget <= 0:
                    return 0
        return 0 if budget is None else budget
