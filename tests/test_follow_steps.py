"""How often the daemon's follower task runs per event it sends (CLIENT-ONE-STEP).

The daemon's own follower (``Requests._follow``) on a real ``TurnRecord``/``TurnTable`` and client
table, its replies collected from ``send``; its task's steps counted by a coroutine that wraps it.
With hundreds of turns each followed by one client, every task step is a loop pass the daemon pays
per event: a follower must run once per wake-up, and send all that is ready in that one step.
"""

from __future__ import annotations

import asyncio
import collections.abc
from collections.abc import Coroutine, Generator
from types import SimpleNamespace
from typing import Any

import anyio
import msgspec
import pytest

from supervisor.daemon.clients import ClientTable, FollowStream
from supervisor.daemon.requests import Requests
from supervisor.lowlevel import TurnTable
from tests.support import journalkit
from wire import client_link

pytestmark = pytest.mark.anyio

IDENT = b"client-1"


class _Counted(collections.abc.Coroutine[Any, Any, Any]):
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


class _Rig:
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

    def start(self) -> tuple[_Counted, asyncio.Task[Any]]:
        counted = _Counted(self.requests._follow(IDENT, 1, self.turn, self.stream))
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


@pytest.mark.parametrize("window", [0, 256])
async def test_a_follower_of_events_that_come_one_at_a_time_runs_once_per_event(window: int) -> None:
    """Each event arrives alone (as a ticking agent's do): the follower wakes, sends it, and waits
    again in that same step. Attacks the follower that sent, yielded, then came back only to find
    nothing and wait: two task steps per event, so 384 followed turns cost the daemon twice the loop
    passes per event."""
    rig = _Rig(window)
    counted, task = rig.start()
    await rig.until_sent(0)
    await anyio.sleep(0.01)  # allowed: the follower reaches its first wait (there is no event for it)
    n = 40
    before = counted.steps
    for i in range(n):
        await anyio.sleep(0.006)  # allowed: paces the events past COALESCE, as a ticking agent's are
        rig.emit(1)
        await rig.until_sent(i + 1)
        if window:
            rig.stream.grant(1)  # the client reads each event: its window never runs dry
    steps = counted.steps - before
    await rig.end(task)
    assert rig.events_sent() == n
    assert [m.seq for m in rig.frames if isinstance(m, client_link.Events)] == list(range(n))
    assert isinstance(rig.frames[-1], client_link.FollowEnd)
    assert steps <= n + 2, f"{steps} follower steps for {n} events sent one at a time"


async def test_a_follower_sends_what_is_queued_in_one_batch_per_wake_up() -> None:
    """500 events queued at once: one frame, sent in the step the follower woke in."""
    rig = _Rig(0)
    counted, task = rig.start()
    await anyio.sleep(0.01)  # allowed: the follower reaches its first wait (there is no event for it)
    before = counted.steps
    rig.emit(500)
    await rig.until_sent(500)
    await anyio.sleep(0.01)  # allowed: lets a follower that would run again do so before counting
    steps = counted.steps - before
    await rig.end(task)
    events = [m for m in rig.frames if isinstance(m, client_link.Events)]
    assert [len(m.data) for m in events] == [500]
    assert steps == 1, f"{steps} follower steps for one batch"
