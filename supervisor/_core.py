"""The embedded supervisor: owns the pool, the turn table, the queue and every turn's cancellation.

One anyio event loop owns all state; nothing here blocks on another thread. The pieces:

* the worker link: a ROUTER on a private ipc endpoint; workers connect DEALERs;
* the pool: ``workers`` slots running turns plus ``spares`` warm workers; exits are pidfd events;
* the turn table (``TurnRecord`` per turn: the one cancellation holder) and the ``TurnQueue``;
* the escalation ladder: ``Abort`` → ``grace`` → SIGTERM to the tree → ``kill_after`` → SIGKILL
  → reaped with every descendant → ``killed``; driven by one ``Timers`` task.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import re
import secrets
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import anyio
import anyio.to_thread
import msgspec
import zmq
import zmq.asyncio

import wire
from wire import DISPOSED, PARENT, Cause, TurnError, TurnResult, validate_cause
from worker import _cgroup, _endlog, _marker, _tree

from . import _output, _procs, _turninfo
from ._errors import InvalidAgent, QueueFull, SupervisorClosed, UnknownTurn, WorkerStartError
from ._handle import TurnHandle
from ._paths import private_dir
from ._pool import WorkerSlot
from ._timers import Timers
from ._turns import TurnQueue, TurnRecord
from ._zygote import Zygote

log = logging.getLogger("turnpool.supervisor")

AGENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_TURN_ID = 256
# A turn handed to workers that all died before reporting it started is re-queued at most this
# many times in all, then ends ``crashed`` (no poison turn loops through the pool forever).
MAX_HANDOVERS = 3
# Default cap on a turn's grace and kill_after (``max_grace``): a client-chosen grace can never
# hold shutdown for longer than this (issue 13, item 11).
MAX_GRACE = 300.0


_CHECKED_AGENTS: set[str] = set()


def check_agent(agent: Any) -> str:
    if type(agent) is str and agent in _CHECKED_AGENTS:
        return agent
    if isinstance(agent, str) and len(agent) > wire.MAX_AGENT_CHARS:  # R23: a result always fits a message
        raise InvalidAgent(f"agent must be at most {wire.MAX_AGENT_CHARS} characters, got {len(agent)}")
    if not isinstance(agent, str) or not AGENT_RE.match(agent):
        raise InvalidAgent(f"agent must be written 'package.module:attr', got {agent!r}")
    if len(_CHECKED_AGENTS) < 4096:
        _CHECKED_AGENTS.add(agent)
    return agent


def _check_seconds(name: str, value: Any, *, allow_none: bool = True, positive: bool = False) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{name} is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite number {'>' if positive else '>='} 0, got {value}")
    return value


def _check_optional_str(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_TURN_ID:
        raise TypeError(f"{name} must be a non-empty string of at most {MAX_TURN_ID} characters, got {value!r}")
    return value


class Supervisor:
    """Runs agent turns in a pool of worker processes and owns their cancellation.

    Use as ``async with Supervisor(...) as sup:``; leaving the block disposes: every turn is
    cancelled with cause ``disposed``, escalated as needed, and every worker reaped.

    Speed knobs (keyword-only): ``prefetch`` caps the turns a worker holds at once (running +
    handed ahead; 1 turns it off) and ``prefetch_window`` is how much work, at the recent mean
    turn time, may wait handed ahead behind a running turn (2 ms: trivial turns are prefetched
    deeply, long agent turns not at all); a handed-ahead turn still counts as queued until it
    starts. ``zygote`` forks workers from a preloaded process (a few ms instead of a fresh
    interpreter; workers inherit the environment as it was when the supervisor started) and
    ``preload`` names agent modules that process imports once for every worker.

    ``cgroups`` (default True) puts each worker in a cgroup v2 of its own where the unified
    hierarchy is writable (root, or a delegated subtree), so a worker's tree is killed at once
    with ``cgroup.kill`` and nothing escapes it; ``False`` forces the fallback (subreaper,
    freeze-and-signal, tree markers), which is also what runs where cgroups cannot be used.
    ``max_rss_mb`` is compared with the tree's proportional set size (PSS, shared pages split
    between the processes mapping them).
    Isolation (keyword-only): ``agent_path`` is where workers import agents from (R-PATH): a
    sequence of directories, searched first and exactly, then the interpreter's own path
    (installed packages); the default ``None`` mirrors this process's ``sys.path``, the embedding
    program's choice. Workers run in ``python -P`` safe-path mode, from this supervisor's private
    runtime directory, so a module planted in a working directory never runs.
    ``worker_output`` is where workers' stdout and stderr go (R-OUT), never shared with this
    process's stderr: ``"stderr"`` (default) forwards each line, prefixed ``w<n>[pid]``, to this
    process's stderr through a thread, so a stalled stderr never blocks the supervisor; a file
    path writes them to that log, rotated by size (``worker_output_max_mb``, default 16, per file;
    four files at most: ``PATH``, ``PATH.1`` … ``PATH.3``); ``None`` discards
    them; ``"inherit"`` shares this process's fd 2 with the workers as before (a stalled stderr
    then stalls workers and this process alike).
    """

    def __init__(
        self,
        workers: int = 4,
        grace: float = 5.0,
        kill_after: float = 2.0,
        spares: int = 1,
        max_turns_per_worker: int | None = None,
        max_rss_mb: float | None = None,
        *,
        timeout: float | None = None,
        max_queue: int = 100_000,
        max_events: int = 10_000,
        keep_results: int = 10_000,
        heartbeat: float = 1.0,
        start_timeout: float = 30.0,
        rss_interval: float = 0.25,
        stop_timeout: float = 5.0,
        python: str | None = None,
        worker_args: tuple[str, ...] = (),
        prefetch: int = 64,
        prefetch_window: float = 0.002,
        zygote: bool = True,
        preload: tuple[str, ...] = (),
        cgroups: bool = True,
        agent_path: Any = None,
        worker_output: Any = _output.STDERR,
        worker_output_max_mb: float = _output.MAX_BYTES / 2**20,
        max_grace: float = MAX_GRACE,
    ) -> None:
        if not isinstance(cgroups, bool):
            raise TypeError(f"cgroups must be True or False, got {cgroups!r}")
        for name, value, low in (("workers", workers, 1), ("spares", spares, 0), ("max_queue", max_queue, 1),
                                 ("max_events", max_events, 1), ("keep_results", keep_results, 1),
                                 ("prefetch", prefetch, 1)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if max_turns_per_worker is not None and (
            isinstance(max_turns_per_worker, bool) or not isinstance(max_turns_per_worker, int) or max_turns_per_worker < 1
        ):
            raise ValueError(f"max_turns_per_worker must be a positive int or None, got {max_turns_per_worker!r}")
        self.workers = workers
        # The cap on every turn's grace and kill_after (a submit above it is refused): a turn's
        # ladder, and so a disposal, is bounded whatever a client asks for.
        cap = _check_seconds("max_grace", max_grace, allow_none=False, positive=True)
        assert cap is not None
        self.max_grace = cap
        self.grace = self._check_grace("grace", _check_seconds("grace", grace, allow_none=False))
        self.kill_after = self._check_grace("kill_after",
                                            _check_seconds("kill_after", kill_after, allow_none=False))
        self.spares = spares
        self.max_turns_per_worker = max_turns_per_worker
        self.max_rss_mb = _check_seconds("max_rss_mb", max_rss_mb, positive=True)
        self.timeout = _check_seconds("timeout", timeout, positive=True)
        self.max_queue = max_queue
        self.max_events = max_events
        self.keep_results = keep_results
        self.heartbeat = _check_seconds("heartbeat", heartbeat, allow_none=False)
        self.start_timeout = _check_seconds("start_timeout", start_timeout, allow_none=False, positive=True)
        self.rss_interval = _check_seconds("rss_interval", rss_interval, allow_none=False, positive=True)
        self.stop_timeout = _check_seconds("stop_timeout", stop_timeout, allow_none=False)
        self.python = python
        self.worker_args = tuple(worker_args)
        # Turns a worker may hold at once (running + handed ahead): hides the round trip between
        # one turn's end and the next one's start. 1 turns prefetching off.
        self.prefetch = prefetch
        # How much work (seconds, at the recent mean turn time) a worker may hold beyond its current
        # turn: trivial turns are handed up to ``prefetch`` at a time, turns longer than the window
        # are not handed ahead at all, so a long agent turn never holds others behind it.
        self.prefetch_window = _check_seconds("prefetch_window", prefetch_window, allow_none=False)
        self._turn_time = self.prefetch_window  # EWMA of run times; starts at "too long to prefetch"
        self._depth = 1
        # Fork workers from a preloaded zygote (a few ms) instead of starting interpreters (≈50 ms+);
        # ``preload`` names agent modules the zygote imports once for every worker.
        # A custom interpreter or interpreter flags are honoured per worker: fresh interpreters then.
        self.use_zygote = bool(zygote) and python is None and not worker_args
        self.preload = tuple(preload)
        self._zygote: Zygote | None = None
        self.cgroups = cgroups
        self._cgroups: _cgroup.Pool | None = None  # our pool cgroup, when cgroups are in use
        self.agent_path = _procs.check_agent_path(agent_path)
        self.worker_output = _output.check_worker_output(worker_output)
        if isinstance(worker_output_max_mb, bool) or not isinstance(worker_output_max_mb, (int, float)) \
                or not 0 < worker_output_max_mb < float("inf"):
            raise ValueError(f"worker_output_max_mb must be a number of MiB > 0, "
                             f"got {worker_output_max_mb!r}")
        self.worker_output_max_mb = float(worker_output_max_mb)
        self._output: _output.WorkerOutput | None = None
        self._pythonpath = ""

        self._turns: dict[str, TurnRecord] = {}
        self._ended: collections.deque[str] = collections.deque()
        self._queue = TurnQueue()
        self._slots: dict[str, WorkerSlot] = {}
        self._by_ident: dict[bytes, WorkerSlot] = {}
        self._idle: collections.deque[WorkerSlot] = collections.deque()
        self._busy: dict[WorkerSlot, None] = {}  # slots holding a turn (running or handed), in order
        self._handed = 0  # turns handed ahead to a worker, not started yet (they count as queued)
        self._dirty: list[WorkerSlot] = []  # slots with messages waiting in slot.out
        self._batching = False  # inside the receive loop: frames go out once the batch is handled
        self._loop: asyncio.AbstractEventLoop | None = None
        self._recheck_scheduled = False
        self._pump_wanted = False  # a pump was asked for during a receive batch
        self._defer_pump = False
        # The event loop's clock once started (asyncio's loop.time() is time.monotonic()).
        self._clock: Callable[[], float] = time.monotonic
        self._timers = Timers(self._clock)
        self._ids = itertools.count(1)
        self._worker_ids = itertools.count(1)
        self._prefix = secrets.token_hex(4)
        self._running = 0  # turns a worker reported Started for and not yet ended
        self._active = 0  # turns accepted and not yet ended
        self._lent = 0  # slots lent by parents waiting on a spawned child
        self._idle_waiters: list[anyio.Event] = []
        self._outcomes: collections.Counter[str] = collections.Counter()
        self._causes: collections.Counter[str] = collections.Counter()
        self._escalations: collections.Counter[str] = collections.Counter()
        self.bad_frames = 0
        self.worker_restarts = 0
        self._start_failures = 0
        self._last_start_error: str | None = None
        self._backoff_until = 0.0
        self._refill_timer: Any = None
        self._ready_event: anyio.Event | None = None
        self._slots_changed = anyio.Event()
        self._result_hooks: list[Callable[[TurnRecord, TurnResult], None]] = []
        self._event_hooks: list[Callable[[TurnRecord, msgspec.Raw], None]] = []
        self._start_hooks: list[Callable[[TurnRecord, int], None]] = []
        self._accept_hooks: list[Callable[[TurnRecord], None]] = []
        # J6, the dispatch gate. When set (a journal sets it), a new turn is handed to a worker only
        # once (1) ``_recorded(turn)`` says its accept row is committed and (2) the gate, called with
        # a batch of recorded turns from the head of the queue, has answered ``_dispatch_cleared``:
        # a row saying they may run is committed. Intent before effect, in batches (group commit).
        self._dispatch_gate: Callable[[list[TurnRecord]], None] | None = None

        self._state = "new"  # new → running → closing → closed
        self._disposing = False
        self._kill_at_once = False  # kill_now(): every cancel goes straight to SIGKILL
        self._tg: anyio.abc.TaskGroup | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._send_sock: zmq.Socket[bytes] | None = None
        self._dir: Any = None
        self._endpoint = ""
        self._life_r = -1
        self._life_w = -1
        self._wall_offset = 0.0

    # ---- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Supervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Bind the worker link, start the pool and wait until ``workers`` workers are ready."""
        if self._state != "new":
            raise RuntimeError("a Supervisor can be started once")
        output = _output.WorkerOutput(self.worker_output,
                                      max_bytes=max(int(self.worker_output_max_mb * 2**20), 4096))
        output.start()  # a log that cannot be written fails here, before anything exists (R-OUT)
        self._output = output
        try:
            self._dir = private_dir()
        except BaseException:
            output.close()
            raise
        self._state = "running"
        _tree.set_child_subreaper()
        self._pythonpath = _procs.import_path(self.agent_path)
        self._endpoint = f"ipc://{self._dir}/workers.sock"
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        for opt, val in ((zmq.LINGER, 0), (zmq.SNDHWM, 0), (zmq.RCVHWM, 0), (zmq.ROUTER_MANDATORY, 1),
                         (zmq.MAXMSGSIZE, wire.MAX_MESSAGE_SIZE)):
            sock.setsockopt(opt, val)
        sock.bind(self._endpoint)
        self._sock = sock
        self._send_sock = zmq.Socket.shadow(sock.underlying)
        self._life_r, self._life_w = os.pipe()
        os.set_inheritable(self._life_r, True)
        self._ready_event = anyio.Event()
        # The loop's clock (what anyio.current_time() returns on asyncio) without anyio's
        # per-call backend lookup: it is read several times per turn.
        self._clock = asyncio.get_running_loop().time
        self._timers.clock = self._clock
        self._wall_offset = time.time() - self._clock()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._timers.run)
        self._tg.start_soon(self._receive)
        if self.cgroups:
            # Also sweeps pools left by supervisors killed with SIGKILL (may wait for their exits).
            self._cgroups = await anyio.to_thread.run_sync(_cgroup.Pool.create)
            if self._cgroups is None:
                log.info("cgroup v2 not usable here: worker trees are tracked by subreaper and markers")
        if self.use_zygote and _tree.set_child_subreaper():
            assert self._output is not None
            out_fd = self._output.open("zygote")
            try:
                self._zygote = Zygote.start(endpoint=self._endpoint, life_fd=self._life_r, python=self.python,
                                            extra_args=self.worker_args, preload=self.preload, out_fd=out_fd,
                                            cwd=str(self._dir), pythonpath=self._pythonpath,
                                            cgroup_pool=self._cgroups.path if self._cgroups else None)
            except OSError as exc:
                log.warning("could not start the zygote, starting workers as fresh interpreters: %s", exc)
            else:
                self._tg.start_soon(self._zygote_loop, self._zygote)
            finally:
                os.close(out_fd)
        if self.max_rss_mb is not None:
            self._tg.start_soon(self._memory_loop)
        try:
            self._fill_pool()
            with anyio.fail_after(self.start_timeout):
                await self._ready_event.wait()
            if self._ready_count() == 0:
                raise WorkerStartError(f"workers could not be started: {self._last_start_error}")
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, TimeoutError):
                raise WorkerStartError(
                    f"workers were not ready within {self.start_timeout}s"
                    + (f": {self._last_start_error}" if self._last_start_error else "")
                ) from None
            raise

    async def aclose(self) -> None:
        """Dispose: cancel every turn with cause ``disposed``, escalate, reap, release everything.

        Returns only when every worker and every descendant of one has been reaped.
        """
        if self._state in ("closing", "closed"):
            while self._state != "closed":
                await self._wait_change()
            return
        if self._state == "new":
            self._state = "closed"
            return
        self._state = "closing"
        with anyio.CancelScope(shield=True):
            self._disposing = True
            for turn in list(self._turns.values()):
                if turn.state in ("queued", "handed", "running"):
                    self._cancel(turn, DISPOSED)
            while self._active:
                ev = anyio.Event()
                self._idle_waiters.append(ev)
                await ev.wait()
            for slot in list(self._slots.values()):
                if slot.state in ("starting", "idle", "busy"):
                    self._retire(slot)
            while self._slots:
                await self._wait_change()
            await self._stop_zygote()
            if self._cgroups is not None:
                await anyio.to_thread.run_sync(self._cgroups.close)
                self._cgroups = None
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(None, None, None)
        finally:
            if self._sock is not None:
                self._sock.close(linger=0)
            if self._ctx is not None:
                self._ctx.term()
            for fd in (self._life_r, self._life_w):
                if fd >= 0:
                    os.close(fd)
            self._life_r = self._life_w = -1
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
            if self._output is not None:
                # Every worker is reaped: drain what they left and stop the pump, off the event loop.
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self._output.close)
            self._state = "closed"
            self._notify_change()

    def kill_now(self, turn_ids: Iterable[str] | None = None) -> None:
        """Skip the rest of every ladder: each live turn already being cancelled gets SIGKILL to
        its worker's tree now (it ends ``killed``), and from now on every cancel (disposal's
        included) does so at once, without grace or kill_after. Turns not cancelled run on.

        With ``turn_ids``, only those turns get SIGKILL now, cancelled or not, and later cancels
        keep their ladder. For a second SIGTERM/SIGINT (``turnpool serve``; a batch's second
        Ctrl-C): shutdown then waits for no client-chosen grace. Synchronous; call it on the
        supervisor's event loop. Unknown or ended ids are skipped.
        """
        if turn_ids is None:
            self._kill_at_once = True
            targets = [t for t in self._turns.values() if t.cause is not None]
        else:
            targets = [t for t in map(self._turns.get, turn_ids) if t is not None]
        for turn in targets:
            if turn.state not in ("handed", "running") or turn.worker is None:
                continue
            slot = turn.worker
            if turn.state == "handed":
                self._note_marked_start(slot)
            if turn.state == "running" and slot.turn is turn and turn.escalation < 2:
                if turn.esc_timer is not None:
                    turn.esc_timer.cancel()
                self._escalate(turn, slot, 2)

    def _check_grace(self, name: str, value: float | None) -> float | None:
        if value is not None and value > self.max_grace:
            raise ValueError(f"{name} must be at most this supervisor's max_grace ({self.max_grace:g} s), "
                             f"got {value:g}")
        return value

    async def _wait_change(self) -> None:
        await self._slots_changed.wait()

    def _notify_change(self) -> None:
        self._slots_changed.set()
        self._slots_changed = anyio.Event()

    @property
    def closed(self) -> bool:
        return self._state in ("closing", "closed")

    # ---- public API --------------------------------------------------------------------

    async def submit(
        self,
        agent: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,
        grace: float | None = None,
        kill_after: float | None = None,
        turn_id: str | None = None,
        retry: bool = False,
    ) -> TurnHandle:
        """Accept a turn and queue it; returns its handle at once.

        Raises ``InvalidAgent`` (agent syntax), ``TypeError`` (input not encodable, bad
        argument types), ``ValueError`` (negative times), ``QueueFull``, ``SupervisorClosed``.
        A ``turn_id`` that already exists returns the existing turn's handle (never runs twice).
        ``retry=True`` lets a daemon with a journal run the turn again after a restart that
        interrupted it (``attempts`` counts the runs); otherwise such a turn ends ``crashed``.
        """
        raw = wire.encode_payload(input, what="turn input")  # TypeError, or PayloadTooLarge (ValueError)
        turn = self._accept(agent, raw, session=session, timeout=timeout, grace=grace,
                            kill_after=kill_after, turn_id=turn_id, parent=None, retry=retry)
        return TurnHandle(self, turn.id)

    async def run(self, agent: str, input: Any = None, **kwargs: Any) -> TurnResult:
        """``submit`` then ``result``."""
        handle = await self.submit(agent, input, **kwargs)
        return await self._result(handle.turn_id)

    def handle(self, turn_id: str) -> TurnHandle:
        """A handle on an existing turn; raises ``UnknownTurn``."""
        self._get(turn_id)
        return TurnHandle(self, turn_id)

    async def cancel(self, turn_id: str, cause: Any = None) -> Cause | None:
        """Cancel a turn (default cause ``{"kind": "user"}``); returns the winning cause.

        On a turn that already ended nothing changes and the winning cause (or ``None``) is
        returned. Raises ``UnknownTurn``, ``TypeError``/``ValueError`` for a bad cause.
        """
        accepted = validate_cause(cause)
        turn = self._get(turn_id)
        return self._cancel(turn, accepted)

    async def cancel_session(self, session: str, cause: Any = None) -> list[str]:
        """Cancel the running turn of ``session`` and clear its turns queued now.

        Turns submitted afterwards run normally. Returns the ids of the turns cancelled.
        """
        accepted = validate_cause(cause)
        if not isinstance(session, str) or not session:
            raise TypeError(f"session must be a non-empty string, got {session!r}")
        return self._cancel_session(session, accepted)

    async def when_idle(self) -> None:
        """Return once no turn is queued or running, and every interrupted worker is reaped."""
        while self._active:
            ev = anyio.Event()
            self._idle_waiters.append(ev)
            await ev.wait()

    def status(self) -> dict[str, Any]:
        """Workers (id, pid, state, turn_id, turns_run, rss in bytes and rss_mb: resident memory of
        the worker's whole tree summed per process, so shared pages count once per process; pss and
        pss_mb: its proportional set size, shared pages split between the processes mapping them,
        which is what ``max_rss_mb`` is compared with; cgroup: the worker's own cgroup or None),
        the queue and counters."""
        workers = []
        for slot in self._slots.values():
            live = slot.state != "dead" and slot.pid
            rss = _procs.rss_of_tree(slot.pid) if live else 0
            pss = _procs.memory_of_tree(slot.pid) if live else 0
            workers.append({
                "id": slot.id, "pid": slot.pid, "state": slot.state,
                "turn_id": slot.turn.id if slot.turn else None, "turns_run": slot.turns_run,
                "rss": rss, "rss_mb": round(rss / 2**20, 1), "pss": pss, "pss_mb": round(pss / 2**20, 1),
                "cgroup": slot.cgroup,
            })
        return {
            "pid": os.getpid(),
            "state": self._state,
            "workers": workers,
            "queue": len(self._queue) + self._handed,
            "running": self._running,
            "outcomes": dict(self._outcomes),
            "causes": dict(self._causes),
            "escalations": dict(self._escalations),
            "bad_frames": self.bad_frames,
            "worker_restarts": self.worker_restarts,
            "last_start_error": self._last_start_error,
            "worker_output": self.describe_output(),
            "worker_output_dropped": self._output.dropped if self._output is not None else 0,
        }

    def describe_output(self) -> str:
        """Where workers' stdout and stderr go: a log file path, ``stderr``, ``inherit`` or ``discarded``."""
        return "discarded" if self.worker_output is None else str(self.worker_output)

    def turn_info(self, turn_id: str) -> dict[str, Any]:
        """One turn's live facts for front ends (state, agent, session, cause, escalation step and
        when the next signal is due, event count; its input while retained). Raises ``UnknownTurn``."""
        return _turninfo.info(self, self._get(turn_id), with_input=True)

    def turns(self, state: str | tuple[str, ...] = "running", *, limit: int = 100) -> list[dict[str, Any]]:
        """Turns in ``state`` (``queued``, ``running``, ``ended`` newest first; or a tuple of them) as
        ``turn_info`` dicts without input, at most ``limit``. Raises ``ValueError`` for another state."""
        return _turninfo.listing(self, (state,) if isinstance(state, str) else state, limit)

    # ---- handle backend ----------------------------------------------------------------

    def _get(self, turn_id: str) -> TurnRecord:
        try:
            return self._turns[turn_id]
        except (KeyError, TypeError):
            raise UnknownTurn(turn_id) from None

    async def _result(self, turn_id: str) -> TurnResult:
        turn = self._get(turn_id)
        if turn.result is None:
            if turn.done is None:
                turn.done = anyio.Event()
            await turn.done.wait()
        assert turn.result is not None
        return turn.result

    async def follow_raw(self, turn_id: str) -> AsyncIterator[tuple[int, msgspec.Raw]]:
        """The turn's events as ``(seq, raw)`` from the oldest retained; ends when the turn ends.

        At most ``max_events`` events are retained per turn: a follower that starts late or
        falls further behind than that skips the dropped ones (``seq`` shows the gap).
        """
        turn = self._get(turn_id)
        seq = turn.events_base
        while True:
            if seq < turn.events_base:
                seq = turn.events_base
            while seq - turn.events_base < len(turn.events):
                yield seq, turn.events[seq - turn.events_base]
                seq += 1
                if seq < turn.events_base:
                    seq = turn.events_base
            if turn.state == "ended" or turn.pending_result is not None:
                return
            ev = anyio.Event()
            turn.waiters.append(ev)
            await ev.wait()

    async def _events(self, turn_id: str) -> AsyncIterator[Any]:
        async for _, raw in self.follow_raw(turn_id):
            yield wire.decode_payload(raw)

    # ---- accepting and cancelling ------------------------------------------------------

    def _accept(
        self,
        agent: str,
        raw: msgspec.Raw,
        *,
        session: str | None,
        timeout: float | None,
        grace: float | None,
        kill_after: float | None,
        turn_id: str | None,
        parent: str | None,
        retry: bool = False,
        attempts: int = 1,
        readmit: bool = False,
    ) -> TurnRecord:
        if not isinstance(retry, bool):
            raise TypeError(f"retry must be True or False, got {retry!r}")
        check_agent(agent)
        session = _check_optional_str("session", session)
        turn_id = _check_optional_str("turn_id", turn_id)
        timeout = _check_seconds("timeout", timeout, positive=True)
        grace = self._check_grace("grace", _check_seconds("grace", grace))
        kill_after = self._check_grace("kill_after", _check_seconds("kill_after", kill_after))
        if self._state != "running":
            raise SupervisorClosed("the supervisor is shutting down" if self._state == "closing"
                                   else "the supervisor is not running")
        if turn_id is not None and turn_id in self._turns:
            return self._turns[turn_id]
        if not readmit and len(self._queue) + self._handed >= self.max_queue:
            raise QueueFull(f"the queue already holds {self.max_queue} turns")
        if turn_id is None:
            turn_id = f"{self._prefix}-{next(self._ids)}"
        turn = TurnRecord(
            turn_id, agent, raw, session, parent,
            timeout if timeout is not None else self.timeout,
            grace if grace is not None else self.grace,
            kill_after if kill_after is not None else self.kill_after,
            self._clock(),
        )
        turn.retry = retry
        turn.attempts = attempts
        if self._dispatch_gate is not None:
            turn.recorded = readmit  # a readmitted turn's row is already in the journal
            turn.dispatchable = False
        self._turns[turn_id] = turn
        self._active += 1
        for accept_hook in self._accept_hooks:
            accept_hook(turn)
        self._queue.push(turn)
        self._pump()
        return turn

    def _readmit(self, agent: str, raw: msgspec.Raw, **kwargs: Any) -> TurnRecord:
        """Accept again a turn the journal already acknowledged (restart recovery, J3): the
        ``max_queue`` limit does not apply, since refusing would lose a turn a client was promised.
        For recovery only; new submits go through ``_accept``."""
        return self._accept(agent, raw, readmit=True, **kwargs)

    def _recorded(self, turn: TurnRecord) -> None:
        """The journal committed ``turn``'s accept row: it may now pass the dispatch gate."""
        turn.recorded = True
        self._pump()

    def _dispatch_cleared(self, turns: list[TurnRecord]) -> None:
        """The gate committed the "may run" row of ``turns``: hand them to workers."""
        for turn in turns:
            turn.clearing = False
            turn.dispatchable = True
        self._pump()

    def _withdraw(self, turn: TurnRecord, why: str) -> None:
        """A turn whose accept row could not be committed: it was never acknowledged and never
        ran (the gate held it); it ends ``failed`` (``JournalUnavailable``) and its id is forgotten."""
        if turn.state == "queued" and not turn.dispatchable:
            self._queue.discard(turn)
            self._finish(turn, "failed", error=TurnError("JournalUnavailable", why))
        if turn.parent is None and turn.state == "ended":
            self._turns.pop(turn.id, None)

    def _request_dispatch(self) -> None:
        """J6: ask the gate to clear the recorded turns at the head of the queue, as many as
        the workers could take now (running + handed ahead + cleared ≤ capacity × depth)."""
        gate = self._dispatch_gate
        assert gate is not None
        want = (self.workers + self._lent) * self._depth - self._running - self._handed
        batch: list[TurnRecord] = []
        for turn in self._queue.ready:
            if want <= 0:
                break
            if turn.state != "queued":
                continue
            if turn.dispatchable or turn.clearing:
                want -= 1  # already cleared (or on its way): counts against what workers can take
                continue
            if not turn.recorded:
                break  # in order: no turn is cleared ahead of an earlier one
            turn.clearing = True
            batch.append(turn)
            want -= 1
        if batch:
            gate(batch)

    def _cancel(self, turn: TurnRecord, cause: Cause) -> Cause | None:
        state = turn.state
        if state == "ended" or state == "ending":
            return turn.cause
        first = turn.cause is None
        if first:
            turn.cause = cause
        for child_id in list(turn.children):
            child = self._turns.get(child_id)
            if child is not None:
                self._cancel(child, PARENT)
        if state == "queued":
            self._queue.discard(turn)
            self._finish(turn, "aborted")
        elif state == "handed" and first:
            # Handed ahead: the worker drops it unstarted (End aborted, never Started), or, if it
            # started meanwhile, honours the Abort. Its start marker tells whether it started (S1):
            # the ladder is armed now either way, and looks again if it had not.
            slot = turn.worker
            assert slot is not None
            self._send(slot, wire.Abort(turn.id, turn.cause))  # type: ignore[arg-type]
            self._note_marked_start(slot)
            if turn.esc_timer is None:  # (armed already if the marker showed it running)
                self._arm_escalation(turn, slot)
        elif state == "running" and first:
            slot = turn.worker
            assert slot is not None
            self._send(slot, wire.Abort(turn.id, turn.cause))  # type: ignore[arg-type]
            self._arm_escalation(turn, slot)
        return turn.cause

    def _arm_escalation(self, turn: TurnRecord, slot: WorkerSlot) -> None:
        if self._kill_at_once:
            turn.esc_timer = self._timers.call_later(0, self._escalate, turn, slot, 2)
        else:
            turn.esc_timer = self._timers.call_later(turn.grace, self._escalate, turn, slot, 1)

    def _cancel_session(self, session: str, cause: Cause) -> list[str]:
        cancelled = []
        for turn in self._queue.queued_of_session(session):
            self._cancel(turn, cause)
            cancelled.append(turn.id)
        for slot in list(self._slots.values()):
            for turn in list(slot.ahead):
                if turn.session == session and turn.state == "handed":
                    self._cancel(turn, cause)
                    cancelled.append(turn.id)
            turn = slot.turn
            if turn is not None and turn.session == session and turn.state == "running":
                self._cancel(turn, cause)
                cancelled.append(turn.id)
        return cancelled

    def _deadline(self, turn: TurnRecord) -> None:
        self._cancel(turn, wire.DEADLINE)

    def _escalate(self, turn: TurnRecord, slot: WorkerSlot, step: int) -> None:
        if turn.state == "handed" and turn.worker is slot and slot.state != "dead":
            # Cancelled while handed ahead and no Started yet: the start marker may say it runs (S1).
            self._note_marked_start(slot)
            if turn.state == "handed":  # not reached yet: look again later (its Started re-arms too)
                again = max(turn.grace, 0.05)
                turn.esc_timer = self._timers.call_later(again, self._escalate, turn, slot, step)
                return
        # Keyed by turn: act only if this worker is still on this very turn.
        if slot.turn is not turn or slot.state == "dead":
            return
        slot.doomed = True
        if step == 1:
            turn.escalation = 1
            self._escalations["sigterm"] += 1
            log.warning("escalate turn=%s pid=%s step=SIGTERM after grace %.3gs", turn.id, slot.pid, turn.grace)
            _procs.signal_tree(slot.pid, signal.SIGTERM, known=slot.known)
            turn.esc_timer = self._timers.call_later(turn.kill_after, self._escalate, turn, slot, 2)
        else:
            turn.escalation = 2
            self._escalations["sigkill"] += 1
            log.warning("escalate turn=%s pid=%s step=SIGKILL after kill_after %.3gs", turn.id, slot.pid,
                        turn.kill_after)
            _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)

    # ---- ending ------------------------------------------------------------------------

    def _finish(
        self,
        turn: TurnRecord,
        outcome: str,
        output: Any = None,
        error: TurnError | None = None,
        exit_code: int | None = None,
        worker_pid: int | None = None,
    ) -> None:
        now = self._clock()
        cause = turn.cause
        if self._disposing and outcome in ("aborted", "killed"):
            cause = DISPOSED  # disposal wins over an earlier user or parent cause
        started_at = turn.started_at
        result = TurnResult(
            turn_id=turn.id, outcome=outcome, output=output, error=error, cause=cause,  # type: ignore[arg-type]
            started=turn.started, worker_pid=worker_pid, exit_code=exit_code,
            queued_s=(started_at if started_at is not None else now) - turn.submitted_at,
            run_s=(now - started_at) if started_at is not None else 0.0,
            session=turn.session, parent=turn.parent, agent=turn.agent, attempts=turn.attempts,
            submitted_at=turn.submitted_at + self._wall_offset,
            started_at=started_at + self._wall_offset if started_at is not None else None,
            ended_at=now + self._wall_offset,
        )
        if turn.timer is not None:
            turn.timer.cancel()
        if turn.esc_timer is not None:
            turn.esc_timer.cancel()
        if turn.state == "running":
            self._running -= 1
        live_children = [c for c in turn.children if c in self._turns and self._turns[c].state != "ended"]
        if live_children:
            # A child never outlives its parent: hold the parent's result until they end.
            turn.state = "ending"
            turn.pending_result = result
            turn.wake_followers()
            for child_id in live_children:
                self._cancel(self._turns[child_id], PARENT)
            return
        self._deliver(turn, result)

    def _deliver(self, turn: TurnRecord, result: TurnResult) -> None:
        turn.result = result
        turn.pending_result = None
        turn.state = "ended"
        turn.ended_at = self._clock()
        turn.input = None  # type: ignore[assignment]  # no longer needed: free it
        self._outcomes[result.outcome] += 1
        if result.cause is not None:
            self._causes[result.cause.kind] += 1
        self._active -= 1
        if turn.done is not None:
            turn.done.set()
        turn.wake_followers()
        for hook in self._result_hooks:
            hook(turn, result)
        if turn.session is not None:
            self._queue.session_quiescent(turn)
        lent_changed = turn.spawn_origin is not None
        if lent_changed:
            slot, req = turn.spawn_origin  # type: ignore[misc]
            turn.spawn_origin = None
            self._lent -= 1
            slot.spawns.pop(req, None)
            if slot.state == "busy" and slot.turn is not None and slot.turn.id == turn.parent:
                self._send(slot, wire.SpawnReply(req, result=result))
        if turn.parent is not None:
            parent = self._turns.get(turn.parent)
            if parent is not None:
                parent.children.discard(turn.id)
                if parent.pending_result is not None and not any(
                    self._turns.get(c) is not None and self._turns[c].state != "ended" for c in parent.children
                ):
                    # Delivered now, after its last child: that is when it became quiescent.
                    held = msgspec.structs.replace(
                        parent.pending_result, ended_at=self._clock() + self._wall_offset
                    )
                    self._deliver(parent, held)
        self._ended.append(turn.id)
        if len(self._ended) > self.keep_results:
            old = self._turns.get(self._ended.popleft())
            if old is not None and old.state == "ended":
                del self._turns[old.id]
        if self._active == 0 and self._idle_waiters:
            waiters, self._idle_waiters = self._idle_waiters, []
            for ev in waiters:
                ev.set()
        self._pump()
        if lent_changed:
            self._fill_pool()

    # ---- dispatch ----------------------------------------------------------------------

    def _pump(self) -> None:
        """Hand queued turns to workers: first one to each idle worker (up to ``workers``
        busy at once), then top busy workers up to ``prefetch`` turns each. A turn handed
        ahead must never wait behind a busy worker while another can take it: see ``_rebalance``.

        Inside a receive batch it runs once, at the end of the batch (not once per message)."""
        if self._defer_pump:
            self._pump_wanted = True
            return
        if self._dispatch_gate is not None:
            self._request_dispatch()
        queue = self._queue
        if not queue.has_ready():
            if self._handed and self._idle:
                self._rebalance()
            return
        idle = self._idle
        busy = self._busy
        cap = self.workers + self._lent
        while idle and len(busy) < cap:
            slot = idle[0]
            if slot.state != "idle":
                idle.popleft()
                continue
            turn = queue.pop()
            if turn is None:
                return
            idle.popleft()
            slot.state = "busy"
            busy[slot] = None
            self._hand(slot, turn)
        if self._depth > 1 and queue.has_ready():
            self._top_up()

    def _note_turn_time(self, run_s: float) -> None:
        t = self._turn_time = self._turn_time + 0.2 * (run_s - self._turn_time)
        window = self.prefetch_window
        self._depth = 1 + min(self.prefetch - 1, int(window / t)) if t < window else 1

    def _top_up(self) -> None:
        depth = self._depth
        limit = self.max_turns_per_worker
        queue = self._queue
        while True:
            gave = False
            for slot in self._busy:
                n = len(slot.ahead) + (slot.turn is not None)
                if n >= depth or slot.doomed:
                    continue
                current = slot.turn
                # Never queue behind a turn being cancelled or waiting on a child it spawned.
                if current is not None and (current.cause is not None or current.children):
                    continue
                if limit is not None and slot.turns_run + n >= limit:
                    continue
                turn = queue.pop()
                if turn is None:
                    return
                self._hand(slot, turn)
                gave = True
            if not gave:
                return

    def _hand(self, slot: WorkerSlot, turn: TurnRecord) -> None:
        turn.state = "handed"
        turn.worker = slot
        slot.ahead.append(turn)
        self._handed += 1
        if turn.timeout is not None:
            # S1: the deadline is armed at handoff; it counts from the start the worker reports
            # or notes in its start marker, whichever the supervisor learns first.
            turn.timer = self._timers.call_later(turn.timeout, self._handed_deadline, turn, slot)
        self._send(slot, wire.Run(turn.id, turn.agent, turn.input, turn.session, turn.parent))

    def _handed_deadline(self, turn: TurnRecord, slot: WorkerSlot) -> None:
        """A handed turn's timeout has passed since handoff and no Started came: if the worker
        noted it started, the deadline counts from then; if not, look again one timeout later
        (it cannot have started before now, so its deadline is at least that far)."""
        if turn.state != "handed" or turn.worker is not slot:
            return
        self._note_marked_start(slot)  # arms the deadline from the noted start
        if turn.state == "handed" and turn.timeout is not None:
            turn.timer = self._timers.call_later(turn.timeout, self._handed_deadline, turn, slot)

    def _note_marked_start(self, slot: WorkerSlot) -> TurnRecord | None:
        """S1: the worker notes each turn in its start marker before any of the turn's code runs.
        If it names a turn handed to this worker whose Started has not arrived (a turn stuck
        before it could send it), that turn is running from the noted time: started, deadline
        counted from then, escalatable. Turns handed before it were passed by the worker: their
        Started and End are still theirs when they come. Returns the turn so found."""
        if slot.turn is not None or not slot.ahead or slot.state == "dead":
            return None
        path = _marker.path_for(self._endpoint, slot.id)
        noted = _marker.read_noted(path) if path is not None else None
        if noted is None:
            return None
        turn_id, at = noted
        ahead = slot.ahead
        index = next((i for i, t in enumerate(ahead) if t.id == turn_id), -1)
        if index < 0:
            return None
        turn = ahead[index]
        for before in list(ahead)[:index]:
            slot.passed.add(before.id)
        now = self._clock()
        log.info("turn %s: started per worker %s's start marker (no Started yet)", turn.id, slot.id)
        self._start_turn(slot, turn, min(max(at, turn.submitted_at), now))
        return turn

    def _start_turn(self, slot: WorkerSlot, turn: TurnRecord, started_at: float) -> None:
        """The turn handed to ``slot`` runs from ``started_at``: arm its deadline (and its
        escalation, if it was cancelled while handed)."""
        slot.ahead.remove(turn)
        self._handed -= 1
        turn.revoking = False
        slot.turn = turn
        turn.state = "running"
        self._running += 1
        if turn.timer is not None:  # the handoff deadline (S1)
            turn.timer.cancel()
            turn.timer = None
        if not turn.started:
            turn.started = True
            turn.started_at = started_at
            if turn.timeout is not None:
                turn.timer = self._timers.call_at(started_at + turn.timeout, self._deadline, turn)
            for start_hook in self._start_hooks:
                start_hook(turn, slot.pid)
        if turn.cause is not None and turn.esc_timer is None:
            # Cancelled while handed ahead, started before the Abort arrived.
            self._arm_escalation(turn, slot)

    def _unhand(self, slot: WorkerSlot, turn: TurnRecord) -> None:
        """A handed turn leaves its worker unstarted: it is a queued turn again (not in the queue)."""
        try:
            slot.ahead.remove(turn)
        except ValueError:
            pass
        self._handed -= 1
        turn.state = "queued"
        turn.worker = None
        turn.revoking = False
        slot.passed.discard(turn.id)
        if turn.timer is not None:  # the handoff deadline: armed again at the next handoff
            turn.timer.cancel()
            turn.timer = None
        if turn.esc_timer is not None:
            turn.esc_timer.cancel()
            turn.esc_timer = None

    def _rebalance(self) -> None:
        """Nothing is queued, a worker could take a turn, yet turns wait handed ahead behind a
        running one: revoke them so they come back to the queue and go to the free worker."""
        if len(self._busy) >= self.workers + self._lent or not any(s.state == "idle" for s in self._idle):
            return
        for slot in self._busy:
            ahead = slot.ahead
            if not ahead:
                continue
            waiting = ahead if slot.turn is not None else list(ahead)[1:]
            for turn in waiting:
                if not turn.revoking and turn.cause is None:
                    turn.revoking = True
                    self._send(slot, wire.Revoke(turn.id))

    def _send(self, slot: WorkerSlot, msg: Any) -> None:
        out = slot.out
        out.append(msg)
        if len(out) == 1:
            self._dirty.append(slot)
        if not self._batching:
            self._flush()

    def _flush(self) -> None:
        """Send each worker's batched messages as one frame."""
        assert self._send_sock is not None
        dirty, self._dirty = self._dirty, []
        for slot in dirty:
            out, slot.out = slot.out, []
            try:
                self._send_sock.send_multipart([slot.ident, wire.encode_frame(out)], zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                # The worker is gone (its exit event settles its turns) or its connection dropped
                # (it cannot be reached, so it would hold its turns forever): make sure it is gone.
                log.debug("send to worker %s failed: %s", slot.id, exc)
                if slot.state in ("idle", "busy", "stopping"):
                    log.warning("worker %s (pid %s) unreachable (%s): killing its tree", slot.id, slot.pid, exc)
                    slot.doomed = True
                    _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)
        if dirty and not self._batching:
            # A send can consume the edge of ZeroMQ's edge-triggered FD: if something is waiting
            # to be read, read it soon (the reader callback itself re-checks after each batch).
            if (self._send_sock.getsockopt(zmq.EVENTS) & zmq.POLLIN and not self._recheck_scheduled
                    and self._loop is not None):
                self._recheck_scheduled = True
                self._loop.call_soon(self._on_readable)

    # ---- the pool ----------------------------------------------------------------------

    def _ready_count(self) -> int:
        return sum(1 for s in self._slots.values() if s.state in ("idle", "busy"))

    def _fill_pool(self) -> None:
        if self._state != "running":
            return
        target = self.workers + self.spares + self._lent
        live = sum(1 for s in self._slots.values() if s.live and not s.doomed)
        now = self._clock()
        if live < target and now < self._backoff_until:
            if self._refill_timer is None:
                self._refill_timer = self._timers.call_at(self._backoff_until, self._refill)
            return
        while live < target:
            self._spawn()
            live += 1

    def _refill(self) -> None:
        self._refill_timer = None
        self._fill_pool()

    def _spawn(self) -> None:
        assert self._tg is not None
        worker_id = f"w{next(self._worker_ids)}"
        token = secrets.token_hex(16)
        marker = f"{os.getpid()}-{self._prefix}-{worker_id}"
        # Made before the worker exists: it joins it before it forks anything.
        cgroup = self._cgroups.worker_dir(worker_id) if self._cgroups is not None else None
        zygote = self._zygote
        assert self._output is not None
        out_fd = self._output.open(worker_id)
        try:
            self._spawn_with(worker_id, token, marker, zygote, out_fd, cgroup)
        finally:
            os.close(out_fd)  # the worker holds its own copy as fds 1 and 2

    def _spawn_with(
        self, worker_id: str, token: str, marker: str, zygote: Zygote | None, out_fd: int, cgroup: str | None
    ) -> None:
        assert self._tg is not None
        if zygote is not None and not zygote.lost:
            if zygote.request(worker_id, token, marker, self.heartbeat, out_fd):
                # The pid comes back from the zygote (``_zygote_pids``); until then it is 0.
                slot = WorkerSlot(worker_id, 0, None, token, marker, self._clock())
                slot.cgroup = cgroup
                self._slots[worker_id] = slot
                self._by_ident[slot.ident] = slot
                slot.timer = self._timers.call_later(self.start_timeout, self._start_timed_out, slot)
                return
            self._zygote_lost(zygote)
        try:
            pid = _procs.spawn_worker(
                endpoint=self._endpoint, worker_id=worker_id, token=token, marker=marker,
                life_fd=self._life_r, heartbeat=self.heartbeat, python=self.python, extra_args=self.worker_args,
                cgroup=cgroup,
                out_fd=out_fd, cwd=str(self._dir), pythonpath=self._pythonpath,
            )
        except OSError as exc:
            if cgroup is not None:
                _cgroup.remove(cgroup)
            self._start_failed(f"could not start a worker: {exc}")
            return
        if self._output is not None:
            self._output.name(worker_id, pid)
        slot = WorkerSlot(worker_id, pid, _procs.pidfd(pid), token, marker, self._clock())
        slot.cgroup = cgroup
        if cgroup is not None:
            _procs.CGROUPS[pid] = cgroup
        self._slots[worker_id] = slot
        self._by_ident[slot.ident] = slot
        slot.timer = self._timers.call_later(self.start_timeout, self._start_timed_out, slot)
        self._tg.start_soon(self._watch, slot)

    # ---- the zygote --------------------------------------------------------------------

    async def _zygote_loop(self, zygote: Zygote) -> None:
        while not zygote.lost:
            await anyio.wait_readable(zygote.resp_fd)
            if self._zygote is not zygote:
                return
            self._zygote_pids()
        self._zygote_lost(zygote)

    def _zygote_pids(self) -> None:
        zygote = self._zygote
        if zygote is None:
            return
        for worker_id, pid in zygote.read():
            slot = self._slots.get(worker_id)
            if slot is None or slot.pid:
                continue
            if pid <= 0:
                self._drop_unborn(slot, f"the zygote could not fork worker {worker_id} (errno {-pid})")
                continue
            slot.pid = pid
            slot.fd = _procs.pidfd(pid)
            if slot.cgroup is not None:
                _procs.CGROUPS[pid] = slot.cgroup
            if self._output is not None:
                self._output.name(worker_id, pid)
            assert self._tg is not None
            self._tg.start_soon(self._watch, slot)
            if slot.state == "stopping":  # retired before its pid was known
                _procs.signal_tree(pid, signal.SIGKILL, known=slot.known)
            ready, slot.deferred_ready = slot.deferred_ready, None
            if ready is not None:
                self._on_message(slot, ready)
        if zygote.lost:
            self._zygote_lost(zygote)

    def _drop_unborn(self, slot: WorkerSlot, reason: str) -> None:
        """A slot whose worker will never exist (the zygote failed or died before forking it)."""
        if slot.timer is not None:
            slot.timer.cancel()
        if slot.cgroup is not None:
            _cgroup.remove(slot.cgroup)
        slot.state = "dead"
        self._slots.pop(slot.id, None)
        self._by_ident.pop(slot.ident, None)
        self._start_failed(reason)
        self._notify_change()
        self._fill_pool()

    def _zygote_lost(self, zygote: Zygote) -> None:
        """The zygote exited: workers asked of it and not reported are never coming; start
        the next ones as fresh interpreters."""
        if self._zygote is not zygote:
            return
        self._zygote = None
        if self._state == "running":
            log.warning("the zygote (pid %s) is gone: starting workers as fresh interpreters", zygote.pid)
        assert self._tg is not None
        self._tg.start_soon(self._reap_zygote, zygote)
        for slot in [s for s in self._slots.values() if not s.pid]:
            self._drop_unborn(slot, "the zygote exited before forking the worker")
        self._fill_pool()

    async def _reap_zygote(self, zygote: Zygote) -> None:
        with anyio.CancelScope(shield=True):
            zygote.close_requests()
            with anyio.move_on_after(self.stop_timeout):
                await _procs.wait_exit(zygote.pid, zygote.fd)
            if _procs.reap(zygote.pid) is None and _procs._alive(zygote.pid):
                await _procs.kill_and_reap([zygote.pid])
            zygote.read()  # embryos announced meanwhile
            # Unassigned embryos see EOF on their pipe once the zygote is gone and exit; they are
            # our children (re-parented), so reap them.
            for pid in list(zygote.embryos):
                fd = _procs.pidfd(pid)
                with anyio.move_on_after(self.stop_timeout):
                    await _procs.wait_exit(pid, fd)
                if fd is not None:
                    os.close(fd)
                if _procs.reap(pid) is None and _procs._alive(pid):
                    await _procs.kill_and_reap([pid])
            zygote.close()

    async def _stop_zygote(self) -> None:
        zygote = self._zygote
        if zygote is None:
            return
        self._zygote = None
        await self._reap_zygote(zygote)

    def _start_failed(self, reason: str) -> None:
        self._start_failures += 1
        self._last_start_error = reason
        delay = min(0.05 * 2 ** min(self._start_failures, 8), 5.0)
        self._backoff_until = self._clock() + delay
        log.error("worker start failed (%d in a row, retrying in %.2fs): %s", self._start_failures, delay, reason)
        if self._ready_event is not None and not self._ready_event.is_set() and self._start_failures >= 3 \
                and self._ready_count() == 0:
            self._ready_event.set()  # start() reports the failure instead of waiting for the deadline

    def _start_timed_out(self, slot: WorkerSlot) -> None:
        if slot.state == "starting" and not slot.pid:
            self._drop_unborn(slot, f"the zygote reported no pid for worker {slot.id} within {self.start_timeout}s")
            return
        if slot.state == "starting":
            slot.failure = f"worker {slot.id} (pid {slot.pid}) sent no Ready within {self.start_timeout}s"
            self._last_start_error = slot.failure
            _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)

    def _retire(self, slot: WorkerSlot) -> None:
        """Ask an idle worker to exit; kill its tree if it has not within ``stop_timeout``."""
        if slot.state in ("stopping", "dead"):
            return
        was = slot.state
        slot.state = "stopping"
        if slot.timer is not None:
            slot.timer.cancel()
        if was == "idle":
            self._send(slot, wire.Shutdown())
            slot.timer = self._timers.call_later(self.stop_timeout, self._stop_timed_out, slot)
        else:
            _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)

    def _stop_timed_out(self, slot: WorkerSlot) -> None:
        if slot.state != "dead":
            log.warning("worker %s (pid %s) did not exit after Shutdown: killing its tree", slot.id, slot.pid)
            _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)

    async def _watch(self, slot: WorkerSlot) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await _procs.wait_exit(slot.pid, slot.fd)
            finally:
                if slot.fd is not None:
                    os.close(slot.fd)
                    slot.fd = None
            await self._on_exit(slot)

    async def _on_exit(self, slot: WorkerSlot) -> None:
        # Frames the worker sent before it died (its Started, its End) may still sit in the
        # socket: handle them first, so a turn that started is not mistaken for one that did not.
        was = slot.state
        slot.state = "dead"  # first: an End drained here must not hand the slot a new turn
        self._drain()
        code = _procs.reap(slot.pid)
        slot.exit_code = code
        if slot.timer is not None:
            slot.timer.cancel()
        self._by_ident.pop(slot.ident, None)
        # Quiescence: every descendant is killed and reaped before the turn's result is out.
        exclude = {s.pid for s in self._slots.values()}
        if self._zygote is not None:
            exclude.add(self._zygote.pid)
            exclude |= self._zygote.embryos
        pending = set(slot.known) - {slot.pid}
        if slot.cgroup is not None:
            # Atomic: everything in the worker's cgroup dies at once, whatever sessions it made.
            # Not excluded below: one reaped too early (its parent still dying) is a zombie of
            # ours later, and the scan finds it by its cgroup.
            await _procs.kill_cgroup(slot.cgroup)
        for _ in range(8):
            found = set(_procs.orphans_of(slot.pid, slot.marker, exclude, slot.cgroup)) - pending
            if not pending and not found:
                break
            await _procs.kill_and_reap(pending | found)
            exclude |= pending | found
            pending = set()
        if slot.cgroup is not None:
            _procs.CGROUPS.pop(slot.pid, None)
            _cgroup.remove(slot.cgroup)  # empty by now; the pool's removal retries what is not
        del self._slots[slot.id]
        self._busy.pop(slot, None)
        slot.out = []
        # Turns handed ahead never started: back to the front of the queue, unharmed, in order
        # (or aborted, never started, if they were cancelled meanwhile).
        turn = slot.turn
        slot.turn = None
        marker = _marker.path_for(self._endpoint, slot.id)
        noted = None
        if marker is not None:
            noted = _marker.read_noted(marker)
            with contextlib.suppress(OSError):
                os.unlink(marker)
            # E1: first the ends the worker logged but whose frames died with it: those turns ran,
            # and end with their own outcome.
            turn = self._apply_end_log(slot, turn, noted)
        handed_turns = list(slot.ahead)
        if noted is not None:
            started_id = noted[0]
            index = next((i for i, t in enumerate(handed_turns) if t.id == started_id), -1)
            if turn is None and index >= 0:
                # The worker noted it started this turn, but its Started died with it: the turn
                # ran (and crashed), it must not be handed to another worker. (Turns before it
                # that ran in the same unreported burst ended per the End log, above; one still
                # here was revoked or dropped unstarted.)
                first = handed_turns.pop(index)
                slot.ahead.remove(first)
                self._handed -= 1
                first.revoking = False
                first.state = "running"
                first.started = True
                first.started_at = self._clock()
                self._running += 1
                turn = first
        for index in reversed(range(len(handed_turns))):
            handed = handed_turns[index]
            self._unhand(slot, handed)
            if handed.started:
                # A turn the worker went past (S1) whose Started came but whose End died with it.
                self._finish(handed, "crashed", exit_code=code, worker_pid=slot.pid)
            elif handed.cause is not None:
                self._finish(handed, "aborted")
            elif index == 0 and turn is None and was != "starting" and noted is None:
                # The worker was about to start this one, and may have: its Started can die with
                # it (an agent that kills its worker at once), and no start marker says otherwise
                # (one naming another turn proves this one never started). Re-queue it, but not forever.
                if handed.attempts >= MAX_HANDOVERS:
                    log.warning("turn %s: %d workers died before it was seen to start; crashed",
                                handed.id, handed.attempts)
                    self._finish(handed, "crashed", exit_code=code, worker_pid=slot.pid)
                else:
                    handed.attempts += 1
                    self._queue.push(handed, front=True)
            else:
                self._queue.push(handed, front=True)
        if was == "starting":
            # Keep the specific reason (no Ready in time, wrong protocol) over the bare exit code.
            self._start_failed(slot.failure or f"worker {slot.id} (pid {slot.pid}) exited with {code} before it was ready")
        elif was != "stopping" or turn is not None:
            self.worker_restarts += 1
        if turn is not None and turn.state == "running":
            if turn.escalation:
                self._finish(turn, "killed", exit_code=code, worker_pid=slot.pid)
            else:
                log.warning("worker %s (pid %s) died running turn %s: exit %s", slot.id, slot.pid, turn.id, code)
                self._finish(turn, "crashed", exit_code=code, worker_pid=slot.pid)
        self._notify_change()
        self._fill_pool()
        self._pump()

    def _apply_end_log(
        self, slot: WorkerSlot, turn: TurnRecord | None, noted: tuple[str, float] | None
    ) -> TurnRecord | None:
        """E1: apply the ends a dead worker logged (``worker/_endlog.py``) whose frames never came.

        Only turns the worker provably reached are considered: the turn it reported running and
        the handed turns up to the one its start marker names (it runs them in the order handed),
        so a record naming a turn handed behind that - which the worker never started - changes
        nothing (S3). A turn already ended is not there to match (the log keeps stale records). A
        record for the marked turn counts only if it carries the marker's start time (a record
        left by an earlier turn under the same id does not). A turn whose escalation began ends
        ``killed`` whatever the worker logged (R7). Returns the running turn, or None if it ended."""
        path = _endlog.path_for(self._endpoint, slot.id)
        if path is None:
            return turn
        records = _endlog.read(path, slot.pid) if slot.pid else []
        with contextlib.suppress(OSError):
            os.unlink(path)
        if not records:
            return turn
        ends = {end.turn_id: (at, end) for at, end in records}  # a turn's last record is its latest
        marked_id, marked_at = noted if noted is not None else (None, None)
        reached: list[TurnRecord] = [turn] if turn is not None else []
        ahead = list(slot.ahead)
        index = next((i for i, t in enumerate(ahead) if t.id == marked_id), -1)
        reached += ahead[: index + 1]
        now = self._clock()
        for t in reached:
            logged = ends.get(t.id)
            if logged is None:
                continue
            at, end = logged
            if (t.id == marked_id and at != marked_at) or t.escalation:
                continue
            if t is turn:
                turn = None
                if t.state != "running":
                    continue
            else:
                self._start_turn(slot, t, min(max(at, t.submitted_at), now))
                slot.turn = None
            try:
                output = wire.decode_payload(end.output)
            except msgspec.DecodeError:
                output = None
            log.info("turn %s: ended %s per worker %s's End log (its frame died with the worker)",
                     t.id, end.outcome, slot.id)
            self._finish(t, end.outcome, output=output, error=end.error, worker_pid=slot.pid)
            slot.turns_run += 1
        return turn

    # ---- the worker link ---------------------------------------------------------------

    async def _receive(self) -> None:
        """Frames from workers are handled in a reader callback on the socket's FD, not by a
        task awaiting ``recv``: no future and no task switch per wake-up (≈ 100 µs less per
        round trip than zmq.asyncio's ``recv_multipart`` here). This task only owns the
        registration."""
        assert self._send_sock is not None
        loop = asyncio.get_running_loop()
        fd = self._send_sock.getsockopt(zmq.FD)
        self._loop = loop
        loop.add_reader(fd, self._on_readable)
        self._on_readable()  # frames that arrived before the reader was registered
        try:
            await anyio.sleep_forever()
        finally:
            loop.remove_reader(fd)
            self._loop = None

    def _on_readable(self) -> None:
        # ZeroMQ's FD is edge-triggered: drain until EVENTS says nothing is left.
        self._recheck_scheduled = False
        sync = self._send_sock
        if sync is None or sync.closed:
            return
        events = zmq.EVENTS
        pollin = zmq.POLLIN
        while True:
            batch = []
            # Polling EVENTS (≈1 µs) instead of recv until zmq.Again: that exception costs ≈12 µs.
            while sync.getsockopt(events) & pollin:
                try:
                    batch.append(sync.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
            if not batch:
                break
            self._batching = self._defer_pump = True
            try:
                self._handle_batch(batch)
            except Exception:  # noqa: BLE001 - a bug in one message's handling must not stop the link
                log.exception("error while handling frames from workers")
            finally:
                self._defer_pump = False
                try:
                    if self._pump_wanted:
                        self._pump_wanted = False
                        self._pump()  # its sends still go out as one frame per worker
                finally:
                    self._batching = False
                    if self._dirty:
                        self._flush()
            if not sync.getsockopt(events) & pollin:
                break

    def _handle_batch(self, batch: list[list[bytes]]) -> None:
        for parts in batch:
            if len(parts) != 2:
                self.bad_frames += 1
                continue
            slot = self._by_ident.get(parts[0])
            if slot is None:
                self.bad_frames += 1
                continue
            try:
                messages = wire.decode_from_worker(parts[1])
            except msgspec.DecodeError as exc:
                self.bad_frames += 1
                log.warning("undecodable frame from worker %s: %s", slot.id, exc)
                continue
            for msg in messages:
                self._on_message(slot, msg)

    def _drain(self) -> None:
        """Handle every frame ZeroMQ already holds (a dead worker's last words come first)."""
        self._on_readable()

    def _on_message(self, slot: WorkerSlot, msg: Any) -> None:
        turn = slot.turn
        match msg:
            case wire.Event(turn_id=turn_id, data=data):
                if turn is None or turn.id != turn_id:
                    self.bad_frames += 1  # not the turn this worker runs: out of order, ignored
                else:
                    events = turn.events
                    events.append(data)
                    if len(events) > self.max_events:
                        drop = len(events) - self.max_events // 2
                        del events[:drop]
                        turn.events_base += drop
                    turn.wake_followers()
                    for hook in self._event_hooks:
                        hook(turn, data)
            case wire.Started(turn_id=turn_id):
                ahead = slot.ahead
                if slot.turn is not None:
                    if slot.turn.id != turn_id:
                        if turn_id in slot.passed:
                            # S1: a turn the worker went past before the one its marker named.
                            passed = next((t for t in ahead if t.id == turn_id), None)
                            if passed is not None and not passed.started:
                                passed.started = True
                                passed.started_at = self._clock()
                            return
                        self.bad_frames += 1  # one turn at a time: another turn's Started is out of order
                    return  # (a repeat of the running turn's Started is harmless)
                if not ahead:
                    self.bad_frames += 1
                    return
                turn = ahead[0]
                if turn.id != turn_id:
                    turn = next((t for t in ahead if t.id == turn_id), None)  # type: ignore[assignment]
                    if turn is None:
                        self.bad_frames += 1
                        return
                self._start_turn(slot, turn, self._clock())
            case wire.End(turn_id=turn_id):
                if msg.ack:
                    # The worker holds back its next handed turn until this End is known here.
                    self._send(slot, wire.EndAck(turn_id))
                if turn is None or turn.id != turn_id:
                    handed = next((t for t in slot.ahead if t.id == turn_id), None)
                    if handed is not None and handed.id in slot.passed and handed.started:
                        # S1: the end of a turn the worker went past; its own outcome stands.
                        self._unhand(slot, handed)
                        try:
                            output = wire.decode_payload(msg.output)
                        except msgspec.DecodeError:
                            output = None
                        self._finish(handed, msg.outcome, output=output, error=msg.error, worker_pid=slot.pid)
                        slot.turns_run += 1
                        self._after_turn(slot)
                        return
                    if handed is None or handed.cause is None:
                        # S3: an End for a turn this worker does not run is taken only as the answer
                        # to an Abort the supervisor sent for a handed turn. Anything else (an agent
                        # forging another turn's end over its worker's connection) changes nothing.
                        self.bad_frames += 1
                        return
                    # A handed turn the worker dropped unstarted on Abort.
                    self._unhand(slot, handed)
                    self._finish(handed, "aborted")
                    self._after_turn(slot)
                    return
                if turn.escalation:
                    return  # once SIGTERM went out the outcome is "killed", whatever the worker says
                # (A slot doomed only because a send to it failed still reports truthfully: a turn
                # that ended before the worker died keeps its real outcome.)
                slot.turn = None
                slot.turns_run += 1
                if turn.started_at is not None:
                    self._note_turn_time(self._clock() - turn.started_at)
                try:
                    output = wire.decode_payload(msg.output)
                except msgspec.DecodeError:
                    output = None
                self._finish(turn, msg.outcome, output=output, error=msg.error, worker_pid=slot.pid)
                self._after_turn(slot)
            case wire.Ready():
                if not slot.pid:
                    self._zygote_pids()
                    if not slot.pid and slot.state == "starting" and msg.token == slot.token:
                        # An embryo woken by the zygote can say Ready before the zygote's report
                        # of its pid reaches us: hold the Ready until that report is read.
                        slot.deferred_ready = msg
                        return
                if slot.state != "starting" or msg.token != slot.token or msg.pid != slot.pid:
                    self.bad_frames += 1
                    return
                if msg.version != wire.PROTOCOL_VERSION:
                    self.bad_frames += 1
                    slot.failure = (f"worker {slot.id} (pid {slot.pid}) speaks protocol {msg.version}, "
                                    f"expected {wire.PROTOCOL_VERSION}")
                    self._last_start_error = slot.failure
                    _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)
                    return
                if slot.timer is not None:
                    slot.timer.cancel()
                slot.state = "idle"
                slot.ready_at = self._clock()
                self._start_failures = 0
                self._idle.append(slot)
                if self._ready_event is not None and self._ready_count() >= self.workers:
                    self._ready_event.set()
                self._pump()
            case wire.Spawn():
                self._on_spawn(slot, msg)
            case wire.SpawnCancel(req=req):
                child_id = slot.spawns.get(req)
                child = self._turns.get(child_id) if child_id else None
                if child is not None:
                    self._cancel(child, PARENT)
            case wire.Revoked(turn_id=turn_id):
                handed = next((t for t in slot.ahead if t.id == turn_id), None)
                if handed is None:
                    self.bad_frames += 1
                    return
                self._unhand(slot, handed)
                if handed.cause is not None:
                    self._finish(handed, "aborted")
                else:
                    self._queue.push(handed, front=True)
                self._after_turn(slot)
            case wire.Heartbeat():
                pass
            case wire.BadFrame(reason=reason):
                log.warning("worker %s could not decode a frame: %s", slot.id, reason)

    def _after_turn(self, slot: WorkerSlot) -> None:
        if slot.state != "busy":
            return
        if slot.doomed:
            return  # being killed (or unreachable): it gets no new turn; its exit settles the rest
        if slot.turn is not None or slot.ahead:
            self._pump()  # still busy: top it up
            return
        self._busy.pop(slot, None)
        target = self.workers + self.spares + self._lent
        # len(self._slots) bounds the live count: skip the scan in the common case.
        live = 0 if len(self._slots) <= target else sum(1 for s in self._slots.values() if s.live and not s.doomed)
        if (self.max_turns_per_worker is not None and slot.turns_run >= self.max_turns_per_worker) or live > target:
            slot.state = "idle"
            self._retire(slot)
            self._fill_pool()
            return
        slot.state = "idle"
        self._idle.append(slot)
        self._pump()

    def _on_spawn(self, slot: WorkerSlot, msg: wire.Spawn) -> None:
        parent = slot.turn
        if parent is None or parent.id != msg.parent or parent.state != "running":
            self._send(slot, wire.SpawnReply(msg.req, error=TurnError("SpawnError", "the parent turn is not running")))
            return
        if parent.cause is not None:
            self._send(slot, wire.SpawnReply(msg.req, error=TurnError("SpawnError", "the parent turn was cancelled")))
            return
        try:
            child = self._accept(msg.agent, msg.input, session=msg.session, timeout=msg.timeout, grace=msg.grace,
                                 kill_after=msg.kill_after, turn_id=None, parent=parent.id)
        except (TypeError, ValueError, QueueFull, SupervisorClosed) as exc:
            self._send(slot, wire.SpawnReply(msg.req, error=TurnError(type(exc).__name__, str(exc))))
            return
        parent.children.add(child.id)
        child.spawn_origin = (slot, msg.req)
        slot.spawns[msg.req] = child.id
        # The parent waits on its child: it lends its slot, so the pool can never deadlock.
        self._lent += 1
        for handed in slot.ahead:  # they would wait behind the parent: give them back
            if not handed.revoking and handed.cause is None:
                handed.revoking = True
                self._send(slot, wire.Revoke(handed.id))
        self._fill_pool()
        self._pump()

    def _restore_result(self, result: TurnResult) -> None:
        """Register a turn that ended before this supervisor started (a daemon's journal), so
        ``handle(id).result()`` and ``cancel(id)`` answer for it as for any ended turn."""
        if result.turn_id in self._turns:
            return
        turn = TurnRecord(result.turn_id, result.agent, wire.NIL, result.session, result.parent, None, 0.0, 0.0,
                          self._clock())
        turn.state = "ended"
        turn.result = result
        turn.cause = result.cause
        turn.started = result.started
        turn.attempts = result.attempts
        self._turns[turn.id] = turn
        self._ended.append(turn.id)
        if len(self._ended) > self.keep_results:
            old = self._turns.get(self._ended.popleft())
            if old is not None and old.state == "ended":
                del self._turns[old.id]

    async def _memory_loop(self) -> None:
        assert self.max_rss_mb is not None
        limit = self.max_rss_mb * 2**20
        while True:
            await anyio.sleep(self.rss_interval)
            for slot in list(self._slots.values()):
                turn = slot.turn
                if turn is None and slot.state == "busy":
                    turn = self._note_marked_start(slot)  # S1: running, though its Started is stuck
                if slot.state == "busy" and turn is not None and turn.state == "running" and turn.cause is None:
                    # PSS, not summed RSS: N forked children of a worker share its pages. Read in a
                    # thread: smaps_rollup walks page tables (≈ 0.1 ms per process, more when large).
                    used = await anyio.to_thread.run_sync(_procs.memory_of_tree, slot.pid)
                    if slot.turn is not turn or turn.cause is not None or turn.state != "running":
                        continue  # it moved on while we measured
                    if used > limit:
                        log.warning("turn %s: worker tree of pid %s passed %s MiB", turn.id, slot.pid, self.max_rss_mb)
                        self._cancel(turn, wire.MEMORY)
