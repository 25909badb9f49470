"""Running the daemon: its lifecycle (``Lifecycle``: start-up — the supervisor, the startup hooks, the
client endpoint, the front ends, the ready line —, the signals, the shutdown: DAEMON-DRAIN, drain, then
disposal wins; DAEMON-KEEP-QUEUED, queued turns stay in the journal) and the process settings and exit
code of ``turnpool serve`` (``run_process``, which ``server.run_daemon`` calls).

``Daemon.serve`` (``server.py``) builds one ``Lifecycle`` per serve and awaits ``serve_until_stopped``.
Like the daemon's other parts, it is given what it reads and writes — the client endpoint, the client
watch, the heap keeper, the settings, and callbacks into the daemon (build the parts that need the
supervisor, link the bound socket and the task group, read the client link, accept or not, note the
disposal, wait for the requests) — never the daemon. It owns the stop events, the monitor socket and
the supervisor it starts.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread
import zmq
import zmq.asyncio

from worker import lowlevel

from .._engine.supervisor import Supervisor
from .._errors import DaemonAlreadyRunning

if TYPE_CHECKING:
    from .client_watch import ClientWatch
    from .conn_guard import ClientConnections
    from .endpoint import ClientEndpoint
    from .metrics import Metrics

log = logging.getLogger("turnpool.daemon")

READY_PREFIX = "turnpool serve: ready on "
# The daemon's garbage-collection thresholds (DAEMON-GC): a young collection every 20 000 net allocations
# instead of 700, a full one after 50 of those.
GC_THRESHOLDS = (20_000, 10, 50)
# JOURNAL-GIL: how long the event loop's thread may hold the GIL while another thread (the journal's writer,
# back from a commit) waits for it; the interpreter's default is 5 ms.
SWITCH_INTERVAL = 0.0005
# MEM-TRIM: how often the daemon looks whether memory it freed is worth handing back to the system.
TRIM_EVERY = 1.0


class Lifecycle:
    """One serve of the daemon, from its start-up to its shutdown.

    ``use`` builds the parts that need the supervisor and hooks it (returns the metrics and the
    client endpoint's connections); ``joined`` gets the task group request tasks run in; ``linked``
    the bound client socket (``None`` once closed); ``receive`` reads the client link;
    ``set_accepting``, ``disposing`` and ``metrics_bound`` note what status reports;
    ``requests_answered`` returns once no request task is running.
    """

    def __init__(
        self,
        endpoint: ClientEndpoint,
        watch: ClientWatch,
        heap: lowlevel.HeapKeeper,
        *,
        sup_kwargs: dict[str, Any],
        drain: float,
        metrics_host: str,
        metrics_port: int | None,
        startup_hooks: list[Callable[[Supervisor], Any]],
        front_ends: list[Callable[..., Coroutine[Any, Any, Any]]],
        keep_queued: bool,
        use: Callable[[Supervisor], tuple[Metrics, ClientConnections]],
        joined: Callable[[anyio.abc.TaskGroup], None],
        linked: Callable[[zmq.asyncio.Socket | None], None],
        receive: Callable[[], Coroutine[Any, Any, None]],
        set_accepting: Callable[[bool], None],
        disposing: Callable[[float], None],
        metrics_bound: Callable[[int], None],
        requests_answered: Callable[[], Awaitable[None]],
    ) -> None:
        self._endpoint, self._watch, self._heap = endpoint, watch, heap
        self._sup_kwargs, self.drain, self._keep_queued = sup_kwargs, drain, keep_queued
        self._metrics_host, self._metrics_port = metrics_host, metrics_port
        self._startup_hooks, self._front_ends = startup_hooks, front_ends
        self._use, self._joined, self._linked, self._receive = use, joined, linked, receive
        self._set_accepting, self._disposing, self._metrics_bound = set_accepting, disposing, metrics_bound
        self._requests_answered = requests_answered
        self.stop_asked = anyio.Event()
        self.skip_drain = anyio.Event()
        self.sup: Supervisor | None = None
        self._mon: zmq.asyncio.Socket | None = None

    def stop(self, *, skip_drain: bool = False) -> None:
        """Begin the shutdown; a second call (or ``skip_drain``) skips the drain (``Daemon.stop``)."""
        if self.stop_asked.is_set() or skip_drain:
            self.skip_drain.set()
        self.stop_asked.set()

    async def watch_signals(self, signals: Any) -> None:
        """The first SIGTERM/SIGINT/SIGHUP begins the drain (``stop``); a second one skips it
        and kills every turn being cancelled at once (``Supervisor.kill_now``)."""
        async for signum in signals:
            name = signal.Signals(signum).name
            if self.stop_asked.is_set():
                # SPEC disposal rule: a second signal moves every turn to its kill step at once,
                # whatever grace its client chose (bounded anyway by --max-grace).
                log.info("received %s again: skipping the drain, killing every cancelled turn now", name)
                if self.sup is not None:
                    self.sup.kill_now()
            else:
                log.info("received %s: draining for up to %ss", name, self.drain)
            self.stop()

    # MEM-TRIM: a burst leaves the daemon resident at its peak, though it freed nearly all of it.
    async def give_back_memory(self) -> None:
        """Every ``TRIM_EVERY`` seconds, hand ``malloc``'s free pages back to the system when the
        daemon grew by ``lowlevel.TRIM_SLACK`` since it last did and that much is free
        (``lowlevel.HeapKeeper``). The trim runs in a thread (up to ≈ 16 ms for 100 MiB): the event
        loop goes on."""
        keeper = self._heap
        while True:
            await anyio.sleep(TRIM_EVERY)
            if keeper.due():
                await anyio.to_thread.run_sync(lowlevel.heap_trim)
                keeper.trimmed()

    async def serve_until_stopped(self, signals: Any, ready: Callable[[str], None] | None) -> None:
        """``Daemon.serve`` once the endpoint is claimed: start the supervisor and the startup hooks
        (recovery) before binding, so no client is answered by a pool that is not up; announce the
        ready line; wait for ``stop``; shut down; and close the sockets whatever happened."""
        self.sup = sup = Supervisor(**self._sup_kwargs)
        # the parts that need the supervisor are built (requests, metrics), DAEMON-FD: the descriptor shares
        metrics, conns = self._use(sup)
        # Bound before the workers start: a taken port is one line at once, nothing to unwind.
        host = self._metrics_host
        listener = await metrics.listen(host, self._metrics_port) if self._metrics_port is not None else None
        endpoint, watch = self._endpoint, self._watch
        sock: zmq.asyncio.Socket | None = None
        try:
            async with anyio.create_task_group() as tg:
                self._joined(tg)
                tg.start_soon(self.watch_signals, signals)
                # The supervisor's own task group nests inside this one: it is started and
                # closed from this task at this level (anyio's scopes must nest).
                await sup.start()
                try:
                    for startup_hook in self._startup_hooks:
                        started = startup_hook(sup)
                        if inspect.isawaitable(started):
                            await started
                    sock = endpoint.bind()
                    conns.bound(sock)
                    conns.pause, conns.resume = endpoint.pause, endpoint.resume
                    self._linked(sock)
                    self._mon = watch.open_monitor(sock)
                    tg.start_soon(self._receive)
                    tg.start_soon(watch.watch_disconnects, self._mon, conns)
                    tg.start_soon(watch.sweep)
                    tg.start_soon(self.give_back_memory)
                    bound: int | None = None
                    if listener is not None:
                        bound = await tg.start(metrics.serve, host, listener)
                        assert bound is not None
                        self._metrics_bound(bound)
                        listener = None  # served: closed by ``serve``
                    self._set_accepting(True)
                    line = f"{READY_PREFIX}{endpoint.address} (pid {os.getpid()})"
                    line += f" workers' output: {sup.describe_output()}"  # WORKER-OUTPUT: say where it goes
                    for front_end in self._front_ends:
                        announced = await tg.start(front_end)
                        if announced:
                            line += f" {announced}"
                    if bound is not None:
                        line += f" metrics http://{host}:{bound}/metrics"
                    log.info("%s", line)
                    if ready is not None:
                        ready(line)
                    await self.stop_asked.wait()
                    await self.shutdown()
                finally:
                    with anyio.CancelScope(shield=True):
                        await sup.aclose()
                    tg.cancel_scope.cancel()
        finally:
            if self._mon is not None:
                with contextlib.suppress(zmq.ZMQError):
                    if sock is not None:
                        sock.disable_monitor()
                self._mon.close(linger=0)
                self._mon = None
            self._linked(None)
            endpoint.close()
            if listener is not None:  # the start failed before the metrics were served
                with anyio.CancelScope(shield=True):
                    await listener.aclose()

    # DAEMON-DRAIN: shutdown drains, then disposal wins.
    async def shutdown(self) -> None:
        """Stop accepting, let accepted turns run for ``drain`` seconds (unless the drain is skipped),
        set queued turns aside for a journal, dispose the supervisor, and let the requests woken by
        disposal answer before the socket goes."""
        sup, skip = self.sup, self.skip_drain
        assert sup is not None
        self._set_accepting(False)
        with anyio.move_on_after(self.drain):
            async with anyio.create_task_group() as drain:

                async def skipped() -> None:
                    await skip.wait()
                    drain.cancel_scope.cancel()

                drain.start_soon(skipped)
                await sup.when_idle()
                drain.cancel_scope.cancel()
        if self._keep_queued:
            # DAEMON-KEEP-QUEUED: what never reached a worker stays queued in the journal for the next start.
            kept = sup.keep_queued()
            if kept:
                log.info("%d queued turns stay in the journal for the next start", len(kept))
        self._disposing(anyio.current_time())
        log.info("disposing: %d turns still queued or running", sup.active)
        await sup.aclose()
        # Let the requests woken by disposal (results, follows, when_idle) answer before the socket goes.
        with anyio.move_on_after(5):
            await self._requests_answered()


def run_process(
    serve: Callable[[Callable[[str], None]], Awaitable[None]], exit_code: Callable[[], int]
) -> int:
    """Run a daemon's ``serve`` to completion (blocking) with the daemon's process settings; the exit
    code of ``turnpool serve`` (``server.run_daemon``)."""
    from .._errors import WorkerStartError

    def ready(line: str) -> None:
        print(line, flush=True)

    # DAEMON-GC: the daemon keeps thousands of live records (turns in flight, results kept for clients,
    # acks waiting for the journal); with the interpreter's default thresholds every few thousand
    # turns set off a full collection walking all of them, which cost more CPU than the requests.
    # Objects from start-up are frozen out of collection, and collections run less often.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    # JOURNAL-GIL: the journal's writer thread gets the GIL back within half a millisecond of its commit's
    # reply, not after the interpreter's default 5 ms: every ack waits for that hand-back.
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        anyio.run(lambda: serve(ready), backend="asyncio")
    except BaseException as exc:
        known = (DaemonAlreadyRunning, WorkerStartError, ValueError, OSError, zmq.ZMQError)
        inner: BaseException = _first_of(exc, known) or exc  # task groups wrap it, maybe with others
        if isinstance(inner, known):
            print(f"turnpool serve: {inner}", file=sys.stderr, flush=True)
            return 1
        raise
    return exit_code()


def _first_of(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of ``kinds`` in ``exc`` or, depth first, in the groups it is wrapped in."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_of(inner, kinds)
            if found is not None:
                return found
    return None
