"""``RaySupervisor``: the driver-side router over one ``NodeSupervisor`` actor per Ray node.

It implements the ``Backend`` contract (submit, run, handle, events, cancel, cancel_session,
status, when_idle), so ``TurnHandle``, the batch runner and every other front end run on a
cluster unchanged. Ray supplies placement, discovery, membership and failure signals; turnpool
does no clustering of its own, and every cancellation rule stays inside a node's engine.

The router's own state is small: for each turn it has sent, which node holds it (until its
result arrives), and for each session with turns in flight, the node it is pinned to.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import wire
from wire import Cause, TurnError, TurnResult, validate_cause

from .._engine.options import check_agent, check_optional_str, check_seconds
from .._errors import SupervisorClosed, UnknownTurn, WorkerStartError
from .._handle import TurnHandle
from .node import MAX_BATCH, NodeSupervisor
from .placement import new_turn_id, node_key, node_of, rendezvous

log = logging.getLogger("turnpool.ray")

NAMESPACE = "turnpool"
NODE_LOST = "NodeLost"  # the error type of a turn whose node was lost (outcome ``crashed``)
FAILED_RETRY = 10.0  # seconds before a node whose supervisor did not start is tried again


@dataclass(eq=False)
class _Node:
    key: str
    node_id: str
    actor: Any
    workers: int
    state: str = "live"  # live → lost | closed
    pid: int | None = None
    held: dict[str, _Turn] = field(default_factory=dict)  # sent (or being sent), not ended
    pending: list[_Turn] = field(default_factory=list)  # waiting for the next batch
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    status: dict[str, Any] | None = None


@dataclass(eq=False)
class _Turn:
    turn_id: str
    request: dict[str, Any]
    seq: int
    session: str | None
    retry: bool
    node: _Node | None = None
    attempts: int = 1
    # asyncio's own events (Ray's refs are awaited on asyncio anyway): two per turn, made cheaply.
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    ack_error: BaseException | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: TurnResult | None = None
    submitted_at: float = field(default_factory=time.time)
    resent: bool = False  # placed again after its node was lost


class RaySupervisor:
    """Runs turns on every node of a Ray cluster, with turnpool's contract on each node.

    ``async with RaySupervisor(address="auto", workers_per_node=4, grace=5) as sup:`` connects
    to the cluster (``ray.init(address)``, unless this process is already connected), starts a
    node supervisor on every live node and on each node that joins later, and routes turns:

    * a turn without a session goes to the least loaded node; its id names that node;
    * a caller's ``turn_id`` goes where rendezvous hashing of the id says, so a repeated submit
      reaches the same node, which runs it once;
    * a session's turns go to one node (rendezvous hashing of its name over the live nodes),
      and stay there while any of them is in flight, so they run one at a time, in order,
      while nodes join.

    ``workers_per_node`` (default: the node's CPU count) workers per node; that many of the
    node's CPUs (at most what it has) are reserved for its node supervisor as Ray resources, so
    Ray does not schedule other work onto them. ``grace``, ``kill_after``, ``spares`` and
    ``agent_path`` are as for ``Supervisor`` on every node; ``supervisor_options`` passes any
    other ``Supervisor`` keyword. Agents must be importable on every node.

    When a node or its node supervisor is lost (Ray reports the actor dead, or unreachable for
    longer than ``node_loss_timeout`` seconds, or the node dead), every turn it held ends once,
    ``crashed`` with error type ``NodeLost``; a turn submitted with ``retry=True`` is submitted
    again on another node instead, with ``attempts`` one higher.
    """

    def __init__(
        self,
        address: str | None = "auto",
        *,
        workers_per_node: int | None = None,
        grace: float = 5.0,
        kill_after: float = 2.0,
        spares: int = 1,
        agent_path: Any = None,
        namespace: str = NAMESPACE,
        node_loss_timeout: float = 10.0,
        membership_interval: float = 1.0,
        start_timeout: float = 60.0,
        reserve_cpus: bool = True,
        supervisor_options: dict[str, Any] | None = None,
        keep_results: int = 10_000,
    ) -> None:
        if address is not None and (not isinstance(address, str) or not address):
            raise TypeError(f"address must be 'auto', a Ray address string or None, got {address!r}")
        if workers_per_node is not None and (
            isinstance(workers_per_node, bool)
            or not isinstance(workers_per_node, int)
            or workers_per_node < 1
        ):
            raise ValueError(f"workers_per_node must be a positive int or None, got {workers_per_node!r}")
        if not isinstance(namespace, str) or not namespace:
            raise TypeError(f"namespace must be a non-empty string, got {namespace!r}")
        for name, value in (
            ("node_loss_timeout", node_loss_timeout),
            ("membership_interval", membership_interval),
            ("start_timeout", start_timeout),
        ):
            check_seconds(name, value, positive=True)
        if isinstance(keep_results, bool) or not isinstance(keep_results, int) or keep_results < 1:
            raise ValueError(f"keep_results must be a positive int, got {keep_results!r}")
        self.address = address
        self.workers_per_node = workers_per_node
        self.namespace = namespace
        self.node_loss_timeout = float(node_loss_timeout)
        self.membership_interval = float(membership_interval)
        self.start_timeout = float(start_timeout)
        self.reserve_cpus = bool(reserve_cpus)
        self.keep_results = keep_results
        options = dict(supervisor_options or {})
        options.update(grace=grace, kill_after=kill_after, spares=spares, agent_path=agent_path)
        # Validate every engine option here, at the call, not on the nodes (R-ray-boundary).
        from .._engine import Supervisor

        Supervisor(workers=1, **options)
        self._options = options
        self._id = secrets.token_hex(4)  # names this router's actors: two routers never share one
        self._nodes: dict[str, _Node] = {}  # by node key
        # Node ids whose supervisor could not start, and when: tried again after FAILED_RETRY
        # seconds (a node still starting its Ray workers under load is not lost for good).
        self._failed: dict[str, float] = {}
        self._turns: dict[str, _Turn] = {}
        self._finished: collections.OrderedDict[str, _Turn] = collections.OrderedDict()
        self._pins: dict[str, tuple[_Node, int]] = {}  # session -> (node, turns in flight)
        self._seq = itertools.count()
        self._starts = itertools.count()
        self._changed: asyncio.Event | None = None  # made only while someone waits for a change
        self._open = 0  # turns accepted by this router and not ended
        self._state = "new"
        self._inited_ray = False
        self._tg: anyio.abc.TaskGroup | None = None
        self._actor_cls: Any = None
        self.nodes_lost = 0

    # ---- life ------------------------------------------------------------------------

    async def __aenter__(self) -> RaySupervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Connect to Ray, start a node supervisor on every live node, follow membership."""
        if self._state != "new":
            raise RuntimeError("a RaySupervisor can be started once")
        self._state = "running"
        if not ray.is_initialized():
            await anyio.to_thread.run_sync(self._init_ray)
            self._inited_ray = True
        self._actor_cls = ray.remote(NodeSupervisor)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self._sync_membership()
            if not self._live():
                raise WorkerStartError("no node supervisor could be started on the Ray cluster")
            self._tg.start_soon(self._membership_loop)
        except BaseException:
            await self.aclose()
            raise

    def _init_ray(self) -> None:
        ray.init(address=self.address, namespace=self.namespace, log_to_driver=False)

    async def aclose(self) -> None:
        """Dispose every node's engine (each turn ends, cause ``disposed``, every tree reaped),
        stop the node supervisors, and disconnect from Ray if this router connected."""
        if self._state in ("closing", "closed"):
            while self._state != "closed":
                await self._wait_change()
            return
        if self._state == "new":
            self._state = "closed"
            return
        self._state = "closing"
        with anyio.CancelScope(shield=True):
            live = self._live()
            async with anyio.create_task_group() as tg:
                for node in live:
                    tg.start_soon(self._close_node, node)
            for turn in list(self._turns.values()):  # a node that could not close: nothing ran on
                if not turn.done.is_set():
                    self._finish(turn, self._lost_result(turn, "the router closed"))
        # Left outside the shield: a task group is exited from the scope it was entered in.
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(None, None, None)
        finally:
            with anyio.CancelScope(shield=True):
                for node in self._nodes.values():
                    await anyio.to_thread.run_sync(_kill_actor, node.actor)
                if self._inited_ray:
                    await anyio.to_thread.run_sync(ray.shutdown)
            self._state = "closed"
        self._notify()

    async def _close_node(self, node: _Node) -> None:
        try:
            with anyio.fail_after(
                self._options.get("stop_timeout", 5.0) + 2 * _max_ladder(self._options) + 30
            ):
                await node.actor.close.remote()
            with anyio.move_on_after(10):  # the stream ends once the last result is in it
                while node.held and node.state == "live":
                    await self._wait_change()
        except (ray.exceptions.RayError, TimeoutError) as exc:
            log.warning("node %s did not close: %s", node.key, exc)
        node.state = "closed"

    def _check_open(self) -> None:
        if self._state != "running":
            raise SupervisorClosed("the RaySupervisor is not running")

    # ---- membership --------------------------------------------------------------------

    def _live(self) -> list[_Node]:
        return [n for n in self._nodes.values() if n.state == "live"]

    async def _membership_loop(self) -> None:
        while True:
            await anyio.sleep(self.membership_interval)  # polling GCS: Ray has no join callback here
            try:
                await self._sync_membership()
            except ray.exceptions.RayError as exc:  # GCS unreachable for a while: try again next time
                log.warning("could not read the Ray cluster's membership: %s", exc)

    async def _sync_membership(self) -> None:
        nodes = await anyio.to_thread.run_sync(ray.nodes)
        alive = {n["NodeID"]: n for n in nodes if n.get("Alive")}
        for node in self._live():
            if node.node_id not in alive:
                await self._lose(node, "Ray reports the node dead")
        starting = [
            info
            for nid, info in alive.items()
            if node_key(nid) not in self._nodes
            and time.monotonic() - self._failed.get(nid, -FAILED_RETRY) >= FAILED_RETRY
        ]
        if starting:
            async with anyio.create_task_group() as tg:
                for info in starting:
                    tg.start_soon(self._start_node, info)
        for node in self._live():
            try:
                with anyio.fail_after(max(self.membership_interval, 1.0) * 5):
                    node.status = await node.actor.status.remote()
            except (ray.exceptions.RayError, TimeoutError):
                pass  # the results stream decides whether the node is lost

    async def _start_node(self, info: dict[str, Any]) -> None:
        node_id: str = info["NodeID"]
        key = node_key(node_id)
        cpus = int(info.get("Resources", {}).get("CPU", 0))
        workers = self.workers_per_node or max(cpus, 1)
        # R-ray-node: one node supervisor per node, pinned to it, its workers' CPUs reserved.
        actor = self._actor_cls.options(
            name=f"node-{key}-{self._id}-{next(self._starts)}",  # a retry never meets a dying name
            namespace=self.namespace,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            num_cpus=min(workers, cpus) if self.reserve_cpus else 0,
            max_concurrency=100_000,
            max_restarts=0,
        ).remote(node_id, key, dict(self._options, workers=workers))
        try:
            with anyio.fail_after(self.start_timeout):
                started = await actor.start.remote()
        except (ray.exceptions.RayError, TimeoutError) as exc:
            log.warning("no node supervisor on node %s: %s", key, exc)
            self._failed[node_id] = time.monotonic()
            await anyio.to_thread.run_sync(_kill_actor, actor)
            return
        if self._state != "running":
            await anyio.to_thread.run_sync(_kill_actor, actor)
            return
        node = _Node(key=key, node_id=node_id, actor=actor, workers=workers, pid=started["pid"])
        self._nodes[key] = node
        assert self._tg is not None
        self._tg.start_soon(self._results_stream, node)
        self._tg.start_soon(self._flusher, node)
        log.info("node supervisor up on node %s (pid %s, %d workers)", key, node.pid, workers)
        self._notify()

    # ---- the two streams per node ----------------------------------------------------------

    async def _flusher(self, node: _Node) -> None:
        """Sends a node's submissions in batches, one batch in flight at a time (order kept)."""
        while node.state == "live":
            if not node.pending:
                await node.wake.wait()
                node.wake.clear()
                continue
            # R-ray-streams: one submit_batch call per node per flush, not one Ray call per turn.
            batch, node.pending = node.pending[:MAX_BATCH], node.pending[MAX_BATCH:]
            try:
                acks = await node.actor.submit_batch.remote([t.request for t in batch])
            except ray.exceptions.RayError as exc:
                # Sent, never acknowledged: they are held by a node that is gone, like any other.
                for turn in batch:
                    turn.acked.set()
                await self._lose(node, f"submit failed: {type(exc).__name__}")
                return
            for turn, (ok, value) in zip(batch, acks, strict=True):
                if not ok and turn.resent:
                    # Its caller has a handle already: the turn ends, truthfully, here.
                    message = f"sent again after its node was lost, refused: {type(value).__name__}: {value}"
                    self._finish(turn, self._lost_result(turn, message))
                elif not ok:
                    turn.ack_error = value
                    self._drop(turn)
                turn.acked.set()

    async def _results_stream(self, node: _Node) -> None:
        """Follows a node's results; its failure is how the router learns the node is lost."""
        unavailable_since: float | None = None
        while node.state == "live":
            try:
                async for ref in node.actor.results.remote():
                    batch = await ref
                    unavailable_since = None
                    for result in batch:
                        self._on_result(node, result)
                if self._state != "running":
                    return  # closed: the stream ended after the last result
                reason = "the node supervisor stopped"
            except ray.exceptions.ActorUnavailableError as exc:
                # R-ray-loss: unreachable (restarting, partitioned) is not yet lost; after
                # node_loss_timeout it is, and the actor is killed so nothing runs twice.
                now = time.monotonic()
                unavailable_since = unavailable_since or now
                if now - unavailable_since < self.node_loss_timeout:
                    await anyio.sleep(min(0.5, self.node_loss_timeout / 4))  # retry back-off
                    continue
                reason = f"unreachable for {self.node_loss_timeout:g}s ({type(exc).__name__})"
            except ray.exceptions.RayError as exc:
                reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            await self._lose(node, reason)
            return

    def _on_result(self, node: _Node, result: TurnResult) -> None:
        turn = self._turns.get(result.turn_id)
        if turn is None or turn.node is not node or turn.done.is_set():
            return  # not ours (a Ray-native run), or already ended (node declared lost)
        if turn.attempts != result.attempts:
            result = msgspec.structs.replace(result, attempts=turn.attempts)
        self._finish(turn, result)

    # ---- node loss -------------------------------------------------------------------------

    async def _lose(self, node: _Node, reason: str) -> None:
        """R-ray-loss: every turn the node held ends exactly once, ``crashed``/``NodeLost``, or
        with ``retry`` is submitted again on another node with ``attempts + 1``."""
        if node.state != "live":
            return
        node.state = "lost"
        self.nodes_lost += 1
        log.warning("turnpool node %s lost: %s; %d turn(s) held", node.key, reason, len(node.held))
        node.wake.set()
        for session, (pinned, _) in list(self._pins.items()):
            if pinned is node:
                del self._pins[session]
        # Fence: a node that is only unreachable must never finish a turn that runs again elsewhere.
        await anyio.to_thread.run_sync(_kill_actor, node.actor)
        unsent = [t for t in node.pending if not t.done.is_set()]
        node.pending = []
        held = sorted((t for t in node.held.values() if t not in unsent), key=lambda t: t.seq)
        node.held.clear()
        for turn in held:
            if turn.done.is_set():
                continue
            if turn.retry and self._state == "running" and self._live():
                turn.attempts += 1
                turn.acked.set()
                self._place(turn, resend=True)
            else:
                turn.acked.set()
                self._finish(turn, self._lost_result(turn, f"node {node.key} was lost: {reason}"))
        for turn in sorted(unsent, key=lambda t: t.seq):  # never reached the node: just send elsewhere
            if self._state == "running" and self._live():
                self._place(turn, resend=True)
            else:
                turn.acked.set()
                self._finish(turn, self._lost_result(turn, f"node {node.key} was lost: {reason}"))
        self._notify()

    def _lost_result(self, turn: _Turn, message: str) -> TurnResult:
        return TurnResult(
            turn_id=turn.turn_id,
            outcome="crashed",
            error=TurnError(NODE_LOST, message),
            session=turn.session,
            agent=turn.request["agent"],
            attempts=turn.attempts,
            submitted_at=turn.submitted_at,
            ended_at=time.time(),
        )

    # ---- placement ----------------------------------------------------------------------

    def _choose(self, turn: _Turn) -> _Node:
        live = self._live()
        if not live:
            raise SupervisorClosed("no live turnpool node on the Ray cluster")
        by_key = {n.key: n for n in live}
        if turn.session is not None:
            pin = self._pins.get(turn.session)
            if pin is not None and pin[0].state == "live":
                return pin[0]
            return by_key[rendezvous(turn.session, by_key)]
        named = node_of(turn.turn_id)
        if named is not None and named in by_key and turn.attempts == 1:
            return by_key[named]
        if turn.request.get("turn_id") is not None and turn.attempts == 1:
            return by_key[rendezvous(turn.turn_id, by_key)]
        return min(live, key=lambda n: (len(n.held) + len(n.pending)) / n.workers)

    def _place(self, turn: _Turn, *, resend: bool = False, node: _Node | None = None) -> None:
        if node is None:
            node = self._choose(turn)
        turn.node = node
        if turn.session is not None:
            pinned, count = self._pins.get(turn.session, (node, 0))
            self._pins[turn.session] = (node, count + 1)
        if resend:
            turn.resent = True
            # A retried turn keeps its id, so its handle keeps working; a router-made id then names
            # the node that lost it, and lookups go through this router's table.
            turn.request = dict(turn.request, turn_id=turn.turn_id)
        node.held[turn.turn_id] = turn
        node.pending.append(turn)
        node.wake.set()

    def _drop(self, turn: _Turn) -> None:
        """A submit the node refused: forget it (the caller gets the error)."""
        if turn.node is not None:
            turn.node.held.pop(turn.turn_id, None)
        if self._turns.get(turn.turn_id) is turn:
            del self._turns[turn.turn_id]
            self._open -= 1
        turn.done.set()  # never ran; its submit raised
        self._unpin(turn)

    def _unpin(self, turn: _Turn) -> None:
        if turn.session is None:
            return
        pin = self._pins.get(turn.session)
        if pin is not None and pin[0] is turn.node:
            if pin[1] <= 1:
                del self._pins[turn.session]
            else:
                self._pins[turn.session] = (pin[0], pin[1] - 1)

    def _finish(self, turn: _Turn, result: TurnResult) -> None:
        if turn.done.is_set():
            return
        turn.result = result
        self._open -= 1
        if turn.node is not None:
            turn.node.held.pop(turn.turn_id, None)
        self._unpin(turn)
        turn.done.set()
        self._finished[turn.turn_id] = turn
        while len(self._finished) > self.keep_results:
            old_id, old = self._finished.popitem(last=False)
            if self._turns.get(old_id) is old:
                del self._turns[old_id]
        self._notify()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _wait_change(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    # ---- the Backend contract ---------------------------------------------------------------

    async def submit(
        self,
        agent: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the turn's timeout, not this call's
        grace: float | None = None,
        kill_after: float | None = None,
        turn_id: str | None = None,
        retry: bool = False,
    ) -> TurnHandle:
        """Accept a turn on a node and return its handle once that node acknowledged it.

        Raises as ``Supervisor.submit`` does (checked here first, then by the node)."""
        self._check_open()
        check_agent(agent)
        wire.encode_payload(input, what="turn input")  # TypeError at the call, before any Ray call
        session = check_optional_str("session", session)
        turn_id = check_optional_str("turn_id", turn_id)
        for name, value in (("timeout", timeout), ("grace", grace), ("kill_after", kill_after)):
            check_seconds(name, value)
        if not isinstance(retry, bool):
            raise TypeError(f"retry must be True or False, got {retry!r}")
        request = {
            "agent": agent,
            "input": input,
            "session": session,
            "timeout": timeout,
            "grace": grace,
            "kill_after": kill_after,
            "turn_id": turn_id,
            "retry": retry,
        }
        existing = self._turns.get(turn_id) if turn_id is not None else None
        if existing is not None:
            # R-ray-ids: the same id goes to the node that has it; that node's engine runs it once
            # (or refuses the same id with another request). Sent on its own: no order to keep.
            await existing.acked.wait()
            node = existing.node
            if node is not None and node.state == "live":
                try:
                    ((ok, value),) = await node.actor.submit_batch.remote([request])
                except ray.exceptions.RayError:
                    ok, value = True, None  # the node is gone: the existing turn ends through the router
                if not ok and isinstance(value, BaseException):
                    raise value
            return TurnHandle(self, existing.turn_id)
        turn = _Turn(
            turn_id=turn_id or "", request=request, seq=next(self._seq), session=session, retry=retry
        )
        node = self._choose(turn)
        if turn_id is None:
            turn.turn_id = request["turn_id"] = new_turn_id(node.key)
        self._turns[turn.turn_id] = turn
        self._open += 1
        self._place(turn, node=node)
        await turn.acked.wait()
        if turn.ack_error is not None:
            raise turn.ack_error
        return TurnHandle(self, turn.turn_id)

    async def run(self, agent: str, input: Any = None, **kwargs: Any) -> TurnResult:
        """``submit`` then ``result``; cancelling the caller cancels the turn (cause ``user``)
        and waits for its truthful end (R-ray-run-cancel)."""
        handle = await self.submit(agent, input, **kwargs)
        try:
            return await self.result(handle.turn_id)
        except BaseException:
            with anyio.CancelScope(shield=True):
                turn = self._turns.get(handle.turn_id)
                if turn is not None and not turn.done.is_set():
                    await self.cancel(handle.turn_id)
                    await turn.done.wait()
            raise

    def run_ref(self, agent: str, input: Any = None, **kwargs: Any) -> Any:
        """A Ray ``ObjectRef`` to the ``TurnResult`` of a turn run on a node, for Ray-native code.

        ``ray.cancel(ref)`` cancels the turn with cause ``user`` on its node, which waits for the
        turn's truthful end (R-ray-run-cancel). The turn goes to the least loaded node (or its
        session's node) and is not tracked by this router."""
        self._check_open()
        check_agent(agent)
        session, turn_id = kwargs.get("session"), kwargs.get("turn_id")
        request = {"agent": agent, "turn_id": turn_id}  # a caller's id goes where its hash says
        turn = _Turn(turn_id=turn_id or "", request=request, seq=0, session=session, retry=False)
        return self._choose(turn).actor.run.remote(agent, input, **kwargs)

    def handle(self, turn_id: str) -> TurnHandle:
        """A handle on a turn this router sent or a router-made id naming a live node; raises
        ``UnknownTurn`` otherwise."""
        if turn_id in self._turns or self._owner(turn_id) is not None:
            return TurnHandle(self, turn_id)
        raise UnknownTurn(turn_id)

    def _owner(self, turn_id: str) -> _Node | None:
        turn = self._turns.get(turn_id)
        if turn is not None:
            return turn.node
        key = node_of(turn_id)
        if key is None:
            live = {n.key: n for n in self._live()}
            return live[rendezvous(turn_id, live)] if live else None
        node = self._nodes.get(key)
        return node if node is not None and node.state == "live" else None

    async def result(self, turn_id: str) -> TurnResult:
        """Wait for the turn's one outcome; raises ``UnknownTurn``."""
        turn = self._turns.get(turn_id)
        if turn is not None:
            await turn.done.wait()
            assert turn.result is not None
            return turn.result
        node = self._owner(turn_id)
        if node is None:
            raise UnknownTurn(turn_id)
        try:
            ok, value = await node.actor.result.remote(turn_id)
        except ray.exceptions.RayError:
            raise UnknownTurn(turn_id) from None
        if not ok:
            raise value
        result: TurnResult = value
        return result

    async def events(self, turn_id: str) -> AsyncIterator[Any]:
        """The turn's events, in order, streamed from its node in batches. A turn retried on
        another node is followed there (its events from that attempt's start). Ends when the
        turn ends, or when its node is lost."""
        followed: _Node | None = None
        while True:
            turn = self._turns.get(turn_id)
            if turn is not None:
                await turn.acked.wait()
            node = self._owner(turn_id)
            if node is None or node is followed or node.state != "live":
                if node is None and turn is None:
                    raise UnknownTurn(turn_id)
                return
            followed = node
            try:
                async for ref in node.actor.follow.remote(turn_id):
                    for event in await ref:
                        yield event
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause
                if isinstance(cause, BaseException):
                    raise cause from None
                raise
            except ray.exceptions.RayError:
                pass  # the node is gone: the turn ends (or runs again) through the router
            turn = self._turns.get(turn_id)
            if turn is None:
                return
            await self._settled(turn, node)
            if turn.done.is_set():
                return

    async def _settled(self, turn: _Turn, node: _Node) -> None:
        """Wait until the turn's end arrived, or it moved to another node."""
        while not turn.done.is_set() and turn.node is node:
            await self._wait_change()

    async def cancel(self, turn_id: str, cause: Any = None) -> Cause | None:
        """Cancel the turn on its node (default cause ``{"kind": "user"}``); returns the winning
        cause. Raises ``UnknownTurn``, ``TypeError``/``ValueError`` for a bad cause."""
        accepted = validate_cause(cause)
        turn = self._turns.get(turn_id)
        if turn is not None:
            await turn.acked.wait()
            if turn.done.is_set():
                assert turn.result is not None
                return turn.result.cause
        node = self._owner(turn_id)
        if node is None:
            raise UnknownTurn(turn_id)
        try:
            ok, value = await node.actor.cancel.remote(turn_id, accepted)
        except ray.exceptions.RayError:
            # The node is gone: the turn ends crashed/NodeLost (or runs again) through the router.
            return accepted
        if not ok:
            raise value
        winner: Cause | None = value
        return winner

    async def cancel_session(self, session: str, cause: Any = None) -> list[str]:
        """Cancel the running turn of ``session`` and clear its turns queued now, on the node
        the session is pinned to. Returns the ids cancelled."""
        accepted = validate_cause(cause)
        if not isinstance(session, str) or not session:
            raise TypeError(f"session must be a non-empty string, got {session!r}")
        self._check_open()
        # Turns of the session still on their way to the node are queued now too: let them arrive.
        for turn in list(self._turns.values()):
            if turn.session == session and not turn.acked.is_set():
                await turn.acked.wait()
        pin = self._pins.get(session)
        live = {n.key: n for n in self._live()}
        if pin is not None and pin[0].state == "live":
            node = pin[0]
        elif live:
            node = live[rendezvous(session, live)]
        else:
            return []
        try:
            ok, value = await node.actor.cancel_session.remote(session, accepted)
        except ray.exceptions.RayError:
            return []
        if not ok:
            raise value
        cancelled: list[str] = value
        return cancelled

    def status_now(self) -> dict[str, Any]:
        """Per-node pools (``nodes``: each node's ``Supervisor.status()`` as of the last membership
        poll, with its node id, key and state) and the totals across nodes, without asking the
        nodes (R-STATUS: ``status()`` is the awaitable that asks them first)."""
        nodes = []
        workers = []
        outcomes: collections.Counter[str] = collections.Counter()
        queue = running = 0
        for node in self._nodes.values():
            status = dict(node.status or {})
            status.update(node_id=node.node_id, key=node.key, state=node.state, held=len(node.held))
            nodes.append(status)
            if node.state != "live":
                continue
            for worker in status.get("workers", []):
                # The id names the node too: a status table of all workers shows whose pool each is.
                workers.append(dict(worker, node=node.key, id=f"{node.key}/{worker.get('id')}"))
            queue += status.get("queue", 0)
            running += status.get("running", 0)
            outcomes.update(status.get("outcomes", {}))
        return {
            "state": self._state,
            "nodes": nodes,
            "workers": workers,
            "queue": queue,
            "running": running,
            "outcomes": dict(outcomes),
            "nodes_lost": self.nodes_lost,
        }

    async def status(self) -> dict[str, Any]:
        """``status_now()`` after asking every live node now (the Backend contract: async)."""
        for node in self._live():
            try:
                node.status = await node.actor.status.remote()
            except ray.exceptions.RayError:
                pass
        return self.status_now()

    async def when_idle(self) -> None:
        """Return once every turn this router sent has ended and every live node is idle."""
        while self._open:
            await self._wait_change()
        for node in self._live():
            try:
                await node.actor.when_idle.remote()
            except ray.exceptions.RayError:
                pass

    # ---- for tests and tools ----------------------------------------------------------------

    def nodes(self) -> dict[str, dict[str, Any]]:
        """The node supervisors by node key: node id, actor, pid, state, turns held."""
        return {
            n.key: {
                "node_id": n.node_id,
                "actor": n.actor,
                "pid": n.pid,
                "state": n.state,
                "held": len(n.held),
            }
            for n in self._nodes.values()
        }

    def sent(self, turn_id: str) -> bool:
        """Whether this router sent (and still keeps) a turn with this id."""
        return turn_id in self._turns

    def node_of_turn(self, turn_id: str) -> str | None:
        """The key of the node that holds (or last held) a turn this router sent."""
        turn = self._turns.get(turn_id)
        return turn.node.key if turn is not None and turn.node is not None else node_of(turn_id)

    async def wait_nodes(self, count: int) -> None:
        """Wait until at least ``count`` node supervisors are live (nodes join asynchronously)."""
        while len(self._live()) < count:
            await self._wait_change()


def _kill_actor(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already dead, or Ray is gone: nothing of it to stop
        pass


def _max_ladder(options: dict[str, Any]) -> float:
    grace = options.get("max_grace", options.get("grace", 5.0)) or 0.0
    return float(grace) + float(options.get("kill_after", 2.0) or 0.0) if math.isfinite(grace) else 60.0
