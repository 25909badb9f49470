"""The node supervisor: a Ray actor owning one embedded ``Supervisor`` on one node.

Every cancellation rule stays node-local: the actor is a thin batching shell over the engine,
which runs, escalates, kills and reaps exactly as it does embedded. What the actor adds is what
living inside a Ray worker needs (RAY-WORKER):

* Ray runs an async actor's ``__init__`` and every method on one long-lived event-loop thread
  ("AsyncIO Thread: default"). The engine is started on that thread, which lives as long as the
  actor process, so the workers' parent-death signal (tied to the forking thread) never fires
  early.
* Ray workers start with SIGINT blocked, and a spawned child inherits the spawning thread's
  mask: the mask of that thread is cleared before the first worker starts.
* The engine's private ipc endpoint lives under a short per-process directory
  (``sup-<pid>-…``), so several nodes on one host never share a socket and the path stays
  under the 107-byte ``sun_path`` limit.
* Ray starts its workers at nice 15 (its ``worker_niceness``), below its own daemons; the node
  supervisor is turnpool's daemon on the node (its timers are the grace and the kill, its reaps
  the quiescence before a result), so it goes back to the given niceness, 0 by default, before
  its workers start (RAY-PRIORITY).

Nothing here imports Ray: the router wraps this class with ``ray.remote`` when it starts one
per node, so the class can be read and type-checked without Ray installed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio

from wire import TurnResult

from .._engine.supervisor import Supervisor
from .._errors import TurnpoolError
from .._paths import IPC_PATH_MAX, IPC_SUFFIX_MAX, runtime_dir
from .batches import Request, decode_requests, encode_cancel_reply, encode_results
from .placement import new_turn_id
from .steps import NodeSteps

# Results and events travel in batches: a Ray call costs about a millisecond, a turn far less.
MAX_BATCH = 4096
# A batch of submissions or results is kept under Ray's inline limit (100 KiB,
# ``max_direct_call_object_size``) for no-op turns (≈ 60 bytes a request, ≈ 260 a result): a
# bigger object goes through the object stores, copied from the node's to the driver's.
SUBMIT_BATCH = 1024
RESULT_BATCH = 256
ACCEPT_CHUNK = 256  # turns of a submit batch accepted per dispatch pass

# RAY-CANCEL-REPLY: how long a cancel call waits for the turn's end before it replies without it
# (then the end comes on the results stream as any other). A cooperative cancel ends in well under a
# millisecond on the node; a stubborn turn's cancel returns after this instead of at once.
CANCEL_REPLY_WAIT = 0.05
# ... and how long after that reply the results stream is woken for the same end: Ray sends the
# reply from its own thread once the call's coroutine is done, so the stream's copy waits a moment
# rather than race it to the driver.
STREAM_AFTER_REPLY = 0.002

log = logging.getLogger("turnpool.ray")


def set_niceness(value: int) -> int:
    """Set every thread of this process to niceness ``value``; returns the calling thread's.

    RAY-PRIORITY: Linux keeps a niceness per thread, and a thread or process inherits its
    creator's, so each thread Ray made before us is set, and the threads and worker processes
    made from them afterwards start at ``value``. Lowering the niceness needs CAP_SYS_NICE (or
    RLIMIT_NICE): without it the node keeps Ray's and says so once (start Ray with
    ``RAY_worker_niceness=0`` there instead)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [threading.get_native_id()]
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, value)
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except PermissionError:
            log.warning(
                "node supervisor cannot set its niceness to %d (it has %d from Ray): its timers and "
                "reaps yield to every other process on a loaded node; give it CAP_SYS_NICE, or start "
                "Ray with RAY_worker_niceness=0",
                value,
                os.getpriority(os.PRIO_PROCESS, tid),
            )
            break
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _failure(exc: BaseException) -> tuple[bool, Any]:
    return (False, exc)


