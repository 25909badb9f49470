"""Blocking front ends: ``SyncSupervisor`` (and the base that ``SyncClient`` shares).

The async object runs on an asyncio loop in a background thread of its own (an anyio blocking
portal), which lives until ``close()``, so workers are started from a thread that outlives them
(the parent-death signal is tied to the starting thread). Rules (docs/design.md, API-SYNC):

* Usable with or without ``with``: the first call opens the object, ``close()`` (or leaving the
  ``with`` block) ends it, as httpx's and redis's clients do.
* A forgotten ``close()`` never keeps the interpreter alive: the portal thread is a daemon thread,
  and every front still open at interpreter exit is closed by an ``atexit`` hook (workers disposed
  and reaped, the client disconnected), bounded by the disposal ladder.
* A blocking call interrupted in the calling thread (Ctrl-C: ``KeyboardInterrupt``) cancels the
  async call it waits for and waits (again interruptibly) for that cancellation to finish, then
  raises: an interrupted start tears down what it started; an interrupted ``run`` cancels its turn
  (cause ``user``, API-RUN-OWNS), while an interrupted ``result()``/``events()`` only stops
  observing.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import signal
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, cast

import anyio
from anyio.from_thread import BlockingPortal

from wire import Cause, TurnResult

from ._errors import SupervisorClosed
from ._handle import TurnHandle
from ._host import refuse_inside_worker
from ._many import turn_ids_of
from ._stream import SyncTurnStream, open_sync_stream

_FOR_THE_MAIN_THREAD = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


class _PortalThread:
    """An asyncio loop in a daemon thread, reached through an anyio ``BlockingPortal``."""

    def __init__(self, name: str) -> None:
        self.portal: BlockingPortal | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        # Signals meant for Python handlers (Ctrl-C's KeyboardInterrupt) must reach the main
        # thread: delivered to this thread instead, they would only set a flag while the main
        # thread sleeps in a lock wait, and Ctrl-C would seem swallowed. (Workers are spawned with
        # an empty signal mask whatever this thread blocks.)
        signal.pthread_sigmask(signal.SIG_BLOCK, _FOR_THE_MAIN_THREAD)

        async def serve() -> None:
            async with BlockingPortal() as portal:
                self.portal = portal
                self._ready.set()
                await portal.sleep_until_stopped()

        try:
            anyio.run(serve, backend="asyncio")
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that waits for it
            self._error = exc
        finally:
            self._ready.set()

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run ``fn(*args)`` on the loop and wait for it, interruptibly (see the module's rules)."""
        portal = self.portal
        if portal is None:
            raise SupervisorClosed("the blocking front's event loop is gone")
        finished = threading.Event()

        async def task() -> Any:
            try:
                return await fn(*args)
            finally:
                finished.set()

        future = portal.start_task_soon(task)
        try:
            return future.result()
        except BaseException:
            if not future.done() or future.cancelled():
                # Interrupted here (Ctrl-C): cancel the async call, let its cleanup run to the end
                # (a second interrupt stops waiting), then raise the interrupt.
                future.cancel()
                finished.wait()
            raise

    def stop(self) -> None:
        portal = self.portal
        if portal is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already gone
                portal.call(portal.stop, True)
            self._thread.join()
            self.portal = None


