"""The ZeroMQ plumbing every turnpool link shares, written once: the engine's worker link, the
daemon's client link, the client and the worker read their sockets through a ``ReadableEdge``,
batch what they send with a ``LoopFlush``, use these plain-int flags, and open their context's first
socket with ``open_socket`` (its I/O threads at a short slice).

Owner-agnostic: it knows a socket and an event loop, never who holds them or what the frames say.
It lives in ``worker/`` because the worker may not import the supervisor, and is public so the
supervisor (which reaches ``worker`` through public names only) uses the same code.

The flags (LINK-FLAGS): pyzmq's flags and socket options are enums, and each ``&`` or ``|`` on one builds
an enum member (on the worker link ≈ 10% of the supervisor's time while a turn streams events,
measured); these are plain ints.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable
from typing import Any, TypeVar, cast

import anyio
import zmq

from . import _slice

NOBLOCK = int(zmq.NOBLOCK)
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)
RCVMORE = int(zmq.RCVMORE)
NOBLOCK_MORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)


_S = TypeVar("_S", bound=zmq.Socket[Any])


def _nothing() -> None:
    pass


def open_socket(ctx: zmq.Context[_S], kind: int) -> _S:
    """A socket of ``ctx``; the threads its first socket starts (the context's I/O thread, which moves
    every frame between the socket and the kernel, and its reaper) run at a short EEVDF slice, where the
    kernel takes it (WORKER-SHORT-SLICE)."""
    with _slice.new_threads_short():
        return ctx.socket(kind)


class ReadableEdge:
    """LINK-EDGE — the one place of ZeroMQ's edge-trigger rule. A ZeroMQ socket's FD is
    edge-triggered: it fires when the socket goes from "nothing to read" to "something", and a send
    (or any look at the socket's state) can consume that transition. So a reader that stops while
    frames are still queued (its fair slice ended) must be run again from the loop, and after every
    send someone must look whether something arrived meanwhile, or the frames already queued wait for
    the next, unrelated, wake-up.

    ``reader`` is the socket's reader callback (it drains what it may and returns). ``attach``
    registers it on the loop and runs it once (frames that arrived before the registration);
    ``again`` runs it once more from the loop, however often asked before the loop turns;
    ``after_send`` does so only if the socket holds something; ``look_soon`` leaves even that look
    to the loop's next turn, for a hot path that must not pay for it (≈ 1.2 µs) on every send.
    A reader callback, not a task awaiting ``recv``: no future and no task switch per wake-up.
    """

    __slots__ = ("_context", "_fd", "_getsockopt", "_look_due", "loop", "reader", "scheduled")

    def __init__(self, sock: zmq.Socket[Any], reader: Callable[[], None] = _nothing) -> None:
        self._getsockopt: Callable[[int], Any] = sock.getsockopt
        self._fd = cast(int, sock.getsockopt(zmq.FD))  # pyzmq types every option int | bytes
        self.reader = reader
        self.loop: asyncio.AbstractEventLoop | None = None  # set while attached
        self._context: contextvars.Context | None = None
        self.scheduled = False  # a run of the reader from the loop is on its way
        self._look_due = False

    @property
    def attached(self) -> bool:
        return self.loop is not None

    def attach(self, loop: asyncio.AbstractEventLoop, context: contextvars.Context | None = None) -> None:
        """Run the reader whenever the FD fires (in a copy of the current context; ``again`` and
        ``after_send`` run it in ``context`` when given), and once now."""
        self.loop = loop
        self._context = context
        loop.add_reader(self._fd, self._run)
        self._run()

    def detach(self) -> None:
        loop, self.loop = self.loop, None
        if loop is not None:
            with contextlib.suppress(Exception):  # the loop may be closing already
                loop.remove_reader(self._fd)

    async def watch(self, context: contextvars.Context | None = None) -> None:
        """``attach`` for as long as the calling task runs (it only owns the registration)."""
        self.attach(asyncio.get_running_loop(), context)
        try:
            await anyio.sleep_forever()
        finally:
            self.detach()

    def _run(self) -> None:
        self.scheduled = False
        self.reader()

    def readable(self) -> bool:
        """Whether the socket holds a frame to read now (ZeroMQ's level-triggered ``EVENTS``)."""
        return bool(cast(int, self._getsockopt(EVENTS)) & POLLIN)

    def again(self) -> None:
        """Run the reader once more from the loop (once, however often asked before it runs)."""
        if not self.scheduled and self.loop is not None:
            self.scheduled = True
            self.loop.call_soon(self._run, context=self._context)

    def after_send(self) -> None:
        """A send may have eaten the readable edge: run the reader soon if a frame is waiting."""
        if not self.scheduled and self.loop is not None and cast(int, self._getsockopt(EVENTS)) & POLLIN:
            self.scheduled = True
            self.loop.call_soon(self._run, context=self._context)

    def after_send_threadsafe(self) -> None:
        """``after_send`` from another thread than the loop's (the caller holds the socket)."""
        loop = self.loop
        if loop is not None and cast(int, self._getsockopt(EVENTS)) & POLLIN:
            loop.call_soon_threadsafe(self._run, context=self._context)

    def look_soon(self) -> bool:
        """Look at the socket once the loop turns, and run the reader then if a frame waits; True
        when no look was pending (the loop has turned since the last one was asked)."""
        if self._look_due:
            return False
        if self.loop is None:
            return True  # not attached: nothing to look for
        self._look_due = True
        self.loop.call_soon(self._look, context=self._context)
        return True

    def _look(self) -> None:
        self._look_due = False
        if self.loop is not None and cast(int, self._getsockopt(EVENTS)) & POLLIN:
            self._run()


class LoopFlush:
    """CLIENT-BATCHES — the one batching rule of every link: what is posted during one pass of the event loop
    leaves together once the loop turns. The poster queues its message where its owner keeps them
    (one list, or one per peer) and calls ``soon``: the first call of a pass schedules ``flush``
    once, later ones cost a flag test. A thousand submits made in one pass are a few frames, a
    turn that ends without yielding sends ``Started`` and ``End`` in one.

    ``flush`` may also be called directly (a batch that grew past its size, a shutdown): the
    scheduled call then finds less, or nothing, to send."""

    __slots__ = ("_context", "_flush", "due", "loop")

    def __init__(
        self,
        flush: Callable[[], None],
        loop: asyncio.AbstractEventLoop | None = None,
        context: contextvars.Context | None = None,
    ) -> None:
        self._flush = flush
        self.loop = loop  # None until the owner runs on a loop: ``soon`` then does nothing
        self._context = context
        self.due = False  # a flush is scheduled for the end of this pass

    def soon(self) -> bool:
        """Flush when the loop turns; True when this call scheduled it (the first of the pass)."""
        if self.due or self.loop is None:
            return False
        self.due = True
        self.loop.call_soon(self._run, context=self._context)
        return True

    def _run(self) -> None:
        self.due = False
        self._flush()


__all__ = ["EVENTS", "NOBLOCK", "NOBLOCK_MORE", "POLLIN", "RCVMORE", "LoopFlush", "ReadableEdge"]
