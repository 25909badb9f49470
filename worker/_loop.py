"""The worker's turn loop: the connection to the supervisor, one turn at a time, ``Abort`` honoured.

``serve`` connects the DEALER socket, reads frames in an FD reader callback and hands each
message to ``WorkerLoop``, which runs the turns one after the other. The process-level guards
(parent death, the guardian, tree kill) live in ``_guards``; this module only calls them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import inspect
import os
import signal
import sys
import time
import types
from typing import Any, NoReturn, cast

import anyio
import msgspec
import zmq

import wire
from wire import TurnError, worker_link
from wire.worker_link import Abort, End, EndAck, Proceed, Revoke, Run, Shutdown, SpawnReply, StepAck

from . import _endlog, _heap, _heir, _marker, _toolerrors, _toolproc, adapters
from ._connection import Connection
from ._errors import TurnCancelled
from ._errtext import error_message, safe_text
from ._flusher import StaleFlusher
from ._guards import (
    EXIT_LINK_LOST,
    PARENT_DEATH_SIGNAL,
    cgroup_joined,
    keeps_children,
    kill_own_tree_and_exit,
    mark_engine_threads,
    retire,
    sweep_leftovers,
    watcher,
)
from ._trace import traced
from ._turn import Turn
from .zmqlink import EVENTS as _EVENTS
from .zmqlink import NOBLOCK as _NOBLOCK
from .zmqlink import POLLIN as _POLLIN
from .zmqlink import ReadableEdge, open_socket

_IMPORT_CACHE: dict[str, Any] = {}
_ASYNC_CACHE: dict[str, bool] = {}

# MEM-TRIM: after turns that ran this long in all since the last look, the worker looks whether what
# they freed is worth handing back to the system before it starts the next one. A turn allocates at
# most a few MiB per millisecond, so what is left unlooked-at stays small, and a look (≈ 0.1 ms)
# costs the turns at most 2 % of their time; no-op turns pay one clock reading each.
LOOK_AFTER = 0.005

# WORKER-SCOPE: the running backend's own cancel scope class, looked up once. ``anyio.CancelScope()``
# asks sniffio which async library runs on every construction (measured: ≈ 1 µs of a no-op
# turn's ≈ 5 µs of Python in this process); the class it returns is the same for the whole life
# of the worker, whose event loop is always asyncio. Same object, same semantics: only the lookup
# is skipped.
_scope_class: Any = None


def _new_scope() -> anyio.CancelScope:
    global _scope_class
    cls = _scope_class
    if cls is None:
        scope = anyio.CancelScope()
        _scope_class = type(scope)
        return scope
    return cast(anyio.CancelScope, cls())


# ---- agents --------------------------------------------------------------------------


# API-NO-GENERATOR: an agent returns its output and streams with ``emit``; a generator would only fail later
# with "generator is not encodable".
GENERATOR_AGENT = (
    "agent {spec!r} is a generator function: an agent returns its output and emits events as it "
    "goes: `await turn.emit({{'text': chunk}})` for each piece, then `return {{'done': True}}` "
    "(followers get the events from handle.events(); the returned value is the result's output)"
)


def load_agent(spec: str) -> Any:
    """Import ``"package.module:attr"`` once per process."""
    fn = _IMPORT_CACHE.get(spec)
    if fn is None:
        module_name, _, attr = spec.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (exc.name == module_name or module_name.startswith(exc.name + ".")):
                raise  # a dependency of the agent is missing: its own message says which
            # The agent's own module (or package) is not on the worker's path: say where workers look.
            raise ModuleNotFoundError(
                f"{exc} (workers import agents from the supervisor's agent_path / `--path` directories, "
                "PYTHONPATH and installed packages; never from the working directory)",
                name=exc.name,
            ) from None
        for part in attr.split("."):
            obj = getattr(obj, part)
        obj = adapters.adapt(spec, obj)  # ADAPT-OBJECT: a framework object runs through its adapter
        call = getattr(obj, "__call__", None)  # noqa: B004 - an instance with a generator __call__ too
        if any(inspect.isasyncgenfunction(f) or inspect.isgeneratorfunction(f) for f in (obj, call)):
            raise TypeError(GENERATOR_AGENT.format(spec=spec))
        fn = _IMPORT_CACHE[spec] = obj
    return fn


def resolve_loaded(spec: str) -> bool:
    """LADDER-HEIR: look up a held turn's agent while the doomed worker dies, if that runs no code of the
    agent: its module is imported already (``preload``, an earlier turn) and the attribute is a plain
    function in the module's own namespace (a dict lookup: no module ``__getattr__``, no descriptor).
    Anything else is imported when the turn starts, as always: an import runs the turn's code.
    Measured on a spare woken by the exit: the agent's first look-up took ≈ 60-80 µs of the ≈ 200 µs
    from its wake-up to the agent's start (cold caches), ≈ 10-15 µs once looked up. True if the agent
    is in the cache now."""
    if spec in _IMPORT_CACHE:
        return True
    module_name, _, attr = spec.partition(":")
    module = sys.modules.get(module_name)
    if type(module) is not types.ModuleType or "." in attr:
        return False
    if type(vars(module).get(attr)) is not types.FunctionType:
        return False
    try:
        load_agent(spec)
    except TypeError:  # a generator agent: its turn says so when it starts
        return False
    return True


def _is_async(fn: Any) -> bool:
    # An instance whose __call__ is ``async def`` is an async agent too; not a callable() check (B004).
    call = getattr(fn, "__call__", None)  # noqa: B004
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _error(exc: BaseException) -> TurnError:
    """The turn's error, cut at the source so its result always fits in one message (LINK-RESULT-FITS); its
    text read so that nothing the agent's exception does can take the worker down (WORKER-ERROR-TEXT)."""
    return TurnError(
        type=wire.cut_error_text(safe_text(type(exc).__name__), wire.MAX_ERROR_TYPE_CHARS),
        message=wire.cut_error_text(error_message(exc), wire.MAX_ERROR_CHARS),
    )


