"""Owned streams (design rule API-STREAM): ``stream()`` yields a turn's events and owns the turn.

Leaving the block before the turn ended — ``break``, an exception, the caller's cancellation, an
HTTP client that goes away from a Starlette endpoint streaming the events — cancels the turn with
cause ``user`` and returns once it is quiescent (its worker killed and reaped when it had to be).
A block that reads to the end changes nothing: the turn completes and its result is at hand. For
``Supervisor``, ``Client`` and the blocking twins.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

from supervisor import Supervisor, SyncClient, SyncSupervisor
from tests.support.backends import backend, gone
from tests.support.daemonkit import FAST, ROOT, serving

pytestmark = pytest.mark.anyio

BOUND = 60.0


@pytest.mark.parametrize("kind", ["supervisor", "client"])
async def test_a_stream_read_to_the_end_completes_with_its_result(kind: str) -> None:
    """Every event in order, then the block ends normally: the turn completed, not cancelled."""
    async with backend(kind) as b:
        with anyio.fail_after(BOUND):
            async with b.stream("examples.agents:streamer", {"count": 4}) as events:
                seen = [event["i"] async for event in events]
            result = await events.result()
    assert seen == [0, 1, 2, 3]
    assert (result.outcome, result.cause, result.output) == ("completed", None, {"events": 4}), result


@pytest.mark.parametrize("kind", ["supervisor", "client"])
async def test_leaving_the_block_early_cancels_the_turn_and_waits_for_it(kind: str) -> None:
    """``break`` after the first event of a stubborn agent (never awaits: only the ladder stops
    it): by the time the block has exited the turn ended ``killed`` with cause ``user`` and, for
    the embedded pool, its worker is gone."""
    async with backend(kind) as b:
        with anyio.fail_after(BOUND):
            async with b.stream("examples.agents:stubborn", {"seconds": 120}) as events:
                async for event in events:
                    pid = int(event["pid"])
                    break
            if kind == "supervisor":
                assert gone(pid), "the block was left before the turn was quiescent"
            result = await events.result()
    assert (result.outcome, result.cause) == ("killed", {"kind": "user"}), result


@pytest.mark.parametrize("kind", ["supervisor", "client"])
async def test_an_exception_or_a_cancel_scope_in_the_block_cancels_the_turn(kind: str) -> None:
    """An exception raised in the block propagates unchanged after the turn ended ``aborted``
    (cause ``user``); a cancel scope around the block likewise."""
    async with backend(kind) as b:
        with pytest.raises(LookupError, match="the caller's own"):
            async with b.stream("examples.agents:slow", {"seconds": 120}) as first:
                async for _ in first:
                    raise LookupError("the caller's own error")
        with anyio.fail_after(BOUND):
            assert (await first.result()).outcome == "aborted"
        with anyio.move_on_after(0.5) as scope:
            async with b.stream("examples.agents:slow", {"seconds": 120}) as second:
                async for _ in second:
                    pass
        assert scope.cancelled_caught
        with anyio.fail_after(BOUND):
            result = await second.result()
    assert (result.outcome, result.cause) == ("aborted", {"kind": "user"}), result


async def test_a_native_task_cancel_of_the_streaming_task_cancels_the_turn() -> None:
    """``Task.cancel()`` of an asyncio task inside the block: the cancellation goes on once the
    turn has ended (cause ``user``)."""
    async with backend("supervisor") as sup:
        started = asyncio.Event()
        streams: list[Any] = []

        async def consume() -> None:
            async with sup.stream("examples.agents:slow", {"seconds": 120}) as events:
                streams.append(events)
                async for _ in events:
                    started.set()

        task = asyncio.ensure_future(consume())
        with anyio.fail_after(BOUND):
            await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        result = await streams[0].result()
    assert (result.outcome, result.cause) == ("aborted", {"kind": "user"}), result


@contextmanager
def sync_backend(kind: str) -> Iterator[Any]:
    if kind == "supervisor":
        with SyncSupervisor(workers=1, spares=0, grace=0.3, kill_after=0.3, agent_path=[ROOT]) as sup:
            yield sup
    else:
        with serving(*FAST) as d, SyncClient.connect(d.endpoint) as client:
            yield client


@pytest.mark.parametrize("kind", ["supervisor", "client"])
def test_the_blocking_twins_own_their_turn_too(kind: str) -> None:
    """``SyncSupervisor.stream`` / ``SyncClient.stream``: read to the end, it completes; left after
    one event, the turn ends ``aborted`` (cause ``user``) before the block returns."""
    with sync_backend(kind) as b:
        with b.stream("examples.agents:streamer", {"count": 3}) as events:
            assert [event["i"] for event in events] == [0, 1, 2]
        assert events.result().outcome == "completed"
        with b.stream("examples.agents:slow", {"seconds": 120}) as left:
            for _ in left:
                break
        result = b.handle(left.turn_id).result()
    assert (result.outcome, result.cause) == ("aborted", {"kind": "user"}), result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_http_client_that_goes_away_cancels_the_turn_it_streamed() -> None:
    """The service recipe (``examples/stream_service.py``): a Starlette endpoint streams a turn's
    events as server-sent events from ``sup.stream``; a real HTTP client reads one event and
    disconnects. The turn ends ``aborted`` with cause ``user`` and its worker runs the next turn."""
    import httpx
    import uvicorn

    from examples.stream_service import make_app

    async with Supervisor(workers=1, spares=0, grace=0.3, kill_after=0.3) as sup:
        app = make_app(sup, "examples.agents:slow")
        port = _free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            with anyio.fail_after(BOUND):
                while not server.started:  # noqa: ASYNC110 - uvicorn exposes no event for "listening"
                    await anyio.sleep(0.01)  # allowed: bounded poll of uvicorn's started flag
                async with (
                    httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
                    http.stream("POST", "/turns", json={"seconds": 120}) as response,
                ):
                    turn_id = response.headers["x-turn-id"]
                    async for line in response.aiter_lines():
                        if line.startswith("data:"):
                            assert json.loads(line[5:])["type"] == "started"
                            break
                result = await sup.handle(turn_id).result()
                again = await sup.run("examples.agents:echo", {"text": "next"})
            server.should_exit = True
    assert (result.outcome, result.cause) == ("aborted", {"kind": "user"}), result
    assert again.outcome == "completed"
