"""The engine's lifecycle: starting it (the worker link bound, the timers and the link's reader
running, the pool up, and ``workers`` workers ready) and disposing it (every live turn cancelled
with cause ``disposed`` and ended, every worker retired and reaped with its tree, everything
released); and, at a daemon's graceful stop, setting aside the turns still queued for its journal
to run at the next start (DAEMON-KEEP-QUEUED).

``Supervisor.start``, ``aclose`` and ``keep_queued`` call ``Lifecycle``; it moves the engine's phase
(``TurnBook.phase``: ``new`` → ``running`` → ``closing`` → ``closed``), which admission reads.

Its collaborators: the ``TurnBook``, the ``EngineOptions``, the pool, the worker link, the timers, the
``Dispatcher`` (pool size), the ``Escalation`` (disposal's cancels), the ``Finisher`` (idle waiters)
and ``Changes`` (a slot left the pool; the engine closed).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio

from wire import DISPOSED

from .._errors import WorkerStartError
from .._host import Background, require_asyncio
from .memory import MemoryWatchdog
from .states import move
from .turns import set_done

if TYPE_CHECKING:
    from .book import TurnBook
    from .dispatch import Dispatcher
    from .ending import Finisher
    from .escalation import Escalation
    from .link import WorkerLink
    from .pool import WorkerPool
    from .settings import EngineOptions
    from .timers import Timers


class Changes:
    """Wakes whoever waits for a change of the pool's slots or of the engine's phase."""

    def __init__(self) -> None:
        self.event = anyio.Event()

    def notify(self) -> None:
        self.event.set()
        self.event = anyio.Event()

    async def wait(self) -> None:
        await self.event.wait()


class Lifecycle:
    """Starts and disposes the engine; see the module docstring."""

    def __init__(
        self,
        book: TurnBook,
        options: EngineOptions,
        pool: WorkerPool,
        link: WorkerLink,
        timers: Timers,
        dispatcher: Dispatcher,
        escalation: Escalation,
        finisher: Finisher,
        changes: Changes,
    ) -> None:
        self.book = book
        self.options = options
        self.pool = pool
        self.link = link
        self.timers = timers
        self.dispatcher = dispatcher
        self.escalation = escalation
        self.finisher = finisher
        self.changes = changes
        # API-ASYNCIO: the background tasks (timers, the worker link, the pool's watchers) live in a task
        # of their own, so the supervisor may be closed from another task than the one that
        # started it.
        self.bg = Background("turnpool supervisor")

    async def start(self) -> None:
        """``Supervisor.start``: bind the worker link, start the pool, wait for ``workers`` ready
        workers; on any failure, dispose what was started and raise (``WorkerStartError``)."""
        book = self.book
        options = self.options
        if book.phase != "new":
            raise RuntimeError("a Supervisor can be started once")
        # API-ASYNCIO: trio refused before anything starts
        loop = require_asyncio("Supervisor", "SyncSupervisor")
        pool = self.pool
        pool.prepare(
            worker_output=options.worker_output,
            max_bytes=max(int(options.worker_output_max_mb * 2**20), 4096),
            agent_path=options.agent_path,
        )
        book.phase = "running"
        self.link.bind(f"ipc://{pool.runtime_dir}/workers.sock")
        # The loop's clock (what anyio.current_time() returns on asyncio) without anyio's
        # per-call backend lookup: it is read several times per turn.
        timers = self.timers
        timers.clock = loop.time
        book.wall_offset = time.time() - timers.clock()
        await self.bg.start(loop)
        tg = self.bg.task_group
        tg.start_soon(timers.run)
        tg.start_soon(self.link.run)
        try:
            await pool.start(tg=tg, use_cgroups=options.cgroups)
        except BaseException:
            await self.aclose()
            raise
        if options.max_rss_mb is not None:
            watchdog = MemoryWatchdog(pool.slots, options, self.dispatcher, self.escalation)
            tg.start_soon(watchdog.run)
        try:
            self.dispatcher.refill()
            assert pool.ready_event is not None
            with anyio.fail_after(options.start_timeout):
                await pool.ready_event.wait()
            if pool.ready_count() == 0:
                raise WorkerStartError(f"workers could not be started: {pool.last_start_error}")
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, TimeoutError):
                raise WorkerStartError(
                    f"workers were not ready within {options.start_timeout}s"
                    + (f": {pool.last_start_error}" if pool.last_start_error else "")
                ) from None
            raise

    async def aclose(self) -> None:
        """``Supervisor.aclose``: dispose; returns once every worker and descendant is reaped."""
        book = self.book
        if book.phase in ("closing", "closed"):
            while book.phase != "closed":
                await self.changes.wait()
            return
        if book.phase == "new":
            book.phase = "closed"
            return
        book.phase = "closing"
        pool = self.pool
        pool.closing = True
        with anyio.CancelScope(shield=True):
            book.disposing = True
            for turn in list(book.table.records.values()):
                if turn.state in ("queued", "handed", "running"):
                    self.escalation.cancel(turn, DISPOSED)
            # WORKER-SHARE-AT-CLOSE: the workers' exits get the weight of programs again, where we may.
            pool.share.release([s.pid for s in pool.slots.values() if s.pid], pool.nice)
            await self.finisher.wait_idle()
            for slot in list(pool.slots.values()):
                if slot.state in ("starting", "idle", "busy"):
                    pool.retire(slot)
            while pool.slots:
                await self.changes.wait()
            await pool.close()
        try:
            await self.bg.aclose()
        finally:
            self.link.close()
            await pool.release()
            book.phase = "closed"
            self.changes.notify()

    def keep_queued(self) -> list[str]:
        """``Supervisor.keep_queued`` (DAEMON-KEEP-QUEUED): the ids set aside, in queue order."""
        book = self.book
        kept: list[str] = []
        for turn in list(book.table.records.values()):
            if turn.state != "queued" or turn.parent is not None or turn.dispatchable or turn.clearing:
                continue
            book.queue.discard(turn)
            move(turn, "kept")
            kept.append(turn.id)
            book.active -= 1
            set_done(turn)
            turn.wake_followers()
        self.finisher.wake_if_idle()
        self.changes.notify()
        return kept
