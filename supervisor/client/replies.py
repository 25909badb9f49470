"""The client's request plumbing: where a request's replies wait (``_Reply``, ``_Replies``, and
``_Lost`` in their place when the daemon is gone), how a submit is validated and encoded before
anything is sent, and which typed exception a daemon's ``Error`` reply becomes.

``Client`` (``client.py``) holds the connection and the requests in flight and uses these; they
hold no connection state of their own.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from typing import Any

import wire
from wire import client_link

from .._checks import check_agent, check_known_id, check_optional_str, check_seconds
from .._errors import (
    SUBMIT_ERROR_CODES,
    FollowerDropped,
    ProtocolError,
    TurnIdConflict,
    TurnpoolError,
    UnknownTurn,
    shown_id,
)
from .._tracing import caller_trace


class _Lost:
    """Put in place of a reply when the connection to the daemon is gone."""

    def __init__(self, why: str) -> None:
        self.why = why


class _Reply(asyncio.Future[Any]):
    """The one reply to a request (most requests): the future itself, so a request in flight keeps
    one object alive, not a holder, a future and a timer (with thousands in flight, every such
    object is walked by each garbage collection)."""

    __slots__ = ("deadline", "req")

    def __init__(self, loop: asyncio.AbstractEventLoop, req: int) -> None:
        super().__init__(loop=loop)
        self.req = req
        self.deadline = 0.0  # when a bounded wait expires (loop time); 0: unbounded or answered

    def put(self, msg: Any) -> None:
        self.deadline = 0.0
        if not self.done():
            self.set_result(msg)

    def expire(self) -> None:
        if not self.done():
            self.set_exception(TimeoutError())


class _Replies:
    """The replies to one request, in arrival order (one for most requests, two for ``run``, a
    stream for a follow). A bare asyncio future per wait, not an ``anyio.Event`` plus a
    ``fail_after`` scope, and no per-request timer (``Client._deadlines``): with thousands of
    requests in flight, every object a request keeps alive is walked by each garbage collection."""

    __slots__ = ("deadline", "fut", "items")

    def __init__(self) -> None:
        self.items: list[Any] | deque[Any] | None = None
        self.fut: asyncio.Future[None] | None = None
        self.deadline = 0.0  # when a bounded wait expires (loop time); 0: unbounded

    def put(self, msg: Any) -> None:
        items = self.items
        if items is None:
            self.items = [msg]
        elif isinstance(items, list) and len(items) < 8:
            items.append(msg)
        else:
            if isinstance(items, list):
                items = self.items = deque(items)
            items.append(msg)
        fut = self.fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    def expire(self) -> None:
        fut = self.fut
        if fut is not None and not fut.done():
            fut.set_exception(TimeoutError())

    async def get(self) -> Any:
        """The next reply (``TimeoutError`` once its deadline, if any, passed without one)."""
        if not self.items:
            fut = self.fut = asyncio.get_running_loop().create_future()
            try:
                await fut
            finally:
                self.fut = None
        items = self.items
        assert items
        return items.popleft() if isinstance(items, deque) else items.pop(0)


class _Many:
    """The one reply each of many requests made at once (``submit_many``, ``results``), whose ids
    run from ``base``: one object and one future for all of them, not a future (and, in the
    caller, a task) per request. With ``stop_on_error`` the wait ends at the first ``Error``."""

    __slots__ = ("base", "deadline", "fut", "left", "replies", "stop_on_error")

    def __init__(self, loop: asyncio.AbstractEventLoop, base: int, n: int, *, stop_on_error: bool) -> None:
        self.base = base
        self.replies: list[Any] = [None] * n
        self.left = n
        self.fut: asyncio.Future[Any] = loop.create_future()
        self.deadline = 0.0
        self.stop_on_error = stop_on_error

    def put(self, msg: Any) -> None:
        fut = self.fut
        if isinstance(msg, _Lost):
            self.deadline = 0.0
            if not fut.done():
                fut.set_result(msg)
            return
        i = msg.req - self.base
        if self.replies[i] is None:
            self.replies[i] = msg
            self.left -= 1
        if (self.left == 0 or (self.stop_on_error and type(msg) is client_link.Error)) and not fut.done():
            self.deadline = 0.0
            fut.set_result(None)

    def expire(self) -> None:
        if not self.fut.done():
            self.fut.set_exception(TimeoutError())


def _submit_request(
    agent: str,
    input: Any,
    *,
    session: Any,
    timeout: Any,
    grace: Any,
    kill_after: Any,
    turn_id: Any,
    wait: bool = False,
    retry: Any = False,
) -> Callable[[int], client_link.Submit]:
    """Validate and encode a submit here, strictly, before anything is sent (as ``Supervisor`` does)."""
    check_agent(agent)
    raw = wire.encode_payload(input, what="turn input", exact=True)  # LINK-EXACT
    session, timeout, grace, kill_after, retry = _submit_options(
        session=session, timeout=timeout, grace=grace, kill_after=kill_after, retry=retry
    )
    turn_id = check_optional_str("turn_id", turn_id)
    # A partial over one tuple, not a closure: a closure keeps a cell per argument alive for as long
    # as the request is in flight, and thousands in flight are walked by every garbage collection.
    trace = caller_trace()  # OBS-TRACE: None at once when no trace context is in force
    return functools.partial(
        _submit_message, (agent, raw, session, timeout, grace, kill_after, turn_id, wait, retry, trace)
    )


def _submit_options(
    *, session: Any, timeout: Any, grace: Any, kill_after: Any, retry: Any
) -> tuple[str | None, float | None, float | None, float | None, bool]:
    """A submit's options, checked as ``Supervisor`` checks them (``TypeError``, ``ValueError``)."""
    session = check_optional_str("session", session)
    timeout = check_seconds("timeout", timeout, positive=True)
    grace = check_seconds("grace", grace)
    kill_after = check_seconds("kill_after", kill_after)
    if not isinstance(retry, bool):
        raise TypeError(f"retry must be True or False, got {retry!r}")
    return session, timeout, grace, kill_after, retry


def _submit_message(args: tuple[Any, ...], req: int) -> client_link.Submit:
    return client_link.Submit(req, *args)


def _get_result(turn_id: str, req: int) -> client_link.GetResult:
    return client_link.GetResult(req, turn_id)


def _check_turn_id(turn_id: Any) -> None:
    if not isinstance(turn_id, str) or not turn_id:
        raise TypeError(f"turn_id must be a non-empty string, got {shown_id(turn_id)}")
    check_known_id("turn_id", turn_id)


def _error(err: client_link.Error, turn_id: str | None, endpoint: str) -> Exception:
    """The typed exception for a daemon's ``Error`` reply."""
    code, message = err.code, err.message
    if code == "unknown_turn" and turn_id is not None:
        return UnknownTurn(turn_id)
    if code == "unknown_turn":
        return TurnpoolError(message)
    if code == "turn_id_conflict":  # API-TURN-ID: the fields that differ are read back from the message
        return TurnIdConflict.from_message(turn_id or "", message)
    for kind, known in SUBMIT_ERROR_CODES:  # the daemon's own table, read the other way
        if known == code:
            return kind(message)
    if code in ("protocol", "malformed"):
        return ProtocolError(f"{message} (daemon at {endpoint})")
    if code == "lagged":
        return FollowerDropped(f"{message} (daemon at {endpoint})")
    if code in ("dropped", "too_large"):
        return TurnpoolError(f"{message} (daemon at {endpoint})")
    return TurnpoolError(f"the daemon at {endpoint} failed: {message}")
