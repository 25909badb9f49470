"""Blocking front ends: ``SyncSupervisor`` (and the base that ``SyncClient`` shares).

The async object runs on an event loop in a background thread (an anyio blocking portal)
that lives as long as the context manager, so workers are started from a thread that
outlives them (the parent-death signal is tied to the starting thread).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from wire import Cause, TurnResult

from ._handle import TurnHandle


class SyncTurnHandle:
    """The blocking twin of ``TurnHandle``."""

    __slots__ = ("turn_id", "_handle", "_portal")

    def __init__(self, handle: TurnHandle, portal: BlockingPortal) -> None:
        self.turn_id = handle.turn_id
        self._handle = handle
        self._portal = portal

    def events(self) -> Iterator[Any]:
        """Blocking iterator over the turn's events; ends when the turn ends."""
        agen = self._handle.events()
        try:
            while True:
                try:
                    yield self._portal.call(agen.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            with contextlib.suppress(Exception):
                aclose = getattr(agen, "aclose", None)  # an async generator's; a plain iterator has none
                if aclose is not None:
                    self._portal.call(aclose)

    def result(self) -> TurnResult:
        return self._portal.call(self._handle.result)

    def cancel(self, cause: Any = None) -> Cause | None:
        return self._portal.call(self._handle.cancel, cause)

    def __repr__(self) -> str:
        return f"SyncTurnHandle({self.turn_id!r})"


class SyncFront:
    """Blocking methods over an async supervisor or client living in a portal thread."""

    def __init__(self) -> None:
        self._stack: contextlib.ExitStack | None = None
        self._portal: BlockingPortal | None = None
        self._target: Any = None

    def _open(self, make_async_cm: Any) -> None:
        stack = contextlib.ExitStack()
        try:
            self._portal = stack.enter_context(start_blocking_portal(backend="asyncio"))
            cm = self._portal.call(make_async_cm)
            self._target = stack.enter_context(self._portal.wrap_async_context_manager(cm))
        except BaseException:
            stack.close()
            raise
        self._stack = stack

    def close(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._portal is None or self._stack is None:
            raise RuntimeError(f"{type(self).__name__} is not open: use it as a context manager")
        if kwargs:
            return self._portal.call(lambda: fn(*args, **kwargs))
        return self._portal.call(fn, *args)

    def submit(self, agent: str, input: Any = None, **kwargs: Any) -> SyncTurnHandle:
        handle = self._call(self._target.submit, agent, input, **kwargs)
        assert self._portal is not None
        return SyncTurnHandle(handle, self._portal)

    def run(self, agent: str, input: Any = None, **kwargs: Any) -> TurnResult:
        return self._call(self._target.run, agent, input, **kwargs)

    def handle(self, turn_id: str) -> SyncTurnHandle:
        handle = self._call(_sync_to_async(self._target.handle), turn_id)
        assert self._portal is not None
        return SyncTurnHandle(handle, self._portal)

    def cancel(self, turn_id: str, cause: Any = None) -> Cause | None:
        return self._call(self._target.cancel, turn_id, cause)

    def cancel_session(self, session: str, cause: Any = None) -> list[str]:
        return self._call(self._target.cancel_session, session, cause)

    def status(self) -> dict[str, Any]:
        fn = self._target.status
        return self._call(fn if _is_coro(fn) else _sync_to_async(fn))

    def when_idle(self) -> None:
        self._call(self._target.when_idle)


def _is_coro(fn: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


def _sync_to_async(fn: Any) -> Any:
    async def call(*args: Any) -> Any:
        return fn(*args)

    return call


class SyncSupervisor(SyncFront):
    """``Supervisor`` with blocking methods, for scripts and batch jobs::

    with SyncSupervisor(workers=2) as sup:
        print(sup.run("examples.agents:echo", {"text": "hi"}).output)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        from ._engine import Supervisor

        self._args = args
        self._kwargs = kwargs
        self._factory = Supervisor
        Supervisor(*args, **kwargs)  # validate arguments now, at the call

    def __enter__(self) -> SyncSupervisor:
        async def make() -> Any:
            return self._factory(*self._args, **self._kwargs)

        self._open(make)
        return self
