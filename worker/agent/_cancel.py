"""The loop's cancel channel: a bounded queue of "cancel" tokens with counted senders.

Modelled on the Rust worker's ``mpsc::channel::<()>(1)``:

* ``cancel()`` / ``CancelSender.try_send()`` put a token if there is room (capacity 1: a second
  cancel while one is queued is redundant and dropped);
* ``try_recv()`` takes a token; a channel whose every sender is gone (closed, or garbage
  collected) counts as cancelled, for ever;
* ``drain()`` drops queued tokens, so a stale cancel never reaches a later run.

Blocking detection points register an anyio ``CancelScope`` here; a token (or the last sender
going away) cancels every registered scope, so the loop wakes with no polling and no extra task.
Senders work from any task of the loop's event loop and from any other thread: from a
foreign thread the token is handed to the loop's event loop (``anyio.from_thread.run_sync``
with the token the loop recorded when its run started).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

T = TypeVar("T")


class _Channel:
    __slots__ = ("capacity", "pending", "scopes", "senders", "thread", "token")

    def __init__(self, capacity: int = 1) -> None:
        self.capacity = capacity
        self.pending = 0
        self.senders = 0
        self.scopes: set[anyio.CancelScope] = set()
        self.thread = threading.get_ident()
        self.token: anyio.lowlevel.EventLoopToken | None = None

    def attach(self) -> None:
        """Called by the loop as a run starts: remember its thread and event loop."""
        self.thread = threading.get_ident()
        self.token = anyio.lowlevel.current_token()

    def in_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` where the scopes live: here, or in the loop's event loop from another thread."""
        if threading.get_ident() != self.thread and self.token is not None:
            try:
                return anyio.from_thread.run_sync(fn, token=self.token)
            except RuntimeError:
                pass  # that event loop has ended: no scope is waiting, so no one needs waking
        return fn()

    @property
    def disconnected(self) -> bool:
        return self.senders == 0

    def ready(self) -> bool:
        """A receive would report "cancelled" (a token is queued, or no sender is left)."""
        return self.pending > 0 or self.senders == 0

    def put(self) -> bool:
        return self.in_loop(self._put)

    def _put(self) -> bool:
        if self.pending >= self.capacity:
            return False
        self.pending += 1
        self.wake()
        return True

    def try_recv(self) -> bool:
        """The Rust ``try_cancelled``: Ok → True, Empty → False, Disconnected → True."""
        if self.pending:
            self.pending -= 1
            return True
        return self.senders == 0

    def drain(self) -> int:
        n, self.pending = self.pending, 0
        return n

    def wake(self) -> None:
        for scope in tuple(self.scopes):
            scope.cancel()


class CancelSender:
    """A handle that cancels an ``AgentLoop`` without touching it (``AgentLoop.cancel_sender()``,
    ``cancel_channel()``). Any task may hold one. ``close()`` it when done: once every sender of
    a channel is closed, the loop reading it counts as cancelled."""

    __slots__ = ("__weakref__", "_chan", "_closed")

    def __init__(self, chan: _Channel) -> None:
        self._chan = chan
        self._closed = False
        chan.senders += 1

    @property
    def closed(self) -> bool:
        return self._closed

    def try_send(self) -> bool:
        """Queue a cancel; False when one is already queued (the cancel is pending anyway).
        Raises ``anyio.ClosedResourceError`` on a closed sender."""
        if self._closed:
            raise anyio.ClosedResourceError
        return self._chan.put()

    async def send(self) -> None:
        """``try_send()`` then a checkpoint. Never waits for room: a full queue already holds a
        cancel, so (unlike the Rust ``send().await``) there is nothing to wait for."""
        self.try_send()
        await anyio.lowlevel.checkpoint()

    def clone(self) -> CancelSender:
        if self._closed:
            raise anyio.ClosedResourceError
        return CancelSender(self._chan)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._chan.in_loop(self._release)

    def _release(self) -> None:
        self._chan.senders -= 1
        if self._chan.senders == 0:
            self._chan.wake()

    def __enter__(self) -> CancelSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A dropped sender is gone, as in Rust. Wake a waiting loop only from its own thread:
        # the garbage collector may run this anywhere.
        try:
            if not self._closed:
                self._closed = True
                self._chan.senders -= 1
                if self._chan.senders == 0 and threading.get_ident() == self._chan.thread:
                    self._chan.wake()
        except Exception:  # noqa: BLE001 - never raise from a finaliser (interpreter shutdown)
            pass


class CancelReceiver:
    """The receiving end from ``cancel_channel()``; hand it to ``AgentLoop(cancel_rx=...)``.
    A loop built that way holds no sender of its own, so it stops once every sender is gone."""

    __slots__ = ("_chan", "_claimed")

    def __init__(self, chan: _Channel) -> None:
        self._chan = chan
        self._claimed = False

    def _claim(self) -> _Channel:
        if self._claimed:
            raise ValueError("this CancelReceiver already belongs to an AgentLoop")
        self._claimed = True
        return self._chan


def cancel_channel(capacity: int = 1) -> tuple[CancelSender, CancelReceiver]:
    """A cancel channel whose only sender is yours: ``tx, rx = cancel_channel()``,
    ``AgentLoop(model, cancel_rx=rx)``; closing (or dropping) every sender cancels the loop."""
    if capacity < 1:
        raise ValueError("capacity must be at least 1")
    chan = _Channel(capacity)
    return CancelSender(chan), CancelReceiver(chan)
