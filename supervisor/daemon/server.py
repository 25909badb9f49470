"""The serve daemon: a ROUTER on the client endpoint in front of one embedded ``Supervisor``.

Clients (``Client``, ``SyncClient``, the CLI) connect DEALERs and speak the client protocol
(``wire/_client_protocol.py``). The daemon passes a client's encoded input bytes straight to its
supervisor (never re-encoded). This module holds the ``Daemon``: its state, the client link (reading
frames, batching and sending replies), admission, the engine's hooks and the wiring of its parts, each
given what it reads and writes: its lifecycle (start-up, signals, drain and shutdown) in ``run.py``
(``Lifecycle``), the request tasks in ``tasks.py``, what frees a client's state in ``client_watch.py``,
the answer to each request in ``requests.py``.

Rules the daemon keeps (see ``docs/design.md`` and ``tests/test_daemon.py``):

* **One daemon per endpoint** (``endpoint.py``): for ``ipc://`` a ``flock`` on ``<path>.lock`` held
  for the daemon's life refuses a second daemon with a clear message; a socket file left by a
  dead daemon is replaced. ``tcp://`` relies on the bind, optionally with CURVE.
* **A client never owns a turn.** A client that disconnects cancels nothing; results stay in
  the supervisor's turn table, bounded by ``keep_results`` (default 10 000 ended turns, the
  oldest evicted first), so a reconnecting client can fetch or follow them. A repeated
  ``turn_id`` returns the existing turn and never runs it twice.
* **A client's state is bounded and freed** (``clients.py``): a client that disconnects,
  abandons a request or stops reading loses its pending requests (the turns go on); follows are
  windowed and batched; a reply that would not fit one message is answered with an error.
* **Bad frames cost one reply.** A frame that does not decode gets ``Error(code="malformed")``
  and is counted; it changes no turn. ``MAXMSGSIZE`` refuses oversized frames at the socket.
* **Shutdown.** The first SIGTERM/SIGINT/SIGHUP stops accepting (submits get ``shutting_down``),
  lets accepted turns finish for ``drain`` seconds, then disposes the supervisor (cause
  ``disposed``, escalation, reap) and exits 0; a second signal skips the rest of the drain and
  SIGKILLs every turn being cancelled at once (``Supervisor.kill_now``). SIGHUP (the terminal
  that started ``serve`` closed) drains like SIGTERM instead of killing the daemon outright
  (DAEMON-HUP). With a journal, turns still queued when the drain ends are set aside, not disposed:
  their rows stay ``queued`` and the next start runs them (DAEMON-KEEP-QUEUED).
* **Hook sites** for a journal: ``accept_hooks`` (a new turn was accepted; an awaitable it
  returns holds the submit's acknowledgement until it is done, e.g. committed), ``start_hooks``
  (a worker started it), ``end_hooks`` (its one result) — all called on the event loop.
  ``stop()`` is the programmatic SIGTERM (a second call skips the drain).
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

import anyio
import anyio.abc
import msgspec
import zmq
import zmq.asyncio

import wire
from wire import Cause, TurnResult, client_link
from worker import lowlevel
from worker.zmqlink import NOBLOCK as _NOBLOCK
from worker.zmqlink import NOBLOCK_MORE as _NOBLOCK_MORE
from worker.zmqlink import LoopFlush, ReadableEdge

from .._checks import check_agent
from .._engine import TurnRecord
from .._engine.supervisor import Supervisor
from .._errors import (
    DaemonShuttingDown,
    JournalUnavailable,
    TurnIdConflict,
)
from .._fds import FdBudget, nofile_limit, raise_nofile_limit
from .._paths import default_endpoint
from .client_watch import ClientWatch
from .clients import (
    Ack,
    ClientTable,
    Gate,
    Peer,
    Waiter,
    batch_frames,
    gate_error,
)
from .conn_guard import ClientConnections
from .endpoint import ClientEndpoint
from .intake import Intake
from .metrics import Metrics
from .requests import Requests
from .run import READY_PREFIX, Lifecycle, run_process
from .tasks import RequestTasks

log = logging.getLogger("turnpool.daemon")


class Daemon:
    """``turnpool serve``: owns a ``Supervisor`` and answers clients on ``endpoint``.

    ``supervisor`` holds the keyword arguments of ``Supervisor``. ``drain`` is how long accepted
    turns may run on after the first signal. ``metrics_port`` (0: any free port) serves
    Prometheus text on ``metrics_host``. ``curve_secret_key`` (a ``zmq.auth`` certificate file
    with a secret key) turns on CURVE; ``curve_clients`` is then the directory of the public
    certificates of the clients allowed in.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        supervisor: dict[str, Any] | None = None,
        drain: float = 30.0,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        curve_secret_key: str | os.PathLike[str] | None = None,
        curve_clients: str | os.PathLike[str] | None = None,
        insecure_tcp: bool = False,
    ) -> None:
        self.sup_kwargs = dict(supervisor or {})
        Supervisor(**self.sup_kwargs)  # validate the options now, before binding anything
        self._endpoint = ClientEndpoint(
            endpoint or default_endpoint(),
            curve_secret_key=curve_secret_key,
            curve_clients=curve_clients,
            insecure_tcp=insecure_tcp,
            agents_restricted=self.sup_kwargs.get("allow_agents") is not None,  # SEC-SHARED
        )
        if drain < 0:
            raise ValueError(f"drain must be >= 0 seconds, got {drain}")
        self.drain = drain
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host

        # JOURNAL-HOOKS: hook sites for a journal.
        # Hook sites (a durable journal hooks in here). Called on the event loop; must not block.
        # An accept hook may return an awaitable: the submit is acknowledged only once it is done
        # (e.g. the journal row is committed).
        self.accept_hooks: list[Callable[[TurnRecord], Awaitable[Any] | None]] = []
        self.start_hooks: list[Callable[[TurnRecord, int], None]] = []
        self.end_hooks: list[Callable[[TurnRecord, TurnResult], None]] = []
        self.event_hooks: list[Callable[[TurnRecord, msgspec.Raw], None]] = []  # each event, as emitted
        # Run once the pool is up, before clients can connect (a journal's restart recovery).
        self.startup_hooks: list[Callable[[Supervisor], Any]] = []
        # Called before replies go out (JOURNAL-HANDOFF: the journal hands the rows of this loop pass to its
        # writer, so a reply never overtakes the record of what it reports). Must be cheap.
        self.before_reply: list[Callable[[], None]] = []
        # Other front ends (the HTTP API): each is started with ``tg.start`` in the daemon's task
        # group once clients can connect, reports what to add to the ready line (or None), and
        # is cancelled after the supervisor has closed.
        self.front_ends: list[Callable[..., Coroutine[Any, Any, Any]]] = []
        # JOURNAL-LOOKUP: where a turn id the supervisor no longer holds may still be recorded (the journal):
        # returns its agent, input and result (None until it ended), or None if never recorded.
        self.lookup: Callable[[str], tuple[str, bytes, TurnResult | None] | None] | None = None
        # JOURNAL-UNAVAILABLE: why submits cannot be made durable now (a journal write failure); None when
        # they can.
        self.unavailable: str | None = None
        # CLI-HISTORY: the journal's path (status shows it; ``history`` asks for it); None: no journal.
        self.journal_path: str | None = None
        # what ``run_daemon`` returns (non-zero: the journal broke, see JOURNAL-UNAVAILABLE)
        self.exit_code = 0
        # JOURNAL-ACK: turns accepted whose row is not committed yet -> the awaitable of that commit. A repeat
        # of such an id is acknowledged only once the first one's row is committed.
        self.unrecorded: dict[str, Awaitable[Any]] = {}

        self.sup: Supervisor | None = None
        # DAEMON-FD: the descriptor limit's shares (set at start), the client endpoint's connections, and
        # each other front end's count of connections refused past its share (by name).
        self.fd_budget = FdBudget(limit=nofile_limit(), workers=1)
        self.conns = ClientConnections(self.fd_budget)
        self.fd_refused: dict[str, Callable[[], int]] = {}
        self.fd_shortages: dict[str, Callable[[], int]] = {"accept_clients": lambda: self.conns.shortage}
        self.malformed = 0
        self.accepting = False
        self.metrics: Metrics | None = None
        self.metrics_bound: int | None = None
        self.disposing_at: float | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._sync: zmq.Socket[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dirty: list[Peer] = []  # version-3 clients with replies in ``peer.out`` (CLIENT-BATCHES)
        # CLIENT-BATCHES: result requests waiting for a live turn, answered from the end hook (no task each):
        # turn id -> [(client, req, the scope registered under the client)].
        self._result_waiters: dict[str, list[tuple[bytes, int, Waiter]]] = {}
        # CLIENT-BATCHES: replies made in one pass leave together (loop: _receive)
        self._pass = LoopFlush(self._flush)
        # every client, its follow streams, their counters (CLIENT-STATE–CLIENT-NO-SKIP)
        self._clients = ClientTable()
        self.too_large_replies = 0
        # MEM-TRIM: when to hand freed memory back (``run.Lifecycle.give_back_memory``)
        self.heap = lowlevel.HeapKeeper()
        self._cancel_times: dict[str, float] = {}
        self._cancelling_at: float | None = None
        # the requests that wait run as tasks, registered under their clients (CLIENT-STATE)
        self._tasks = RequestTasks(self._clients)
        self._life: Lifecycle | None = None  # start-up, signals, shutdown: one per ``serve``
        # The parts, each given what it reads and writes (never the daemon). What frees a client's
        # state when it abandons a request, goes or stops reading (CLIENT-STATE, CLIENT-ISOLATED), called from
        # the reply path and the requests:
        self._watch = ClientWatch(self._clients, self._put, self._send_hwm)
        # CLIENT-BATCHES, DAEMON-INTAKE-SLICE
        self._intake = Intake(self._clients, self._handle, self._malformed, self._watch.pay)
        # The answers to client requests (one case per request type, and the waiting ones), once
        # the supervisor runs (``use``).
        self._requests: Requests | None = None

    def use(self, sup: Supervisor) -> tuple[Metrics, ClientConnections]:
        """Serve with ``sup`` (started by ``run.Lifecycle``): the parts that need it are built, the
        descriptor limit shared (DAEMON-FD) and the engine's hooks added."""
        self.sup = sup
        # DAEMON-FD: the soft descriptor limit up to the hard one, and each front end's share of it.
        limit, _ = raise_nofile_limit()
        self.fd_budget = FdBudget(limit=limit, workers=sup.workers + sup.spares)
        self.conns = ClientConnections(self.fd_budget)
        sup.add_hooks(on_start=self._on_start, on_result=self._on_end)
        for hook in self.event_hooks:
            sup.add_hooks(on_event=hook)
        watch = self._watch
        self._requests = Requests(
            sup, self._clients, send=self._send, send_alone=self._send_alone, task=self._tasks.start,
            abandon=watch.abandon, admit=self._admit, answer_result=self.answer_result,
            ack_when_done=self.ack_when_done, cancel_timed=self.cancel_timed, status=self.status,
            lookup=self._lookup,
        )  # fmt: skip
        self.metrics = Metrics(
            sup, malformed=lambda: self.malformed, client_facts=self.client_facts,
            journal_error=lambda: self.unavailable, fd_facts=self.fd_facts,
            fd_refused=self.fd_refused, fd_shortages=self.fd_shortages,
        )  # fmt: skip
        return self.metrics, self.conns

    def _lookup(self, turn_id: str) -> tuple[str, bytes, TurnResult | None] | None:
        """JOURNAL-LOOKUP: the journal's record of ``turn_id`` (``lookup``), or ``None`` (none, or no
        journal)."""
        return self.lookup(turn_id) if self.lookup is not None else None

    def _send_hwm(self) -> int:
        """The client link's send queue per client (messages), for the log of a stalled client."""
        return cast(int, self._sock.getsockopt(zmq.SNDHWM)) if self._sock is not None else 0

    @property
    def endpoint(self) -> str:
        """The client endpoint (a ``tcp://…:0`` one reads as the bound port once serving)."""
        return self._endpoint.address

    # ---- lifecycle ---------------------------------------------------------------------

    async def serve(self, *, ready: Callable[[str], None] | None = None) -> None:
        """Run until SIGTERM/SIGINT/SIGHUP (or ``stop()``), then drain, dispose and return.

        ``ready`` is called with the announcement once clients can connect. Raises
        ``DaemonAlreadyRunning`` when another daemon holds the endpoint and ``WorkerStartError``
        when the pool cannot start.
        """
        self._tasks.serving()
        self._life = life = Lifecycle(
            self._endpoint, self._watch, self.heap, sup_kwargs=self.sup_kwargs, drain=self.drain,
            metrics_host=self.metrics_host, metrics_port=self.metrics_port, startup_hooks=self.startup_hooks,
            front_ends=self.front_ends, keep_queued=self.journal_path is not None, use=self.use,
            joined=self._tasks.joined, linked=self._linked, receive=self._receive,
            set_accepting=self._set_accepting, disposing=self._disposed, metrics_bound=self._metrics_bound,
            requests_answered=self._tasks.answered,
        )  # fmt: skip
        # DAEMON-HUP
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            self._endpoint.claim()
            try:
                await life.serve_until_stopped(signals, ready)
            finally:
                self._endpoint.release()

    def stop(self, *, skip_drain: bool = False) -> None:
        """Begin the shutdown, as the first SIGTERM does; a second call (or ``skip_drain``) skips
        the drain, as a second signal does. Call it on the daemon's event loop."""
        if self._life is None:
            raise RuntimeError("the daemon is not serving")
        self._life.stop(skip_drain=skip_drain)

    # What the lifecycle writes: the bound socket, the state status reports.
    def _linked(self, sock: zmq.asyncio.Socket | None) -> None:
        self._sock, self._sync = sock, (zmq.Socket.shadow(sock.underlying) if sock is not None else None)

    def _set_accepting(self, accepting: bool) -> None:
        self.accepting = accepting

    def _disposed(self, at: float) -> None:
        self.disposing_at = at

    def _metrics_bound(self, port: int) -> None:
        self.metrics_bound = port

    # ---- the client link ---------------------------------------------------------------

    async def _receive(self) -> None:
        """Frames from clients are read in a reader callback on the ROUTER's FD (as the engine
        reads its workers): no future and no task switch per frame (CLIENT-BATCHES). This task only owns
        the registration."""
        assert self._sync is not None
        self._loop = self._pass.loop = asyncio.get_running_loop()
        intake = self._intake
        intake.sync = self._sync
        intake.edge = ReadableEdge(self._sync, intake.on_readable)
        try:
            await intake.edge.watch()  # LINK-EDGE
        finally:
            intake.drain(None)  # read from the socket: every one of them is answered
            self._flush()

    def _handle(self, ident: bytes, msg: Any) -> None:
        requests = self._requests
        assert requests is not None  # (requests are read only while the supervisor serves)
        try:
            requests.handle(ident, msg)
        except Exception as exc:  # a bug here must cost one request, never the daemon
            log.exception("request %r failed", msg)
            self._send(ident, client_link.Error(msg.req, "internal", f"{type(exc).__name__}: {exc}"))

    # CLIENT-BAD-FRAME: a bad frame costs one reply.
    def _malformed(self, ident: bytes, why: str) -> None:
        self.malformed += 1
        # Warn about the first few only: a flood of garbage must not flood the log too.
        level = logging.WARNING if self.malformed <= 10 else logging.DEBUG
        log.log(level, "malformed frame from a client: %s", why)
        self._send(ident, client_link.Error(0, "malformed", why))

    def _send(self, ident: bytes, msg: Any, alone: bool = False) -> bool:
        """Send one reply; ``False`` when it did not go: the client is gone (``ROUTER_MANDATORY``
        says ``EHOSTUNREACH``: its state is freed) or its queue is full (``SNDHWM``: its requests
        are dropped and it is owed an error each, CLIENT-ISOLATED). ``alone``: the reply gets a frame
        of its own, never merged with others (CLIENT-NO-WINDOW)."""
        peer = self._clients.peers.get(ident)
        if peer is None:
            return False  # CLIENT-GONE: every client has a peer from its first frame on; this one went
        if peer.version:  # after its Hello, CLIENT-BATCHES: replies are batched
            self._queue_reply(peer, msg, alone)  # goes in ``_flush``, which hands journal rows over first
            return True
        for before in self.before_reply:  # JOURNAL-HANDOFF: this reply leaves now; the journal's rows first
            before()
        sent = self._put(ident, msg, peer)
        if sent == "gone":
            self._watch.forget(ident)
        elif sent == "full" and peer is not None:
            self._watch.stall(peer)
        return sent == "ok"

    def _send_alone(self, ident: bytes, msg: Any) -> bool:
        return self._send(ident, msg, alone=True)

    def _queue_reply(self, peer: Peer, msg: Any, alone: bool = False) -> None:
        """CLIENT-BATCHES: a reply to a version-3 client joins its outgoing batch; the batches go at the end
        of this pass of the event loop (``_flush``), so a burst of acks, results and events costs
        one send per client, not one per reply."""
        frame = self._encode_reply(msg, peer)
        peer.out.append(frame)
        peer.out_bytes += len(frame)
        if alone:
            peer.alone.append(len(peer.out) - 1)
        if len(peer.out) == 1:
            self._dirty.append(peer)
        self._pass.soon()

    def _flush(self) -> None:
        """Send each version-3 client its batched replies, as few frames as fit ``BATCH_BYTES`` (a reply
        queued ``alone`` in a frame of its own, CLIENT-NO-WINDOW). A
        client whose queue is full (it stopped reading) keeps the frames that did not go, in order,
        with the errors it is owed (CLIENT-ISOLATED). Journal rows written in this pass go to the journal's
        writer first (``before_reply``, JOURNAL-HANDOFF): no reply overtakes the record of what it reports."""
        for before in self.before_reply:
            before()
        dirty, self._dirty = self._dirty, []
        peers = self._clients.peers
        for peer in dirty:
            out, peer.out, peer.out_bytes = peer.out, [], 0
            alone, peer.alone = peer.alone, []
            if peers.get(peer.ident) is not peer or not out:
                continue  # forgotten meanwhile: its replies have nobody to go to
            frames = batch_frames(out, alone)
            if peer.owed:
                self._watch.pay(peer)
            if peer.owed:
                peer.owed.extend(frames)  # behind what it is already owed, in order
                continue
            for k, frame in enumerate(frames):
                sent = self._put_frame(peer.ident, frame)
                if sent == "gone":
                    self._watch.forget(peer.ident)
                    break
                if sent == "full":
                    peer.owed.extend(frames[k:])
                    self._watch.stall(peer)
                    break

    def _encode_reply(self, msg: Any, peer: Peer | None) -> bytes:
        """``msg`` encoded for ``peer``. A reply that would not fit one message (the client's socket
        would drop it and the connection) becomes a ``too_large`` error."""
        frame = wire.encode(msg)
        if len(frame) > wire.MAX_MESSAGE_SIZE - 64:
            self.too_large_replies += 1
            why = (
                f"the {type(msg).__name__.lower()} reply is {len(frame)} bytes, above the "
                f"{wire.MAX_MESSAGE_SIZE}-byte message limit"
            )
            log.warning("%s (request %s)", why, msg.req)
            frame = wire.encode(client_link.Error(msg.req, "too_large", why))
        return frame

    def _put(self, ident: bytes, msg: Any, peer: Peer | None) -> str:
        """One send: ``"ok"``, ``"gone"`` or ``"full"``; ``msg`` is a message, or a batch frame
        already encoded (owed to a version-3 client)."""
        if isinstance(msg, bytes):
            return self._put_frame(ident, msg)
        return self._put_frame(ident, self._encode_reply(msg, peer))

    def _put_frame(self, ident: bytes, frame: bytes) -> str:
        assert self._sync is not None
        try:
            send = self._sync.send
            send(ident, _NOBLOCK_MORE)  # LINK-FLAGS: not send_multipart, which ORs enum flags per part
            send(frame, _NOBLOCK)
            return "ok"
        except zmq.Again:
            return "full"
        except zmq.ZMQError as exc:
            if exc.errno != errno.EHOSTUNREACH:
                log.debug("reply to a client failed: %s", exc)
            return "gone"
        finally:
            if self._intake.edge is not None:
                self._intake.edge.after_send()  # LINK-EDGE: a send can consume the readable edge

    # ---- client state: abandon, gone, stalled (CLIENT-STATE, CLIENT-ISOLATED)
    # -------------------------------

    async def submit(
        self,
        agent: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the turn's timeout, not this call's
        grace: float | None = None,
        kill_after: float | None = None,
        turn_id: str | None = None,
        retry: bool = False,
    ) -> tuple[str, bool]:
        """Accept a turn for a front end other than the client link (the HTTP API), exactly as a
        client's ``Submit`` is: returns ``(turn_id, existed)``; idempotent by ``turn_id`` (a known
        id returns ``(id, True)``, even while draining); returns only once every accept hook is
        done (the journal's commit). Raises ``DaemonShuttingDown`` while draining, and what
        ``Supervisor.submit`` raises (``InvalidAgent``, ``TypeError``, ``ValueError``, ``QueueFull``)."""
        raw = wire.encode_payload(input, what="turn input")
        assert self.sup is not None
        if type(agent) is str and agent not in self.sup.agents_known:
            await self.sup.learn_agent(agent)  # ADAPT-PROBE
        accepted, existed, gates = self._admit(
            agent,
            raw,
            session=session,
            timeout=timeout,
            grace=grace,
            kill_after=kill_after,
            turn_id=turn_id,
            retry=retry,
        )
        for gate in gates:
            await gate
        return accepted, existed

    def _admit(self, agent: str, raw: msgspec.Raw, **options: Any) -> tuple[str, bool, list[Awaitable[Any]]]:
        """The one acceptance path of every front end: ``(turn_id, existed, gates)``. The submit may be
        acknowledged once every gate is done (JOURNAL-ACK: the journal's commit of its row).

        Raises ``DaemonShuttingDown`` while draining, ``JournalUnavailable`` while the journal cannot
        be written (JOURNAL-UNAVAILABLE), ``TurnIdConflict`` for an id known (here or in the journal,
        JOURNAL-LOOKUP) with another agent, input or session (API-TURN-ID), and what ``Supervisor.submit``
        raises."""
        sup = self.sup
        assert sup is not None
        if sup.allow_agents is not None:
            sup.allow_agents.check(check_agent(agent))  # SEC-ALLOW: before any id is looked up
        turn_id = options["turn_id"]
        # DAEMON-IDEMPOTENT: submit is idempotent by turn_id (for the same request: API-TURN-ID).
        known = sup.find(turn_id) if turn_id is not None else None
        if known is not None:
            # Idempotent by turn_id for the same request: the known turn is returned, never run twice
            # (even while draining). Not durable yet: acknowledged when (and if) the first submit's
            # row commits. A record restored from the journal cannot tell its input: the journal can.
            differs = sup.request_differs(known, agent, raw, options.get("session"))
            if "input" not in differs and not sup.knows_input(known) and self.lookup is not None:
                found = self.lookup(turn_id)
                if found is not None and not _same_encoded(found[1], raw):
                    differs = (*differs, "input")
            if differs:
                raise TurnIdConflict(turn_id, differs)
            pending = self.unrecorded.get(turn_id)
            return turn_id, True, [pending] if pending is not None else []
        if not self.accepting:
            raise DaemonShuttingDown(
                f"the daemon at {self.endpoint} is shutting down: it accepts no new turn"
            )
        if self.unavailable is not None:
            raise JournalUnavailable(self.unavailable)
        if turn_id is not None and self.lookup is not None:
            # JOURNAL-LOOKUP: an id known only to the journal (result evicted, or a lost ack across a restart)
            # is the existing turn: answered from the record, never run again.
            found = self.lookup(turn_id)
            if found is not None:
                known_agent, known_raw, known_result = found
                differs = tuple(
                    what
                    for what, same in (
                        ("agent", known_agent == agent),
                        ("input", _same_encoded(known_raw, raw)),
                        (
                            "session",
                            known_result is None or known_result.session == options.get("session"),
                        ),
                    )
                    if not same
                )
                if differs:
                    raise TurnIdConflict(turn_id, differs)  # API-TURN-ID
                return turn_id, True, []
        turn = sup.accept_encoded(agent, raw, **options)
        if self.metrics is not None:
            self.metrics.accepted += 1
        gates = []
        for hook in self.accept_hooks:
            gate = hook(turn)
            if gate is not None and (type(gate) is Gate or inspect.isawaitable(gate)):
                gates.append(gate)
        return turn.id, False, gates

    # ---- hooks and status --------------------------------------------------------------

    def _on_start(self, turn: TurnRecord, pid: int) -> None:
        for hook in self.start_hooks:
            hook(turn, pid)

    def answer_result(self, ident: bytes, req: int, turn_id: str, fallback: Callable[..., Any]) -> None:
        """Answer a result request (``GetResult``, or the second half of a ``run``): at once if the
        turn has ended, from the turn's end otherwise — a callback registered under the client (an
        ``Abandon``, a disconnect or a full queue drops it as it would a task), not a task per
        request (CLIENT-BATCHES). A turn the supervisor does not hold goes to ``fallback`` (a task: the
        journal's lookup, JOURNAL-LOOKUP)."""
        sup = self.sup
        assert sup is not None
        turn = sup.find(turn_id)
        if turn is None:
            self._tasks.start(fallback, ident, req, turn_id, key=(ident, req, "result"))
            return
        if turn.result is not None:
            self._send(ident, client_link.Result(req, turn.result))
            return
        peer = self._clients.peers.get(ident)
        if peer is None:
            return  # CLIENT-GONE: the client is gone; nothing is held for it until the turn ends
        scope = Waiter()
        peer.hold(req, scope, "result")
        self._result_waiters.setdefault(turn_id, []).append((ident, req, scope))

    def ack_when_done(
        self,
        ident: bytes,
        req: int,
        turn_id: str,
        gates: list[Any],
        wait: bool,
        existing: bool,
        fallback: Callable[..., Any],
    ) -> None:
        """Acknowledge a submit once every gate (the journal's commit of its row, JOURNAL-ACK) is done: one
        ``Ack`` registered under the client and on its gates, not a task per submit (CLIENT-BATCHES,
        JOURNAL-GATE-WAIT). A gate that failed answers the error instead; the turn never ran
        (JOURNAL-UNAVAILABLE)."""
        peer = self._clients.peers.get(ident)
        if peer is None:
            return  # CLIENT-GONE: nobody to acknowledge (the submit is accepted all the same)
        ack = Ack(self._acked, ident, req, turn_id, gates, wait, existing, fallback)
        peer.hold(req, ack, "result")
        for gate in gates:
            gate.add_done_callback(ack)

    def _acked(self, ack: Ack) -> None:
        """Every gate of ``ack`` is done: answer the submit (unless the client went or gave up)."""
        ident, req, turn_id = ack.ident, ack.req, ack.turn_id
        peer = self._clients.peers.get(ident)
        if peer is None or ack.cancel_called:
            return  # gone, abandoned or dropped
        if peer.tasks.get(req, (None,))[0] is ack:
            del peer.tasks[req]
        for gate in ack.gates:
            exc = gate_error(gate)
            if exc is None:
                continue
            if isinstance(exc, JournalUnavailable):
                self._send(ident, client_link.Error(req, "journal_unavailable", str(exc)))
            elif isinstance(exc, ValueError):  # the id was recorded meanwhile (JOURNAL-LOOKUP)
                self._send(ident, client_link.Error(req, "bad_value", str(exc)))
            else:
                log.error("accept hook failed for turn %s: %r", turn_id, exc)
                why = f"turn {turn_id} accepted but not recorded: {exc}"
                self._send(ident, client_link.Error(req, "internal", why))
            return
        self._send(ident, client_link.Accepted(req, turn_id, ack.existing))
        if ack.wait:
            self.answer_result(ident, req, turn_id, ack.fallback)

    def _answer_waiters(self, turn: TurnRecord, result: TurnResult) -> None:
        waiters = self._result_waiters.pop(turn.id, None)
        if not waiters:
            return
        peers = self._clients.peers
        for ident, req, scope in waiters:
            peer = peers.get(ident)
            if peer is None or scope.cancel_called:
                continue  # gone, abandoned or dropped: nothing to answer
            if peer.tasks.get(req, (None,))[0] is scope:
                del peer.tasks[req]
            self._send(ident, client_link.Result(req, result))

    def _on_end(self, turn: TurnRecord, result: TurnResult) -> None:
        for stream in self._clients.turn_streams.get(turn.id, ()):
            stream.wake()  # a follower waiting for credit learns now whether it lagged
        asked = self._cancel_times.pop(turn.id, None)
        if self.metrics is not None:
            self.metrics.turn_ended(turn, result, self._cancel_asked_at(turn, result.cause, asked))
        for hook in self.end_hooks:
            hook(turn, result)
        # JOURNAL-HANDOFF: the journal's "ended" row goes to its writer before any client is told the result:
        # a reply that leaves at once (``_send``, a client before version 3) hands the rows over
        # first, and batched replies leave in ``_flush``, which does too (a hand-over per ended
        # turn here cost the journal more than the turn's row).
        self._answer_waiters(turn, result)

    def cancel_timed(self, do: Callable[[], Any], ids: list[str]) -> Any:
        """Run a cancel (``do``) of the turns ``ids`` and note when it was asked, for the cancel-to-end
        latency: every front end's cancels go through here (the client link's and HTTP's)."""
        assert self.sup is not None
        now = anyio.current_time()
        self._cancelling_at = now  # turns that end inside the call (queued ones) see it
        try:
            out = do()
        finally:
            self._cancelling_at = None
        for turn_id in ids:
            turn = self.sup.find(turn_id)
            if turn is not None and turn.state != "ended":
                self._cancel_times.setdefault(turn_id, now)
        return out

    def _cancel_asked_at(self, turn: TurnRecord, cause: Cause | None, asked: float | None) -> float | None:
        """When the cancellation that ended ``turn`` was asked (``None``: not known)."""
        if cause is None:
            return None
        if cause.kind == "disposed":
            return self.disposing_at
        if cause.kind == "deadline" and turn.started_at is not None and turn.timeout is not None:
            return turn.started_at + turn.timeout
        if asked is not None:
            return asked
        return self._cancelling_at

    def client_facts(self) -> dict[str, int]:
        """What the daemon holds for its clients (CLIENT-STATE–CLIENT-NO-SKIP): status and metrics show
        these."""
        clients = self._clients
        return {
            "streams": len(clients.streams),
            "clients": len(clients.peers),
            "waits": clients.waits(),  # pending result/follow/when_idle requests of all clients
            "clients_gone": clients.gone,
            "clients_disconnected": clients.disconnected_total,
            "clients_stalled": clients.stalled,
            "lagged_followers": clients.lagged_followers,
            "too_large_replies": self.too_large_replies,
        }

    def status(self) -> dict[str, Any]:
        """The supervisor's status plus the daemon's own facts."""
        assert self.sup is not None
        st = self.sup.status_now()
        st["daemon"] = {
            "pid": os.getpid(),
            "endpoint": self.endpoint,
            "accepting": self.accepting and self.unavailable is None,
            "journal": self.journal_path,  # CLI-HISTORY: where ``history``/``result`` read; None: none
            "journal_error": self.unavailable,
            "malformed_frames": self.malformed,
            **self.client_facts(),
            "turns_kept": len(self.sup.table),
            "keep_results": self.sup.keep_results,
            "metrics_port": self.metrics_bound,
            "memory_trims": self.heap.trims,
            "fds": self.fd_facts(),
        }
        return st

    def fd_facts(self) -> dict[str, Any]:
        """DAEMON-FD: the descriptor limit, how many are open, the reserve and each front end's share, the
        shortages met (``EMFILE``/``ENFILE``, by where) and the connections refused past a share."""
        sup = self.sup
        return {
            **self.fd_budget.facts(),
            "shortage": {
                **(dict(sup.pool.shortage.counts) if sup is not None else {}),
                **{where: f() for where, f in self.fd_shortages.items()},
            },
            "refused": {"clients": self.conns.refused, **{k: f() for k, f in self.fd_refused.items()}},
            "client_endpoint_pauses": self.conns.pauses,
        }


def run_daemon(daemon: Daemon) -> int:
    """Run ``daemon`` to completion (blocking); the exit code of ``turnpool serve``."""
    return run_process(lambda ready: daemon.serve(ready=ready), lambda: daemon.exit_code)


__all__ = ["READY_PREFIX", "Daemon", "run_daemon"]


def _same_encoded(known: bytes, raw: msgspec.Raw | bytes) -> bool:
    """Two encoded inputs are the same input: the same bytes, or the same value (dict key order
    aside)."""
    if bytes(known) == bytes(raw):
        return True
    try:
        return bool(msgspec.msgpack.decode(bytes(known)) == msgspec.msgpack.decode(bytes(raw)))
    except msgspec.DecodeError:
        return False