class NodeSupervisor:
    """One per node (the router starts it there with a hard node-affinity strategy).

    Methods return ``(True, value)`` or ``(False, exception)`` for the errors a ``Supervisor``
    raises at the call (bad input, unknown turn, full queue): the router re-raises them as they
    are, never wrapped in a Ray error. A Ray error on the router's side therefore always means
    the actor or its node is gone.
    """

    def __init__(self, node_id: str, key: str, options: dict[str, Any], niceness: int | None = None) -> None:
        self.node_id = node_id
        self.key = key
        self.options = dict(options)
        self.niceness = niceness
        self.sup: Supervisor | None = None
        self._outbox: list[TurnResult] = []
        # Turns whose cancel call waits for their end: their result wakes the stream only once
        # that reply is on its way, so the two Ray messages do not race for the same threads.
        self._replying: set[str] = set()
        self._wake = asyncio.Event()
        self._closed = False
        self._stop = asyncio.Event()
        self._main: asyncio.Future[None] | None = None
        self._steps = NodeSteps()  # RAY-STEP-RECORDS: step records go to the router, acknowledged from there

    async def start(self) -> dict[str, Any]:
        """Start the engine on this (the actor's event-loop) thread; returns who we are."""
        # RAY-WORKER: clear the signal mask Ray gave this thread (SIGINT blocked) before any
        # worker is spawned from it; children inherit it through posix_spawn.
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        # RAY-PRIORITY: back from Ray's worker niceness before any worker inherits it.
        nice = set_niceness(self.niceness) if self.niceness is not None else os.nice(0)
        base = runtime_dir()
        if len(str(base)) + IPC_SUFFIX_MAX > IPC_PATH_MAX:
            raise TurnpoolError(
                f"runtime directory {base} is too long for an ipc:// path on node {self.key}: "
                "set XDG_RUNTIME_DIR to a short directory on the nodes"
            )
        # The engine's task group must be entered and left in one task, and Ray runs each method
        # call as its own task: the engine lives in a task of its own, from start to close.
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._main = asyncio.ensure_future(self._own(ready))
        await ready
        return {
            "node_id": self.node_id,
            "key": self.key,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "niceness": nice,
        }

    async def _own(self, ready: asyncio.Future[None]) -> None:
        try:
            async with Supervisor(**self.options) as sup:
                sup.add_hooks(on_result=self._on_result)
                sup.steps.set_sink(self._steps)
                self.sup = sup
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise
        finally:
            self._closed = True
            self._wake.set()

    def _on_result(self, turn: Any, result: TurnResult) -> None:
        if turn.parent is None:  # a spawned child's result reaches its parent, not the router
            self._outbox.append(result)
            if turn.id not in self._replying:
                self._wake.set()

    def _sup(self) -> Supervisor:
        if self.sup is None:
            raise RuntimeError("node supervisor not started")
        return self.sup

    async def submit_batch(self, data: bytes) -> list[tuple[int, BaseException]]:
        """Accept turns in order (a session's turns keep the order they were sent in); ``data``
        is a msgpack batch of requests (``batches.encode_requests``). Returns the refusals only,
        as ``(index in the batch, exception)``: an empty list when every turn was accepted.

        Accepted in chunks with one dispatch pass each (``Supervisor.dispatch_once``): a batch of
        thousands walks the queue head once per chunk, not once per turn, and the first chunk's
        turns start while the rest are accepted."""
        sup = self._sup()
        requests = decode_requests(data)
        refused: list[tuple[int, BaseException]] = []
        # ADAPT-PROBE: the agent names this node does not know yet are probed (at once, each bounded)
        # before the batch is accepted, so that what no worker can run is refused with
        # InvalidAgent, as a submit is. The router sends a node's batches one after the other:
        # holding this one keeps their order.
        unknown = [a for a in dict.fromkeys(row[0] for row in requests) if a not in sup.agents_known]
        if unknown:
            async with anyio.create_task_group() as tg:
                for agent in unknown:
                    tg.start_soon(sup.learn_agent, agent)

        def accept(first: int, rows: list[Request]) -> None:
            for i, row in enumerate(rows, first):
                agent, raw, session, timeout, grace, kill_after, turn_id, retry, attempts, steps = row
                try:
                    if steps and turn_id:  # RAY-STEP-RECORDS: placed again after its node was lost
                        sup.steps.restore(turn_id, steps)
                    record = sup.accept_encoded(
                        agent,
                        raw,
                        session=session,
                        timeout=timeout,
                        grace=grace,
                        kill_after=kill_after,
                        turn_id=turn_id or new_turn_id(self.key),
                        retry=retry,
                        attempts=attempts,
                    )
                    if attempts > 1:
                        sup.steps.announce(record)
                except (TurnpoolError, TypeError, ValueError) as exc:
                    refused.append((i, exc))

        for first in range(0, len(requests), ACCEPT_CHUNK):
            rows = requests[first : first + ACCEPT_CHUNK]
            sup.dispatch_once([functools.partial(accept, first, rows)])
        return refused

    async def results(self) -> AsyncIterator[bytes]:
        """Every top-level turn's result, in msgpack batches (``batches.decode_results``), as
        turns end (one consumer: the router).

        Also the router's liveness channel: when this actor dies, the router's iteration raises."""
        while True:
            while not self._outbox:
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
            batch, self._outbox = self._outbox[:RESULT_BATCH], self._outbox[RESULT_BATCH:]
            yield encode_results(batch)

    async def steps(self) -> AsyncIterator[bytes]:
        """RAY-STEP-RECORDS: step records of this node's turns, in batches, as they come (one consumer: the
        router)."""
        async for batch in self._steps.stream(lambda: self._closed):
            yield batch

    async def steps_acked(self, batch: int) -> None:
        """RAY-STEP-RECORDS: the router holds step batch ``batch``: its records are durable."""
        self._steps.acked(batch)

    async def follow(self, turn_id: str) -> AsyncIterator[list[Any]]:
        """The turn's events in order, in batches of what is there; ends when the turn ends."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()

        async def pump() -> None:
            try:
                async for event in self._sup().events(turn_id):
                    queue.put_nowait(event)
            finally:
                queue.put_nowait(done)

        task = asyncio.ensure_future(pump())
        try:
            while True:
                batch = [await queue.get()]
                while not queue.empty() and len(batch) < MAX_BATCH:
                    batch.append(queue.get_nowait())
                last = batch[-1] is done
                if last:
                    batch.pop()
                if batch:
                    yield batch
                if last:
                    if task.done() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                    return
        finally:
            task.cancel()

    async def known(self, turn_id: str) -> bool:
        return self._sup().find(turn_id) is not None

    async def result(self, turn_id: str) -> tuple[bool, Any]:
        try:
            return (True, await self._sup().result(turn_id))
        except TurnpoolError as exc:
            return _failure(exc)

    async def cancel_until_end(self, turn_id: str, kind: str, wait: float) -> tuple[bool, Any]:
        """Cancel with cause ``{"kind": kind}``, then wait up to ``wait`` seconds (at most the
        turn's grace) for its end; returns ``(True, bytes)`` (``batches.decode_cancel_reply``: the
        winning cause and the result, or ``None`` if it did not end in time).

        RAY-CANCEL-REPLY: a cooperative cancel's end then reaches the router in this reply, one
        Ray call, not in a second one on the results stream (where it goes too: the router
        settles the turn from whichever arrives first and drops the other). Arguments and reply
        are plain strings, numbers and bytes, which Ray sends without its pickler."""
        sup = self._sup()
        try:
            winner = await sup.cancel(turn_id, {"kind": kind})
        except (TurnpoolError, TypeError, ValueError) as exc:
            return _failure(exc)
        record = sup.find(turn_id)
        result: TurnResult | None = None
        if record is not None and record.parent is None:
            if record.result is not None:
                result = record.result
            elif wait > 0:
                self._replying.add(turn_id)
                try:
                    with anyio.move_on_after(min(wait, record.grace)):
                        result = await sup.result(turn_id)
                finally:
                    self._replying.discard(turn_id)
                    if self._outbox:  # once this reply is on its way
                        asyncio.get_running_loop().call_later(STREAM_AFTER_REPLY, self._wake.set)
        return (True, encode_cancel_reply(winner, result))

    async def cancel_session(self, session: str, cause: Any) -> tuple[bool, Any]:
        try:
            return (True, await self._sup().cancel_session(session, cause))
        except (TurnpoolError, TypeError, ValueError) as exc:
            return _failure(exc)

    async def run(self, agent: str, input: Any = None, **kwargs: Any) -> TurnResult:
        """``submit`` + ``result`` for Ray-native callers holding the ref.

        ``ray.cancel`` of the ref cancels this coroutine; the engine's ``run`` then cancels the
        turn (cause ``user``) and waits for its quiescence before the cancellation completes
        (RAY-RUN-CANCEL)."""
        if kwargs.get("turn_id") is None:
            kwargs["turn_id"] = new_turn_id(self.key)
        sup = self._sup()
        handle = await sup.submit(agent, input, **kwargs)
        try:
            return await sup.result(handle.turn_id)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await sup.cancel(handle.turn_id)
                await sup.result(handle.turn_id)
            raise

    async def status(self) -> dict[str, Any]:
        status = await self._sup().status()
        status["node_id"] = self.node_id
        status["key"] = self.key
        return status

    async def when_idle(self) -> None:
        await self._sup().when_idle()

    async def close(self) -> None:
        """Dispose the engine (every turn ends, cause ``disposed``; every worker tree reaped),
        then end the results stream once the last result is in it."""
        self._stop.set()
        if self._main is not None:
            await asyncio.shield(self._main)
        self._closed = True
        self._wake.set()
