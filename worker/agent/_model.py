"""The model side of the loop: the ``ModelClient`` protocol and ``ScriptedModel``.

A client opens a stream for a request (``await client.open(request)``: the request is on its
way and the stream is ready to read) and the stream yields ``TextDelta``, ``ToolCall`` and
``Finish`` events; ``aclose()`` releases it (an HTTP client closes its connection). The loop
can interrupt both the opening and every wait for the next event.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.lowlevel

from ._messages import ModelEvent, ModelRequest


@runtime_checkable
class ModelStream(Protocol):
    def __aiter__(self) -> ModelStream: ...

    async def __anext__(self) -> ModelEvent: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ModelClient(Protocol):
    """``supported_settings``: the request settings the client understands (``None``: any);
    the loop raises ``ConfigWarnings`` for the others."""

    supported_settings: frozenset[str] | None

    async def open(self, request: ModelRequest) -> ModelStream: ...


@dataclass(frozen=True)
class Delayed:
    """A scripted event that arrives ``seconds`` after the previous one (overrides ``delay``)."""

    event: ModelEvent | BaseException
    seconds: float


@dataclass(frozen=True)
class Response:
    """One scripted model answer: ``open_delay`` before the stream is open, ``delay`` before
    each event (``Delayed`` overrides it per event); an exception in ``events`` is raised
    at that point of the stream, ``open_error`` instead of opening."""

    events: Sequence[ModelEvent | Delayed | BaseException]
    open_delay: float = 0.0
    delay: float = 0.0
    open_error: BaseException | None = None


@dataclass
class _Counters:
    opened: int = 0
    closed: int = 0
    events: int = 0


class ScriptedModel:
    """A deterministic ``ModelClient``: each ``open()`` plays the next ``Response``.

    Records every request (``requests``) and counts openings, closes and delivered events;
    ``await model.reached("open"|"event"|"close", n)`` waits until that count reaches ``n``
    (tests cancel at an exact point without sleeping). ``on_open(n)`` (sync or async) is called
    as the n-th opening starts.
    """

    def __init__(
        self,
        responses: Sequence[Response],
        *,
        supported_settings: frozenset[str] | None = None,
        on_open: Callable[[int], Awaitable[Any] | Any] | None = None,
    ) -> None:
        self.responses = list(responses)
        self.supported_settings = supported_settings
        self.requests: list[ModelRequest] = []
        self.counts = _Counters()
        self._on_open = on_open
        self._waiters: list[tuple[str, int, anyio.Event]] = []

    def _bump(self, kind: str) -> None:
        setattr(self.counts, kind, getattr(self.counts, kind) + 1)
        value = getattr(self.counts, kind)
        for waiter in list(self._waiters):
            if waiter[0] == kind and value >= waiter[1]:
                self._waiters.remove(waiter)
                waiter[2].set()

    async def reached(self, kind: str, n: int = 1) -> None:
        """Wait until ``counts.<opened|events|closed>`` ≥ ``n`` (``kind`` is open/event/close)."""
        attr = {"open": "opened", "event": "events", "close": "closed"}[kind]
        if getattr(self.counts, attr) >= n:
            return
        event = anyio.Event()
        self._waiters.append((attr, n, event))
        await event.wait()

    async def open(self, request: ModelRequest) -> _ScriptedStream:
        index = len(self.requests)
        self.requests.append(request)
        if index >= len(self.responses):
            raise RuntimeError(
                f"ScriptedModel has no response #{index + 1} (script of {len(self.responses)})"
            )
        response = self.responses[index]
        self._bump("opened")
        if self._on_open is not None:
            result = self._on_open(index + 1)
            if hasattr(result, "__await__"):
                await result
        if response.open_delay:
            await anyio.sleep(response.open_delay)
        if response.open_error is not None:
            raise response.open_error
        return _ScriptedStream(self, response)


@dataclass
class _ScriptedStream:
    model: ScriptedModel
    response: Response
    position: int = 0
    closed: bool = field(default=False)

    def __aiter__(self) -> _ScriptedStream:
        return self

    async def __anext__(self) -> ModelEvent:
        if self.closed or self.position >= len(self.response.events):
            raise StopAsyncIteration
        item = self.response.events[self.position]
        delay = self.response.delay
        if isinstance(item, Delayed):
            delay, item = item.seconds, item.event
        if delay:
            await anyio.sleep(delay)
        else:
            await anyio.lowlevel.checkpoint()
        self.position += 1
        if isinstance(item, BaseException):
            raise item
        self.model._bump("events")
        return item

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self.model._bump("closed")