class WorkerLoop:
    def __init__(
        self,
        conn: Connection,
        marker: _marker.StartMarker | None = None,
        endlog: _endlog.EndLog | None = None,
    ) -> None:
        self.conn = conn
        self.marker = marker
        # WORKER-END-LOG: the End of each finished turn is logged here (shared memory) before the next turn
        # starts, so a crash in that next turn cannot take it along.
        self.endlog = endlog
        self.pending: collections.deque[Run] = collections.deque()
        # The idle runner waits on a bare asyncio future (the worker runs on asyncio): a few µs
        # cheaper per turn than an anyio.Event made and awaited each time.
        self.wakeup: asyncio.Future[None] | None = None
        self.current: Turn | None = None
        self.current_scope: anyio.CancelScope | None = None
        self.current_async = False
        # An End that asked for an EndAck: no handed turn starts before that ack is in. A frame
        # still inside ZeroMQ dies with the process, so without this a turn that crashes the
        # worker could take the End of the turn before it along (reported crashed, not completed).
        self.unacked: str | None = None
        self.acked: asyncio.Future[None] | None = None
        # LADDER-HEIR: held turns (in ``pending``) that wait for another worker's process to be gone,
        # by turn id: the pidfd watched for it, or ``_heir.UNWATCHABLE`` (waits for ``Proceed``).
        self.held: dict[str, int] = {}
        # MEM-TRIM: what the turns freed goes back to the system between turns, so the next turn's
        # tree is not measured (``max_rss_mb``) with memory the turns before it dropped.
        self.heap = _heap.HeapKeeper()
        self.ran_s = 0.0  # turn time since the last look

    def on_abort(self, msg: Abort) -> None:
        turn = self.current
        # TURN-HOLDER: an Abort for a turn this worker does not run never reaches the one it runs.
        if turn is None or turn.id != msg.turn_id:
            # Not running it: it may be waiting here (handed ahead); otherwise stale, dropped.
            for run in self.pending:
                if run.turn_id == msg.turn_id:
                    self.pending.remove(run)
                    self.unhold(run.turn_id)  # LADDER-HEIR: a held turn ends unstarted, like any handed one
                    self.conn.post(End(msg.turn_id, "aborted"))
                    break
            return
        if turn.signal._set(msg.cause):
            _toolproc.cancel_all()  # TOOL-TOLD: isolated calls first, sync ones in threads included
            if self.current_async and self.current_scope is not None:
                self.current_scope.cancel()

    def on_revoke(self, msg: Revoke) -> None:
        """Give back a turn handed ahead that has not started; ignore it otherwise."""
        for run in self.pending:
            if run.turn_id == msg.turn_id:
                self.pending.remove(run)
                self.unhold(run.turn_id)
                self.conn.post(worker_link.Revoked(msg.turn_id))
                return

    def on_end_ack(self, msg: EndAck) -> None:
        if msg.turn_id == self.unacked:
            self.unacked = None
            if self.endlog is not None:
                # Frames arrive in order: the supervisor holds every End logged before this one.
                self.endlog.clear()
            if self.acked is not None and not self.acked.done():
                self.acked.set_result(None)

    def on_step_ack(self, msg: StepAck) -> None:
        """LOOP-STEP-DURABLE: the supervisor made the running turn's step records durable up to ``seq``."""
        turn = self.current
        if turn is not None and turn.id == msg.turn_id and turn._steplog is not None:
            turn._steplog.on_ack(msg)

    def on_run(self, msg: Run) -> None:
        if msg.after_pid:
            self.hold(msg)
        self.pending.append(msg)
        wakeup = self.wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    # ---- LADDER-HEIR: a turn held until a doomed worker is gone -------------------------------

    def hold(self, msg: Run) -> None:
        """``msg`` may start only once process ``after_pid`` is gone: watch its pidfd on the event
        loop (the main thread sleeps in ``epoll`` meanwhile: nothing spins), or wait for
        ``Proceed`` where it cannot be watched. Nothing is held if that process is gone already."""
        fd = _heir.watch(msg.after_pid, msg.after_start)
        if fd == _heir.GONE:
            return
        resolve_loaded(msg.agent)
        self.held[msg.turn_id] = fd
        if fd >= 0:
            self.conn._loop.add_reader(fd, self.proceed, msg.turn_id)

    def proceed(self, turn_id: str) -> None:
        """The process a held turn waits for is gone (its pidfd is readable, or the supervisor
        says so with ``Proceed``): the turn may start. Nothing if it is not held (it started
        already, or was dropped)."""
        if self.unhold(turn_id):
            wakeup = self.wakeup
            if wakeup is not None and not wakeup.done():
                wakeup.set_result(None)

    def unhold(self, turn_id: str) -> bool:
        """Stop holding ``turn_id`` (its watch is closed); False if it was not held."""
        fd = self.held.pop(turn_id, None)
        if fd is None:
            return False
        if fd >= 0:
            self.conn._loop.remove_reader(fd)
            os.close(fd)
        return True

    async def runner(self) -> None:
        while True:
            # LADDER-HEIR: a held turn at the head waits (asleep) until ``proceed`` wakes the runner.
            if not self.pending or (self.held and self.pending[0].turn_id in self.held):
                # Going idle: send what the finished turns posted now rather than one loop
                # iteration later (the call_soon'd flush then finds nothing to do).
                self.conn.flush()
                self.wakeup = self.conn._loop.create_future()
                try:
                    await self.wakeup
                finally:
                    self.wakeup = None
                continue
            if self.unacked is not None:
                self.conn.flush()
                self.acked = self.conn._loop.create_future()
                try:
                    await self.acked
                finally:
                    self.acked = None
                continue  # the queue may have changed meanwhile (Abort, Revoke)
            began = time.perf_counter()
            await self.run_turn(self.pending.popleft())
            self.ran_s += time.perf_counter() - began
            if self.ran_s >= LOOK_AFTER:
                self.settle_memory()

    def settle_memory(self) -> None:
        """MEM-TRIM: hand what the turns freed back to the system if it is worth it; their Ends
        leave first (a trim of hundreds of MiB takes milliseconds)."""
        self.ran_s = 0.0
        if self.heap.due():
            self.conn.flush()
            self.heap.trim_now()

    async def run_turn(self, msg: Run) -> None:
        conn = self.conn
        # LADDER-EARLY: a batch this turn holds up still leaves: the stale flusher watches every batch
        # posted (its Started first), waking from its park for it (WORKER-PARK).
        started_at = self.marker.mark(msg.turn_id) if self.marker is not None else 0.0  # survives the process
        # Before the post: a Started that the stale flusher sends in an earlier frame than the
        # End must make that End ask for an EndAck (WORKER-FLUSH).
        frames_at_start = conn.frames
        conn.post(worker_link.Started(msg.turn_id))
        try:
            value = wire.decode_payload(msg.input)
        except (msgspec.DecodeError, RecursionError) as exc:  # LINK-DEPTH: too deep to decode here
            self.post_end(End(msg.turn_id, "failed", error=_error(exc)), started_at)
            return
        turn = Turn(msg.turn_id, value, msg.session, msg.parent, conn, msg.attempt, msg.steps)
        self.current = turn
        _toolerrors.forget_raised()  # TOOL-TOLD-FOLLOWERS: what isolated calls raise is this turn's
        outcome: str
        output = wire.NIL
        error = None
        try:
            try:
                imported = msg.agent in _IMPORT_CACHE
                fn = load_agent(msg.agent)
                is_async = _ASYNC_CACHE.get(msg.agent)
                if is_async is None:
                    is_async = _ASYNC_CACHE[msg.agent] = _is_async(fn)
                if not imported and conn.edge.attached:
                    # The import may have taken long: an Abort that came meanwhile is honoured
                    # before the agent runs (LADDER-NO-STARTED), not after it returned.
                    conn.edge.reader()
                    turn.signal.raise_if_cancelled()
            except TurnCancelled:
                outcome = "aborted"
            except BaseException as exc:  # an import failure ends the turn, not the worker
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                outcome, error = "failed", _error(exc)
            else:
                self.current_async = is_async
                with _new_scope() as scope, traced(msg.trace):
                    self.current_scope = scope
                    try:
                        # WORKER-MAIN-THREAD: async agents on the main thread, plain def agents in a thread.
                        if is_async:
                            result = await fn(turn)
                        else:
                            result = await anyio.to_thread.run_sync(fn, turn)
                    except TurnCancelled:
                        outcome = "aborted"
                    except anyio.get_cancelled_exc_class():
                        if not turn.signal.cancelled:
                            raise
                        outcome = "aborted"
                        raise
                    except Exception as exc:  # noqa: BLE001
                        # TURN-FAILURES: an unrelated exception after a cancel stays failed.
                        outcome = "aborted" if _is_cancellation(exc, turn) else "failed"
                        if outcome == "failed":
                            error = _error(exc)
                    else:
                        try:
                            output = wire.encode_payload(result, what="agent output")
                            outcome = "completed"
                        except (TypeError, ValueError) as exc:  # not encodable, or too large
                            outcome, error = "failed", _error(exc)
                if scope.cancelled_caught:
                    outcome = "aborted"
        finally:
            self.current = None
            self.current_scope = None
        clean = sweep_leftovers()  # nothing the turn started outlives its End (any outcome)
        # Started already left in an earlier frame: the supervisor sees this turn running, so its End
        # must be confirmed before a handed turn (which might crash the process) starts.
        ack = conn.frames != frames_at_start
        end = End(msg.turn_id, outcome, output, error, ack)  # type: ignore[arg-type]
        if not clean:
            self.retire(end, started_at)
        self.post_end(end, started_at)

    def retire(self, end: End, started_at: float) -> NoReturn:
        """TREE-THREADS: the turn left a thread running (or something forking): this worker can
        never be made clean again. Its End goes to the End log only, and the worker exits: the
        supervisor reaps the whole tree (LADDER-STEPS) and then ends the turn as logged (WORKER-END-LOG), so
        the result comes after quiescence, and no other turn ever runs here. Without an End log (a non-ipc
        link) the End is sent on the link: its result may then come just before the exit."""
        data = wire.encode(end)
        if self.endlog is None or not self.endlog.append(data, started_at):
            self.conn.post(msgspec.Raw(data))
        self.conn.flush()  # the turns ended before it, and its Started, go now; the log has them too
        retire()

    async def warm_up(self) -> None:
        """WORKER-WARM: run one private no-op turn through the whole turn path before ``Ready``.

        A worker forked from the zygote shares its memory copy-on-write: the first turn it runs
        touches (refcounts, caches) hundreds of pages of code and objects that the kernel then
        copies one fault at a time, and fills the lazy caches (agent import, msgspec, anyio's
        cancel scope). Measured: a fresh worker's first no-op turn took ≈ 1.5 ms against ≈ 0.4 ms
        for its second - paid by the queued turn a warm spare takes over after a kill. Paid here
        instead, before the worker says it is ready. Nothing leaves the process: the start
        marker, the End log and the stale flusher are set aside, and what the turn posts is
        encoded (the encoder is warmed too) and dropped."""
        conn = self.conn
        marker, endlog, flusher = self.marker, self.endlog, conn.flusher
        posted: list[Any] = []
        if marker is not None:
            marker.prime()
        self.marker = self.endlog = None
        conn.flusher = None
        conn.post = posted.append  # type: ignore[method-assign,assignment]  # this instance only, restored below
        try:
            frame = worker_link.encode_frame([Run(_WARM_TURN, _WARM_AGENT, wire.encode_payload(None))])
            for msg in worker_link.decode_to_worker(frame):
                if isinstance(msg, Run):
                    await self.run_turn(msg)
            worker_link.encode_frame(posted)
            global _WARMED
            _WARMED = True
        except Exception as exc:  # noqa: BLE001 - only a speed-up: the worker serves without it
            print(f"turnpool worker: warm-up skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            del conn.post
            self.marker, self.endlog, conn.flusher = marker, endlog, flusher
            self.unacked = None
            _IMPORT_CACHE.pop(_WARM_AGENT, None)
            _ASYNC_CACHE.pop(_WARM_AGENT, None)

    def post_end(self, end: End, started_at: float) -> None:
        """Log the End (WORKER-END-LOG), then post it; an End the log cannot take asks for an EndAck
        (WORKER-FLUSH), which also empties the log. Encoded once: the frame carries the logged bytes."""
        endlog = self.endlog
        if endlog is None:
            if end.ack:
                self.unacked = end.turn_id
            self.conn.post(end)
            return
        data = wire.encode(end)
        if not endlog.append(data, started_at):
            if not end.ack:
                data = wire.encode(msgspec.structs.replace(end, ack=True))
            self.unacked = end.turn_id
        elif end.ack:
            self.unacked = end.turn_id
        self.conn.post(msgspec.Raw(data))


_WARM_TURN = "turnpool-warm-up"  # WORKER-WARM: never a supervisor's turn id, never sent
_WARM_AGENT = f"{__name__}:_warm_agent"


_WARMED = False  # this worker ran its warm-up turn


async def _warm_agent(turn: Turn) -> None:
    """The no-op agent of the warm-up turn (WORKER-WARM)."""


def forget_warm_up() -> None:
    """WORKER-SETTLE: the zygote ran the warm-up turn to specialise its code; its workers have not."""
    global _WARMED
    _WARMED = False


def warm_up_state() -> dict[str, bool]:
    """WORKER-WARM, for tests (``worker.lowlevel``): whether this worker ran its warm-up turn, and
    whether the warm-up's agent is still in the agent cache (it must not be)."""
    return {"ran": _WARMED, "cached": _WARM_AGENT in _IMPORT_CACHE}


def _is_cancellation(exc: BaseException, turn: Turn) -> bool:
    """An exception counts as the turn honouring its cancel only when a cancel was requested
    and the exception says it is a cancellation (``TurnCancelled`` or a subclass, or an
    exception group made only of them). Anything else is an unrelated failure."""
    if not turn.signal.cancelled:
        return False
    if isinstance(exc, TurnCancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_cancellation(e, turn) for e in exc.exceptions)
    return False


def own_files(marker_fd: int, endlog_fd: int) -> tuple[_marker.StartMarker | None, _endlog.EndLog | None]:
    """SEC-WORKER-FILES: map the start marker and End log the supervisor made for this worker and close their
    descriptors (-1: none), before the worker forks anything (its guardian) or runs any agent code."""
    marker = _marker.StartMarker(marker_fd) if marker_fd >= 0 else None
    endlog = _endlog.EndLog(endlog_fd) if endlog_fd >= 0 else None
    return marker, endlog


async def serve(
    endpoint: str,
    worker_id: str,
    token: str,
    heartbeat: float,
    marker: _marker.StartMarker | None = None,
    endlog: _endlog.EndLog | None = None,
    quick_exit: bool = False,
) -> None:
    """Run the worker's turn loop, noting each turn in ``marker`` and each end in ``endlog``.
    ``quick_exit``: at ``Shutdown`` the process ends at once (WORKER-QUICK-EXIT)."""
    # WORKER-LEAN-START: plain (not ``zmq.asyncio``) sockets: the link is read through its FD
    # (``ReadableEdge``), the monitor below too, so nothing of zmq.asyncio's machinery runs here.
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = open_socket(ctx, zmq.DEALER)  # WORKER-SHORT-SLICE
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_SIZE)
    sock.setsockopt(zmq.IDENTITY, worker_id.encode())
    sock.connect(endpoint)
    sync_sock = sock
    conn = Connection(sync_sock, asyncio.get_running_loop())
    loop = WorkerLoop(conn, marker, endlog)
    # ZeroMQ drops a connection whose peer sent a frame above MAXMSGSIZE (or broke the
    # protocol) and does not reconnect it: a worker left like that could never report a turn's
    # end again, so it must not stay up deaf. Watch for the disconnection and exit.
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    await loop.warm_up()  # WORKER-WARM: the first real turn finds the worker's pages its own
    cgroup_joined()  # WORKER-JOIN-CGROUP: in its cgroup before any turn of the supervisor's can run
    conn.send_now(worker_link.Ready(os.getpid(), token, worker_link.PROTOCOL_VERSION))
    aloop = asyncio.get_running_loop()
    stop = aloop.create_future()

    def on_readable() -> None:
        # Called by the event loop when the socket's FD is readable (and after a send: LINK-EDGE):
        # drain every frame, dispatch each message. No task switch per frame.
        # Under the connection's lock: the stale flusher's thread must not send meanwhile.
        with conn.lock:
            read_all()

    recv = sync_sock.recv
    events = sync_sock.get

    def read_all() -> None:
        first = True
        while True:
            # LINK-LONE: after each frame, one look at EVENTS (≈ 1.6 µs) says whether another is
            # there; a ``recv`` that finds none raises ``zmq.Again`` (≈ 4.4 µs). A worker gets one
            # frame per wake-up in the common case (a turn, or every turn handed in a burst).
            if not first and not cast(int, events(_EVENTS)) & _POLLIN:
                return
            first = False
            try:
                frame = recv(_NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            try:
                messages = worker_link.decode_to_worker(frame)
            except msgspec.DecodeError as exc:
                conn.post(worker_link.BadFrame(str(exc)[:200]))
                continue
            for msg in messages:
                match msg:
                    case Run():
                        loop.on_run(msg)
                    case Abort():
                        loop.on_abort(msg)
                    case Revoke():
                        loop.on_revoke(msg)
                    case EndAck():
                        loop.on_end_ack(msg)
                    case Proceed():
                        loop.proceed(msg.turn_id)
                    case StepAck():
                        loop.on_step_ack(msg)
                    case SpawnReply():
                        conn.spawn_reply(msg)
                    case Shutdown():
                        conn.flush()
                        if loop.endlog is not None:
                            # Sent only to a worker the supervisor holds idle: it has the End of
                            # every turn this worker ran, so the log has nothing left to save (and
                            # the supervisor need not read thousands of stale records at the exit).
                            loop.endlog.clear()
                        if quick_exit and not keeps_children():
                            _exit_now()
                        if not stop.done():
                            stop.set_result(None)

    flusher = watcher()  # WORKER-ONE-THREAD: the life-pipe watcher's thread, where there is one
    if flusher is None:
        flusher = StaleFlusher({signal.SIGTERM, PARENT_DEATH_SIGNAL})
        flusher.start()
    conn.flusher = flusher
    flusher.attach(conn)
    mark_engine_threads()  # TREE-THREADS: every thread alive now is the engine's
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_link, monitor)
            tg.start_soon(loop.runner)
            if heartbeat > 0:
                tg.start_soon(_heartbeats, conn, heartbeat)
            conn.edge.reader = on_readable
            conn.edge.attach(aloop)  # LINK-EDGE: the FD's reader, run once now
            try:
                await stop
            finally:
                conn.edge.detach()
            tg.cancel_scope.cancel()
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        ctx.term()


