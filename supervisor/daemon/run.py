"""Running a daemon: start-up (the supervisor, the startup hooks, the client endpoint, the front
ends, the ready line), the signals, the shutdown (DAEMON-DRAIN: drain, then disposal wins; DAEMON-KEEP-QUEUED:
queued turns stay in the journal), and ``run_daemon``, the blocking entry of ``turnpool serve``.

``Daemon.serve`` (``server.py``) calls ``serve_until_stopped``; these functions drive the daemon
through its state (its supervisor, sockets and task group), as its own methods did.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import zmq

from worker import lowlevel

from .._engine import Supervisor
from .._errors import DaemonAlreadyRunning
from .._fds import FdBudget, raise_nofile_limit
from .conn_guard import ClientConnections

if TYPE_CHECKING:
    from .server import Daemon

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


async def watch_signals(daemon: Daemon, signals: Any) -> None:
    """The first SIGTERM/SIGINT/SIGHUP begins the drain (``Daemon.stop``); a second one skips it
    and kills every turn being cancelled at once (``Supervisor.kill_now``)."""
    async for signum in signals:
        name = signal.Signals(signum).name
        if daemon._stop_asked is not None and daemon._stop_asked.is_set():
            # SPEC disposal rule: a second signal moves every turn to its kill step at once,
            # whatever grace its client chose (bounded anyway by --max-grace).
            log.info("received %s again: skipping the drain, killing every cancelled turn now", name)
            if daemon.sup is not None:
                daemon.sup.kill_now()
        else:
            log.info("received %s: draining for up to %ss", name, daemon.drain)
        daemon.stop()


# MEM-TRIM: a burst leaves the daemon resident at its peak, though it freed nearly all of it.
async def give_back_memory(daemon: Daemon) -> None:
    """Every ``TRIM_EVERY`` seconds, hand ``malloc``'s free pages back to the system when the
    daemon grew by ``lowlevel.TRIM_SLACK`` since it last did and that much is free
    (``lowlevel.HeapKeeper``). The trim runs in a thread (up to ≈ 16 ms for 100 MiB): the event
    loop goes on."""
    keeper = daemon.heap
    while True:
        await anyio.sleep(TRIM_EVERY)
        if keeper.due():
            await anyio.to_thread.run_sync(lowlevel.heap_trim)
            keeper.trimmed()


async def serve_until_stopped(daemon: Daemon, signals: Any, ready: Callable[[str], None] | None) -> None:
    """``Daemon.serve`` once the endpoint is claimed: start the supervisor and the startup hooks
    (recovery) before binding, so no client is answered by a pool that is not up; announce the
    ready line; wait for ``stop``; shut down; and close the sockets whatever happened."""
    sup = Supervisor(**daemon.sup_kwargs)
    daemon.use(sup)  # the parts that need the supervisor are built (requests, metrics)
    # DAEMON-FD: the soft descriptor limit up to the hard one, and each front end's share of it.
    limit, _ = raise_nofile_limit()
    daemon.fd_budget = FdBudget(limit=limit, workers=sup.workers + sup.spares)
    daemon.conns = ClientConnections(daemon.fd_budget)
    sup.add_hooks(on_start=daemon._on_start, on_result=daemon._on_end)
    for hook in daemon.event_hooks:
        sup.add_hooks(on_event=hook)
    assert daemon.metrics is not None
    # Bound before the workers start: a taken port is one line at once, nothing to unwind.
    listener = (
        await daemon.metrics.listen(daemon.metrics_host, daemon.metrics_port)
        if daemon.metrics_port is not None
        else None
    )
    try:
        async with anyio.create_task_group() as tg:
            daemon._tg = tg
            tg.start_soon(watch_signals, daemon, signals)
            # The supervisor's own task group nests inside this one: it is started and
            # closed from this task at this level (anyio's scopes must nest).
            await sup.start()
            try:
                for startup_hook in daemon.startup_hooks:
                    started = startup_hook(sup)
                    if inspect.isawaitable(started):
                        await started
                daemon._sock = daemon._endpoint.bind()
                daemon.conns.bound(daemon._sock)
                daemon.conns.pause, daemon.conns.resume = daemon._endpoint.pause, daemon._endpoint.resume
                daemon._sync = zmq.Socket.shadow(daemon._sock.underlying)
                daemon._mon = daemon._watch.open_monitor(daemon._sock)
                tg.start_soon(daemon._receive)
                tg.start_soon(daemon._watch.watch_disconnects, daemon._mon, daemon.conns)
                tg.start_soon(daemon._watch.sweep)
                tg.start_soon(give_back_memory, daemon)
                if listener is not None:
                    daemon.metrics_bound = await tg.start(daemon.metrics.serve, daemon.metrics_host, listener)
                    listener = None  # served: closed by ``serve``
                daemon.accepting = True
                line = f"{READY_PREFIX}{daemon.endpoint} (pid {os.getpid()})"
                line += f" workers' output: {sup.describe_output()}"  # WORKER-OUTPUT: say where it goes
                for front_end in daemon.front_ends:
                    announced = await tg.start(front_end)
                    if announced:
                        line += f" {announced}"
                if daemon.metrics_bound is not None:
                    line += f" metrics http://{daemon.metrics_host}:{daemon.metrics_bound}/metrics"
                log.info("%s", line)
                if ready is not None:
                    ready(line)
                assert daemon._stop_asked is not None
                await daemon._stop_asked.wait()
                await shutdown(daemon)
            finally:
                with anyio.CancelScope(shield=True):
                    await sup.aclose()
                tg.cancel_scope.cancel()
    finally:
        if daemon._mon is not None:
            with contextlib.suppress(zmq.ZMQError):
                if daemon._sock is not None:
                    daemon._sock.disable_monitor()
            daemon._mon.close(linger=0)
            daemon._mon = None
        daemon._sock = daemon._sync = None
        daemon._endpoint.close()
        if listener is not None:  # the start failed before the metrics were served
            with anyio.CancelScope(shield=True):
                await listener.aclose()


# DAEMON-DRAIN: shutdown drains, then disposal wins.
async def shutdown(daemon: Daemon) -> None:
    """Stop accepting, let accepted turns run for ``drain`` seconds (unless the drain is skipped),
    set queued turns aside for a journal, dispose the supervisor, and let the requests woken by
    disposal answer before the socket goes."""
    assert daemon.sup is not None and daemon._skip_drain is not None
    daemon.accepting = False
    sup, skip = daemon.sup, daemon._skip_drain
    with anyio.move_on_after(daemon.drain):
        async with anyio.create_task_group() as drain:

            async def skipped() -> None:
                await skip.wait()
                drain.cancel_scope.cancel()

            drain.start_soon(skipped)
            await sup.when_idle()
            drain.cancel_scope.cancel()
    if daemon.journal_path is not None:
        # DAEMON-KEEP-QUEUED: what never reached a worker stays queued in the journal for the next start.
        kept = sup.keep_queued()
        if kept:
            log.info("%d queued turns stay in the journal for the next start", len(kept))
    daemon.disposing_at = anyio.current_time()
    log.info("disposing: %d turns still queued or running", sup.active)
    await sup.aclose()
    # Let the requests woken by disposal (results, follows, when_idle) answer before the socket goes.
    with anyio.move_on_after(5):
        while daemon._inflight:
            await daemon._inflight_zero.wait()


def run_daemon(daemon: Daemon) -> int:
    """Run ``daemon`` to completion (blocking); the exit code of ``turnpool serve``."""
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
        anyio.run(lambda: daemon.serve(ready=ready), backend="asyncio")
    except BaseException as exc:
        known = (DaemonAlreadyRunning, WorkerStartError, ValueError, OSError, zmq.ZMQError)
        inner: BaseException = _first_of(exc, known) or exc  # task groups wrap it, maybe with others
        if isinstance(inner, known):
            print(f"turnpool serve: {inner}", file=sys.stderr, flush=True)
            return 1
        raise
    return daemon.exit_code


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
