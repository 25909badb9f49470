"""The daemon's own follower (``Requests._follow``) run alone: a real ``TurnRecord``, ``TurnTable`` and
client table, its replies collected from ``send``, its task's steps counted by a coroutine that wraps it
(CLIENT-ONE-STEP). ``Rig(window)`` is one followed turn; ``emit`` adds events as a worker's would."""

from __future__ import annotations

import asyncio
import collections.abc
from collections.abc import Coroutine, Generator
from types import SimpleNamespace
from typing import Any

import anyio
import msgspec

from supervisor.daemon.clients import ClientTable, FollowStream
from supervisor.daemon.requests import Requests
from supervisor.lowlevel import TurnTable
from tests.support import journalkit
from wire import client_link

IDENT = b"client-1"


class Counted(collections.abc.Coroutine[Any, Any, Any]):
    """A coroutine that counts the steps the task running it takes (each ``send``/``throw``)."""

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.steps = 0

    def send(self, value: Any) -> Any:
        self.steps += 1
        return self.coro.send(value)

    def throw(self, *args: Any) -> Any:
        self.steps += 1
        return self.coro.throw(*args)

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Generator[Any, Any, Any]:
        raise NotImplementedError  # only ever run as a task


class Rig:
    """A ``Requests`` whose follower sends to ``frames``; ``sent`` is set at each send."""

    def __init__(self, window: int) -> None:
        self.table = TurnTable(keep=10, max_events=100_000)
        self.turn = journalkit.record("t1")
        self.turn.state = "running"
        self.clients = ClientTable()
        self.clients.get(IDENT, 0).version = client_link.CLIENT_PROTOCOL_VERSION
        self.frames: list[Any] = []
        self.sent = asyncio.Event()
        self.stream = FollowStream(window, "t1")

        def send(ident: bytes, msg: Any) -> bool:
            self.frames.append(msg)
            self.sent.set()
            return True

        def unused(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("not used by a follow")

        sup = SimpleNamespace(table=self.table, max_events=self.table.max_events)
        self.requests = Requests(
            sup,  # type: ignore[arg-type]
            self.clients,
            send=send,
            send_alone=send,
            task=unused,
            abandon=unused,
            admit=unused,
            answer_result=unused,
            ack_when_done=unused,
            cancel_timed=unused,
            status=unused,
            lookup=unused,
        )

    def start(self) -> tuple[Counted, asyncio.Task[Any]]:
        counted = Counted(self.requests._follow(IDENT, 1, self.turn, self.stream))
        return counted, asyncio.ensure_future(counted)

    def emit(self, n: int) -> None:
        for _ in range(n):
            self.table.add_event(self.turn, msgspec.Raw(b"1.5"))

    async def until_sent(self, total: int) -> None:
        with anyio.fail_after(10):
            while self.events_sent() < total:
                self.sent.clear()
                await self.sent.wait()

    def events_sent(self) -> int:
        return sum(len(m.data) for m in self.frames if isinstance(m, client_link.Events))

    async def end(self, task: asyncio.Task[Any]) -> None:
        self.turn.state = "ended"
        self.turn.wake_followers()
        with anyio.fail_after(10):
            await task
