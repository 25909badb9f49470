"""Owned streams: ``stream()``, the events of a turn whose block owns it, for every backend.

``run()`` owns its turn but yields no events; a handle streams but only observes. The pattern a
service needs sits between them: an endpoint streams a turn's events to a browser and must cancel
the turn when the browser goes away. ``stream()`` submits, yields the events, and owns the turn as
``run()`` does (API-STREAM): leaving the block before the turn ended (``break``, an exception, the
caller's cancellation) cancels the turn with cause ``user`` and waits, shielded, until it is
quiescent. The result is there afterwards (``await stream.result()``).

Written once against the public backend methods (``submit``, ``events``, ``cancel``, ``result``), so
the embedded ``Supervisor``, the daemon's ``Client`` and ``RaySupervisor`` behave alike.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import anyio

from wire import TurnResult

if TYPE_CHECKING:
    from ._handle import TurnHandle
    from ._sync import SyncTurnHandle


class TurnStream:
    """The events of one turn, owned by the ``stream()`` block that yields it.

    Iterate it (``async for event in stream``) for the agent's events in order; the iteration ends
    when the turn ends. ``await stream.result()`` gives the turn's one outcome (inside the block it
    waits for the end; after the block it is at hand). ``stream.turn_id`` and ``stream.handle``
    name the turn; ``await stream.cancel(cause)`` cancels it early, like the handle's."""

    __slots__ = ("_ended", "_events", "_result", "handle")

    def __init__(self, handle: TurnHandle) -> None:
        self.handle = handle
        self._events: AsyncIterator[Any] | None = None
        self._ended = False
        self._result: TurnResult | None = None

    @property
    def turn_id(self) -> str:
        return self.handle.turn_id

    def __aiter__(self) -> TurnStream:
        return self

    async def __anext__(self) -> Any:
        if self._events is None:
            self._events = aiter(self.handle.events())
        try:
            return await anext(self._events)
        except StopAsyncIteration:
            self._ended = True
            raise

    async def result(self) -> TurnResult:
        """The turn's result; waits for its end (and quiescence) when it has not ended yet."""
        if self._result is None:
            self._result = await self.handle.result()
        return self._result

    async def cancel(self, cause: Any = None) -> Any:
        return await self.handle.cancel(cause)

    async def _close(self, owner_left: bool) -> None:
        """End of the block: stop following, and unless the turn has ended, cancel it (cause
        ``user``); then wait for its result, shielded from every cancellation of the caller (anyio's
        and a native ``Task.cancel()``, re-raised by the caller's own frames once this returns)."""
        events, self._events = self._events, None
        finished = self._ended or self._result is not None

        async def stop() -> None:
            if events is not None:
                aclose = getattr(events, "aclose", None)
                if aclose is not None:
                    with contextlib.suppress(Exception):
                        await aclose()
            if not finished:
                await self.handle.cancel()
            await self.result()

        task = asyncio.get_running_loop().create_task(stop())
        with anyio.CancelScope(shield=True):
            while not task.done():
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    continue  # the caller was cancelled again: the turn is not quiescent yet
        if owner_left:
            # An exception or a cancellation is already on its way out of the block: a failure to
            # learn the result (the daemon gone) must not replace it.
            if not task.cancelled():
                task.exception()
            return
        task.result()


@contextlib.asynccontextmanager
async def open_stream(
    backend: Any, agent: str, input: Any = None, **options: Any
) -> AsyncIterator[TurnStream]:
    """``backend.stream(agent, input, **submit_options)``: submit, then yield the turn's
    ``TurnStream``; the block owns the turn (API-STREAM)."""
    handle = await backend.submit(agent, input, **options)
    stream = TurnStream(handle)
    try:
        yield stream
    except BaseException:
        await stream._close(owner_left=True)
        raise
    await stream._close(owner_left=False)


class OwnedStreams:
    """``stream()`` for a backend that has the public ``submit``/``events``/``cancel``/``result``."""

    def stream(
        self, agent: str, input: Any = None, **options: Any
    ) -> contextlib.AbstractAsyncContextManager[TurnStream]:
        """Submit a turn (``submit``'s options) and own it for the block::

            async with sup.stream("myapp.agents:chat", "hi") as events:
                async for event in events:
                    ...                      # leaving early cancels the turn (cause user)
            result = await events.result()

        Leaving the block before the turn ended (``break``, an exception, the caller's
        cancellation) cancels it with cause ``user`` and returns once it is quiescent."""
        return open_stream(self, agent, input, **options)


class SyncTurnStream:
    """The blocking twin of ``TurnStream``: a plain iterator over the events, ``result()``."""

    __slots__ = ("_ended", "_events", "_result", "handle")

    def __init__(self, handle: SyncTurnHandle) -> None:
        self.handle = handle
        self._events: Iterator[Any] | None = None
        self._ended = False
        self._result: TurnResult | None = None

    @property
    def turn_id(self) -> str:
        return self.handle.turn_id

    def __iter__(self) -> SyncTurnStream:
        return self

    def __next__(self) -> Any:
        if self._events is None:
            self._events = iter(self.handle.events())
        try:
            return next(self._events)
        except StopIteration:
            self._ended = True
            raise

    def result(self) -> TurnResult:
        if self._result is None:
            self._result = self.handle.result()
        return self._result

    def cancel(self, cause: Any = None) -> Any:
        return self.handle.cancel(cause)

    def _close(self, owner_left: bool) -> None:
        events, self._events = self._events, None
        close = getattr(events, "close", None)
        if close is not None:
            close()
        try:
            if not (self._ended or self._result is not None):
                self.handle.cancel()
            self.result()
        except Exception:
            if not owner_left:
                raise


@contextlib.contextmanager
def open_sync_stream(front: Any, agent: str, input: Any = None, **options: Any) -> Iterator[SyncTurnStream]:
    """The blocking ``stream()``: the same ownership as the async one (an interrupt — Ctrl-C —
    inside the block cancels the turn and waits for it; a second interrupt stops waiting)."""
    stream = SyncTurnStream(front.submit(agent, input, **options))
    try:
        yield stream
    except BaseException:
        stream._close(owner_left=True)
        raise
    stream._close(owner_left=False)