# WORKER-CWD: the directory the zygote put this worker in, as it was named before any agent code ran.
OWN_DIR: str | None = None


def _exit_now() -> NoReturn:
    """WORKER-QUICK-EXIT: an idle worker told to shut down ends here, in the message's handler. It
    holds no turn, no kept child, nothing the supervisor still needs (it has every End; the link
    closes with linger 0 either way): what the graceful path would add - cancelling the loop's tasks,
    closing the sockets, joining ZeroMQ's and anyio's threads, closing the loop - is CPU each of
    hundreds of exiting workers pays at once (about 1.5 of its 3.7 ms here), and nothing else.

    WORKER-CWD: its own directory goes with it when its agents left it empty (one ``rmdir``, which never
    removes anything else: a directory with something in it, a symlink put in its place), here, in
    each exiting worker at once, instead of one after another in the supervisor's thread; whatever
    is left the supervisor removes after the reap, as before."""
    if OWN_DIR is not None:
        with contextlib.suppress(OSError):
            os.rmdir(OWN_DIR)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


async def _watch_link(monitor: zmq.Socket[bytes]) -> None:
    # The monitor is read through its FD like the link (LINK-EDGE): one event is all it waits for.
    dropped = asyncio.get_running_loop().create_future()
    edge = ReadableEdge(monitor)

    def on_event() -> None:
        if edge.readable() and not dropped.done():
            dropped.set_result(None)

    edge.reader = on_event
    edge.attach(asyncio.get_running_loop())  # (runs it once now: an event already there)
    try:
        await dropped
    finally:
        edge.detach()
    print("turnpool worker: the connection to the supervisor dropped; exiting", file=sys.stderr, flush=True)
    kill_own_tree_and_exit(exit_code=EXIT_LINK_LOST)


async def _heartbeats(conn: Connection, interval: float) -> None:
    # WORKER-HEARTBEAT-NOW: sent at once, with whatever this pass posted before it, never posted: a batch
    # it began would wake the parked watcher thread for 50 ms of ticks (WORKER-PARK) every interval.
    pid = os.getpid()
    while True:
        await anyio.sleep(interval)
        conn.send_now(worker_link.Heartbeat(pid))
