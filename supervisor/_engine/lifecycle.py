"""The engine's lifecycle: starting it (the worker link bound, the timers and the link's reader
running, the pool up, and ``workers`` workers ready) and disposing it (every live turn cancelled
with cause ``disposed`` and ended, every worker retired and reaped with its tree, everything
released); and, at a daemon's graceful stop, setting aside the turns still queued for its journal
to run at the next start (DAEMON-KEEP-QUEUED).

``Supervisor.start``, ``aclose`` and ``keep_queued`` call ``Lifecycle``; the supervisor keeps its
state (``new`` → ``running`` → ``closing`` → ``closed``), which every part reads.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio

from wire import DISPOSED

from .._errors import WorkerStartError
from .._host import Background, require_asyncio
from .memory import MemoryWatchdog
from .turns import set_done

if TYPE_CHECKING:
    from .supervisor import Supervisor


class Lifecycle:
    """Starts and disposes a ``Supervisor``; see the module docstring."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        # API-ASYNCIO: the background tasks (timers, the worker link, the pool's watchers) live in a task
        # of their own, so the supervisor may be closed from another task than the one that
        # started it.
        self.bg = Background("turnpool supervisor")

    async def start(self) -> None:
        """``Supervisor.start``: bind the worker link, start the pool, wait for ``workers`` ready
        workers; on any failure, dispose what was started and raise (``WorkerStartError``)."""
        sup = self.sup
        if sup._state != "new":
            raise RuntimeError("a Supervisor can be started once")
        # API-ASYNCIO: trio refused before anything starts
        loop = require_asyncio("Supervisor", "SyncSupervisor")
        pool = sup.pool
        pool.prepare(
            worker_output=sup.worker_output,
            max_bytes=max(int(sup.worker_output_max_mb * 2**20), 4096),
            agent_path=sup.agent_path,
        )
        sup._state = "running"
        sup.link.bind(f"ipc://{pool.runtime_dir}/workers.sock")
        # The loop's clock (what anyio.current_time() returns on asyncio) without anyio's
        # per-call backend lookup: it is read several times per turn.
        sup._clock = loop.time
        sup._timers.clock = sup._clock
        sup._wall_offset = time.time() - sup._clock()
        await self.bg.start(loop)
        tg = self.bg.task_group
        tg.start_soon(sup._timers.run)
        tg.start_soon(sup.link.run)
        try:
            await pool.start(tg=tg, use_cgroups=sup.cgroups)
        except BaseException:
            await sup.aclose()
            raise
        if sup.max_rss_mb is not None:
            tg.start_soon(MemoryWatchdog(sup).run)
        try:
            sup._fill_pool()
            assert pool.ready_event is not None
            with anyio.fail_after(sup.start_timeout):
                await pool.ready_event.wait()
            if pool.ready_count() == 0:
                raise WorkerStartError(f"workers could not be started: {pool.last_start_error}")
        except BaseException as exc:
            await sup.aclose()
            if isinstance(exc, TimeoutError):
                raise WorkerStartError(
                    f"workers were not ready within {sup.start_timeout}s"
                    + (f": {pool.last_start_error}" if pool.last_start_error else "")
                ) from None
            raise

    async def aclose(self) -> None:
        """``Supervisor.aclose``: dispose; returns once every worker and descendant is reaped."""
        sup = self.sup
        if sup._state in ("closing", "closed"):
            while sup._state != "closed":
                await sup._wait_change()
            return
        if sup._state == "new":
            sup._state = "closed"
            return
        sup._state = "closing"
        pool = sup.pool
        pool.closing = True
        with anyio.CancelScope(shield=True):
            sup._disposing = True
            for turn in list(sup._turns.values()):
                if turn.state in ("queued", "handed", "running"):
                    sup._cancel(turn, DISPOSED)
            await sup._ending.wait_idle()
            for slot in list(sup._slots.values()):
                if slot.state in ("starting", "idle", "busy"):
                    pool.retire(slot)
            while sup._slots:
                await sup._wait_change()
            await pool.close()
        try:
            await self.bg.aclose()
        finally:
            sup.link.close()
            await pool.release()
            sup._state = "closed"
            sup._notify_change()

    def keep_queued(self) -> list[str]:
        """``Supervisor.keep_queued`` (DAEMON-KEEP-QUEUED): the ids set aside, in queue order."""
        sup = self.sup
        kept: list[str] = []
        for turn in list(sup._turns.values()):
            if turn.state != "queued" or turn.parent is not None or turn.dispatchable or turn.clearing:
                continue
            sup._queue.discard(turn)
            turn.state = "kept"
            kept.append(turn.id)
            sup._active -= 1
            set_done(turn)
            turn.wake_followers()
        sup._ending.wake_if_idle()
        sup._notify_change()
        return kept