class SyncTurnHandle:
    """The blocking twin of ``TurnHandle``."""

    __slots__ = ("_handle", "_loop", "turn_id")

    def __init__(self, handle: TurnHandle, loop: _PortalThread) -> None:
        self.turn_id = handle.turn_id
        self._handle = handle
        self._loop = loop

    def events(self) -> Iterator[Any]:
        """Blocking iterator over the turn's events; ends when the turn ends."""
        agen = self._handle.events()
        try:
            while True:
                try:
                    yield self._loop.call(agen.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(agen, "aclose", None)  # an async generator's; a plain iterator has none
            if aclose is not None:
                with contextlib.suppress(Exception):  # the follow is over either way
                    self._loop.call(aclose)

    def result(self) -> TurnResult:
        """Wait for the turn's one outcome; an interrupt stops waiting, the turn runs on."""
        return cast(TurnResult, self._loop.call(self._handle.result))

    def cancel(self, cause: Any = None) -> Cause | None:
        return cast("Cause | None", self._loop.call(self._handle.cancel, cause))

    def __repr__(self) -> str:
        return f"SyncTurnHandle({self.turn_id!r})"


# Fronts not closed yet: closed at interpreter exit (API-SYNC). Held strongly: a forgotten front's loop
# thread and workers live on whether or not the user still holds it, so it must still be reachable
# here to be disposed of at exit.
_OPEN: set[SyncFront] = set()


@atexit.register
def _close_forgotten() -> None:
    for front in list(_OPEN):
        with contextlib.suppress(Exception):  # exiting anyway; each one's own log says why
            front.close()


class SyncFront:
    """Blocking methods over an async supervisor or client living in a portal thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: _PortalThread | None = None
        self._target: Any = None
        self._state = "new"  # new → open → closed
        self._stopping: anyio.Event | None = None
        self._host_done: threading.Event | None = None
        self._host_task: asyncio.Task[None] | None = None

    # ---- opening and closing -------------------------------------------------------------

    def _make(self) -> Any:
        """The async context manager to open (a ``Supervisor`` or a ``Client``); made on the loop."""
        raise NotImplementedError

    def _open(self) -> None:
        with self._lock:
            if self._state == "open":
                return
            if self._state == "closed":
                raise SupervisorClosed(f"this {type(self).__name__} is closed")
            loop = _PortalThread(f"turnpool {type(self).__name__}")
            try:
                self._target = loop.call(self._start_host, loop)
            except BaseException:
                loop.stop()
                raise
            self._loop = loop
            self._state = "open"
            _OPEN.add(self)

    async def _start_host(self, loop: _PortalThread) -> Any:
        """Enter the async object in a host task that leaves it when ``close`` says so: one task
        enters and exits it (its task group requires that)."""
        self._stopping = anyio.Event()
        self._host_done = threading.Event()
        entered: anyio.Event = anyio.Event()
        box: dict[str, Any] = {}
        stopping = self._stopping
        host_done = self._host_done

        async def host() -> None:
            try:
                target = await self._make().__aenter__()
                try:
                    box["target"] = target
                    entered.set()
                    await stopping.wait()
                finally:
                    with anyio.CancelScope(shield=True):
                        await target.__aexit__(None, None, None)
            except BaseException as exc:
                box["error"] = exc
                entered.set()
                if not isinstance(exc, Exception):
                    raise
            finally:
                host_done.set()

        # A task of the portal's loop, not of this call: it outlives this call.
        self._host_task = asyncio.get_running_loop().create_task(host())
        try:
            await entered.wait()
        except BaseException:
            # Interrupted while starting: cancel the start (it tears down what it started) and wait.
            # (A native cancel of the host task: the start's own task group may still be open.)
            assert self._host_task is not None
            self._host_task.cancel()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(host_done.wait)
            raise
        if "error" in box:
            raise box["error"]
        return box["target"]

    def close(self) -> None:
        """End it: a supervisor disposes (every turn cancelled, every worker reaped), a client
        disconnects. Harmless when already closed or never opened."""
        with self._lock:
            loop, self._loop = self._loop, None
            was, self._state = self._state, "closed"
            _OPEN.discard(self)
        if was != "open" or loop is None:
            return
        try:
            stopping, host_done = self._stopping, self._host_done
            if stopping is not None and host_done is not None:
                loop.call(_set_event, stopping)
                host_done.wait()
        finally:
            loop.stop()

    def __enter__(self) -> Any:
        self._open()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _call(self, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        if self._state != "open":
            self._open()
        loop = self._loop
        if loop is None:
            raise SupervisorClosed(f"this {type(self).__name__} is closed")
        fn = getattr(self._target, fn_name)

        async def call() -> Any:
            out = fn(*args, **kwargs)
            return await out if isinstance(out, Awaitable) else out

        return loop.call(call)

    # ---- the methods -----------------------------------------------------------------------

    def submit(self, agent: str, input: Any = None, **kwargs: Any) -> SyncTurnHandle:
        handle = self._call("submit", agent, input, **kwargs)
        assert self._loop is not None
        return SyncTurnHandle(handle, self._loop)

    def run(self, agent: str, input: Any = None, **kwargs: Any) -> TurnResult:
        return cast(TurnResult, self._call("run", agent, input, **kwargs))

    def stream(
        self, agent: str, input: Any = None, **kwargs: Any
    ) -> contextlib.AbstractContextManager[SyncTurnStream]:
        """``stream``, blocking: ``with sup.stream(agent, input) as events: for event in events: ...``;
        leaving the block before the turn ended cancels it (cause ``user``) and waits for it."""
        return open_sync_stream(self, agent, input, **kwargs)

    def submit_many(self, agent: str, inputs: Iterable[Any], **kwargs: Any) -> list[SyncTurnHandle]:
        """``submit_many``, blocking; a partial refusal's ``.handles`` are blocking handles too."""
        try:
            handles = self._call("submit_many", agent, list(inputs), **kwargs)
        except BaseException as exc:
            accepted = getattr(exc, "handles", None)
            if isinstance(accepted, list) and self._loop is not None:
                loop = self._loop
                exc.handles = [None if h is None else SyncTurnHandle(h, loop) for h in accepted]  # type: ignore[attr-defined]
            raise
        assert self._loop is not None
        return [SyncTurnHandle(h, self._loop) for h in handles]

    def results(self, turns: Iterable[Any]) -> list[TurnResult]:
        """``results``, blocking: takes handles (blocking or not) or turn ids."""
        return cast("list[TurnResult]", self._call("results", turn_ids_of(turns)))

    def handle(self, turn_id: str) -> SyncTurnHandle:
        handle = self._call("handle", turn_id)
        assert self._loop is not None
        return SyncTurnHandle(handle, self._loop)

    def cancel(self, turn_id: str, cause: Any = None) -> Cause | None:
        return cast("Cause | None", self._call("cancel", turn_id, cause))

    def cancel_session(self, session: str, cause: Any = None) -> list[str]:
        return cast("list[str]", self._call("cancel_session", session, cause))

    def status(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self._call("status"))

    def when_idle(self) -> None:
        self._call("when_idle")


async def _set_event(event: anyio.Event) -> None:
    event.set()


class SyncSupervisor(SyncFront):
    """``Supervisor`` with blocking methods, for scripts and batch jobs::

        with SyncSupervisor(workers=2) as sup:
            print(sup.run("examples.agents:echo", {"text": "hi"}).output)

    or without ``with``: the first call starts the pool, ``close()`` disposes it (one never
    closed is closed at interpreter exit).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        from ._engine.supervisor import Supervisor

        refuse_inside_worker()  # API-NO-NESTING (``Supervisor`` checks it too)
        self._args = args
        self._kwargs = kwargs
        self._factory = Supervisor
        Supervisor(*args, **kwargs)  # validate arguments now, at the call

    def _make(self) -> Any:
        return self._factory(*self._args, **self._kwargs)

    def __enter__(self) -> SyncSupervisor:
        self._open()
        return self

    def reload(self) -> dict[str, int]:
        """``Supervisor.reload``, blocking: replace every worker gracefully, so turns that start from
        now import agent code anew (running turns finish on their old workers)."""
        result: dict[str, int] = self._call("reload")
        return result
