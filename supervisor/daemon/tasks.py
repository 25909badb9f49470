"""The daemon's request tasks: a request that waits (result, follow, when_idle) runs as a task in the
daemon's task group, registered under its client (CLIENT-STATE: an ``Abandon``, a disconnect or a full
queue cancels it), and the shutdown waits until none runs (DAEMON-DRAIN: the requests woken by disposal
answer before the socket goes). Given the ``ClientTable``; the lifecycle hands it the task group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from .clients import ClientTable

log = logging.getLogger("turnpool.daemon")


class RequestTasks:
    """Start the request tasks (``start``) in the task group given by ``joined``; ``answered``
    returns once none runs."""

    def __init__(self, clients: ClientTable) -> None:
        self._clients = clients
        self._tg: anyio.abc.TaskGroup | None = None
        self._inflight = 0
        self._inflight_zero = anyio.Event()

    def serving(self) -> None:
        """A serve begins (on its event loop): none runs yet."""
        self._inflight_zero = anyio.Event()

    def joined(self, tg: anyio.abc.TaskGroup) -> None:
        """The task group request tasks run in."""
        self._tg = tg

    async def answered(self) -> None:
        """Return once no request task runs."""
        while self._inflight:
            await self._inflight_zero.wait()

    def start(
        self,
        fn: Callable[..., Any],
        *args: Any,
        key: tuple[bytes, int, str] | None = None,
        scope: anyio.CancelScope | None = None,
    ) -> None:
        """Run a request that waits (result, follow, when_idle) as a task; with ``key`` it is
        registered under its client, so an ``Abandon``, a disconnect or a full queue cancels it."""
        assert self._tg is not None
        peer = None
        if key is not None:
            peer = self._clients.peers.get(key[0])
            if peer is None:
                return  # CLIENT-GONE: its client is gone (a request read before it went): nobody waits
        self._inflight += 1
        if self._inflight == 1:
            self._inflight_zero = anyio.Event()
        scope = scope or anyio.CancelScope()
        if key is not None and peer is not None:
            peer.hold(key[1], scope, key[2])
        self._tg.start_soon(self._run, fn, args, scope, key)

    async def _run(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        scope: anyio.CancelScope,
        key: tuple[bytes, int, str] | None,
    ) -> None:
        try:
            with scope:
                await fn(*args)
        except Exception:
            log.exception("request task %s failed", getattr(fn, "__name__", fn))
        finally:
            if key is not None:
                peer = self._clients.peers.get(key[0])
                if peer is not None and peer.tasks.get(key[1], (None,))[0] is scope:
                    del peer.tasks[key[1]]
            self._inflight -= 1
            if self._inflight == 0:
                self._inflight_zero.set()
