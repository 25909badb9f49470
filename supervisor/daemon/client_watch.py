"""What frees a client's state in the daemon (CLIENT-STATE, CLIENT-ISOLATED): a request the client abandoned,
a client that went away (seen by a monitor of the ROUTER's disconnects, or by a probe that finds it gone), and
a client that stopped reading until its send queue was full (its pending requests are dropped and it is owed
an error for each, delivered as its queue drains). A client never owns a turn (DAEMON-NO-OWNER): none of this
cancels one.

``ClientWatch`` is composed by ``Daemon`` (``server.py``), whose reply path calls ``forget``,
``stall`` and ``pay`` when a send finds a client gone or full. Its collaborators: the per-client
records it frees (``clients.py``'s ``ClientTable`` and ``Peer``), ``put`` (one send on the client
link: ``"ok"``, ``"gone"`` or ``"full"``) and ``hwm`` (the link's send queue, for the log).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import zmq
import zmq.asyncio

from wire import client_link

from .clients import OWED_RETRY, PROBE_DELAY, SUSPECT_FOR, SWEEP_EVERY, ClientTable, Peer
from .conn_guard import ClientConnections

Put = Callable[[bytes, Any, "Peer | None"], str]

log = logging.getLogger("turnpool.daemon")


class ClientWatch:
    """Frees what clients hold; see the module docstring."""

    def __init__(self, clients: ClientTable, put: Put, hwm: Callable[[], int]) -> None:
        self.clients = clients
        self.put = put
        self.hwm = hwm
        self.probe_now: anyio.Event = anyio.Event()  # set: sweep now (a disconnect, a stalled client)

    def abandon(self, ident: bytes, req: int) -> None:
        """The client stopped waiting for ``req``: cancel that request only (never the turn)."""
        peer = self.clients.peers.get(ident)
        task = peer.tasks.pop(req, None) if peer is not None else None
        if task is not None:
            task[0].cancel()
        stream = self.clients.streams.pop((ident, req), None)
        if stream is not None:
            stream.scope.cancel()

    # DAEMON-NO-OWNER: a client never owns a turn: a client gone frees its requests, never cancels a turn.
    def forget(self, ident: bytes) -> None:
        """The client is gone: free everything it held."""
        clients = self.clients
        peer = clients.forget(ident)
        if peer is None:
            return
        clients.disconnected_total += 1
        if peer.tasks:
            clients.gone += 1  # something it asked for was still pending: dropped
        for scope, _ in peer.tasks.values():
            scope.cancel()
        peer.tasks.clear()

    def stall(self, peer: Peer) -> None:
        """The client's queue is full: drop its pending requests now, owe it an error for each."""
        if not peer.tasks:
            return
        self.clients.stalled += 1
        log.warning(
            "a client stopped reading (its queue reached %d messages): dropping its %d pending requests",
            self.hwm(),
            len(peer.tasks),
        )
        for req, (scope, kind) in list(peer.tasks.items()):
            scope.cancel()
            if kind == "follow":
                self.clients.lagged_followers += 1
                why = (
                    "this follower was dropped: its client stopped reading until the daemon's send queue "
                    "for it was full; follow again to resume from the oldest event kept"
                )
                peer.owed.append(client_link.Error(req, "lagged", why))
            else:
                why = "this request was dropped: the client stopped reading until its send queue was full"
                peer.owed.append(client_link.Error(req, "dropped", why))
        peer.tasks.clear()
        self.probe_now.set()

    def pay(self, peer: Peer) -> None:
        """Deliver the errors ``peer`` is owed, as far as its queue has room."""
        while peer.owed:
            sent = self.put(peer.ident, peer.owed[0], peer)
            if sent == "gone":
                self.forget(peer.ident)
                return
            if sent == "full":
                return
            peer.owed.popleft()

    def open_monitor(self, sock: zmq.asyncio.Socket) -> zmq.asyncio.Socket:
        """A monitor of the ROUTER's disconnects. Our end has no receive limit, so a burst of
        thousands of disconnects is not cut short (the monitor drops events it cannot queue)."""
        address = f"inproc://turnpool-clients-monitor-{id(self)}"
        # DAEMON-FD: connections accepted are counted (and failed accepts), disconnects free clients.
        sock.monitor(address, zmq.EVENT_ACCEPTED | zmq.EVENT_ACCEPT_FAILED | zmq.EVENT_DISCONNECTED)
        mon: zmq.asyncio.Socket = sock.context.socket(zmq.PAIR)
        mon.setsockopt(zmq.RCVHWM, 0)
        mon.setsockopt(zmq.LINGER, 0)
        mon.connect(address)
        return mon

    async def watch_disconnects(self, mon: zmq.asyncio.Socket, conns: ClientConnections) -> None:
        """Count the connections accepted and closed (``conns``, DAEMON-FD); a closed one makes its
        clients suspects, probed soon."""
        from zmq.utils.monitor import parse_monitor_message

        while True:
            try:
                event = parse_monitor_message(await mon.recv_multipart())
            except (zmq.ZMQError, RuntimeError):
                return
            if event["event"] == zmq.EVENT_ACCEPTED:
                conns.accepted(event["value"])
            elif event["event"] == zmq.EVENT_ACCEPT_FAILED:
                conns.accept_failed(event["value"])
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                conns.closed(event["value"])
                self.clients.disconnected(event["value"], anyio.current_time())
                self.probe_now.set()

    async def sweep(self) -> None:
        """Settle suspects, deliver owed errors, and now and then probe every client that holds
        requests: a send under ``ROUTER_MANDATORY`` to a client that is gone fails at once."""
        clients = self.clients
        last_full = anyio.current_time()
        while True:
            busy = clients.suspects or any(p.owed for p in clients.peers.values())
            with anyio.move_on_after(OWED_RETRY if busy else SWEEP_EVERY):
                await self.probe_now.wait()
            self.probe_now = anyio.Event()
            await anyio.sleep(PROBE_DELAY)  # let the ROUTER drop the closed pipes first
            now = anyio.current_time()
            full = now - last_full >= SWEEP_EVERY
            if full:
                last_full = now
            for ident, peer in list(clients.peers.items()):
                if peer.owed:
                    self.pay(peer)
                elif ident in clients.suspects or (full and peer.tasks):
                    self.probe(peer, now)
            await anyio.lowlevel.checkpoint()

    def probe(self, peer: Peer, now: float) -> None:
        sent = self.put(peer.ident, client_link.Ok(0), peer)
        if sent == "gone":
            self.forget(peer.ident)
        elif peer.suspect_since is not None and now - peer.suspect_since >= SUSPECT_FOR:
            peer.suspect_since = None  # it answers: a new client on a reused descriptor
            self.clients.suspects.discard(peer.ident)
