"""The event-loop hosts the async API runs in (issue 15, item 1; design rule API-ASYNCIO).

``Supervisor`` and ``Client`` are asyncio programs (``zmq.asyncio``, reader callbacks on the
loop, pidfds): they run under every asyncio runner — ``asyncio.run``, an ``asyncio.Runner`` with
uvloop's loop, anyio's asyncio backend, a loop somebody else started and runs (Jupyter's kernel,
uvicorn) — and refuse trio at once, with a message saying what to do instead, before anything
is started (``require_asyncio``).

Their background tasks (the worker link, the timers, the client's receiver) live in a task of
their own (``Background``), not in a task group entered by the caller's task: a task group must
be left by the task that entered it, and a user may open a supervisor in one task and close it in
another (two Jupyter cells, a FastAPI lifespan, ``asyncio.create_task``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc
import sniffio

TRIO_REFUSED = (
    "{what} runs on asyncio only (asyncio.run, uvloop, anyio's asyncio backend, Jupyter's loop), "
    "not on {lib}: it drives ZeroMQ sockets and worker exits with asyncio's reader callbacks. "
    "From {lib}, use the blocking {sync} in a thread (await trio.to_thread.run_sync(...)), "
    "or run this code with anyio.run(..., backend='asyncio')"
)


def require_asyncio(what: str, sync: str) -> asyncio.AbstractEventLoop:
    """The running asyncio loop; ``RuntimeError`` naming the way out under any other library."""
    try:
        lib = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        lib = "no event loop"
    if lib != "asyncio":
        raise RuntimeError(TRIO_REFUSED.format(what=what, lib=lib, sync=sync))
    return asyncio.get_running_loop()


class Background:
    """An anyio task group hosted in an asyncio task of its own.

    ``start`` may be awaited in one task and ``aclose`` in another. A background task that raises
    cancels its siblings (task-group rules); the error is raised by ``aclose``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._task: asyncio.Task[None] | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        ready: asyncio.Future[None] = loop.create_future()

        async def host() -> None:
            try:
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    ready.set_result(None)
                    await anyio.sleep_forever()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                raise

        self._task = loop.create_task(host(), name=self.name)
        # Shielded: the host task exists now and must be known to ``aclose`` even if the caller
        # is cancelled while it starts.
        await asyncio.shield(ready)

    @property
    def task_group(self) -> anyio.abc.TaskGroup:
        assert self._tg is not None, "Background.start() first"
        return self._tg

    def start_soon(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        assert self._tg is not None, "Background.start() first"
        self._tg.start_soon(fn, *args)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def aclose(self) -> None:
        """Cancel the background tasks and wait for them (shielded); raise what one of them raised."""
        task = self._task
        if task is None:
            return
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
        else:
            task.cancel()
        with anyio.CancelScope(shield=True):
            # asyncio.shield: a cancel of the awaiting task must not cancel the host task itself.
            await asyncio.shield(asyncio.wait([task]))
        self._task = None
        self._tg = None
        if not task.cancelled():
            task.result()


# API-NO-NESTING: multiprocessing's bootstrapping check, for turnpool's own processes.
INSIDE_WORKER = (
    "a turnpool Supervisor cannot be started inside a turnpool {role} (pid {pid}). This usually "
    "means a module that defines agents also starts a supervisor when it is imported: every worker "
    "imports that module to find its agent, so each would start a pool of its own. Keep the code "
    'that starts the supervisor under `if __name__ == "__main__":` (or move the agents to a module '
    "of their own). From inside a turn, run another agent with `await turn.spawn(...)`"
)


def refuse_inside_worker() -> None:
    """``RuntimeError`` when called in a turnpool worker or zygote process."""
    from worker import lowlevel

    role = lowlevel.process_role()
    if role is not None:
        import os

        raise RuntimeError(INSIDE_WORKER.format(role=role, pid=os.getpid()))
