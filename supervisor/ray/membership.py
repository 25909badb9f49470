"""Node membership and node loss: which node supervisors the router has, and what happens to the
turns of one that is lost.

``Membership`` follows Ray's node table: it starts one node supervisor on each live node (and on
each that joins later), keeps a ``NodeLink`` per node, and declares a node lost when Ray says it
is dead or its link fails. Loss handling ends or re-places every turn the node held, once.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .node import NodeSupervisor
from .node_link import NodeLink, kill_actor
from .placement import node_key
from .turn_table import Changes, RoutedTurn, TurnTable, lost_result

log = logging.getLogger("turnpool.ray")

FAILED_RETRY = 10.0  # seconds before a node whose supervisor did not start is tried again


class Membership:
    """The router's node supervisors by node key, started as nodes appear, lost as they go.

    ``place`` puts a turn of a lost node on another live node (the router's placement);
    ``running`` says whether the router still runs; ``spawn`` starts a task in the router's task
    group (each node's two streams live there)."""

    def __init__(
        self,
        *,
        router_id: str,
        namespace: str,
        options: dict[str, Any],
        workers_per_node: int | None,
        niceness: int | None,
        reserve_cpus: bool,
        start_timeout: float,
        membership_interval: float,
        node_loss_timeout: float,
        table: TurnTable,
        changes: Changes,
        place: Callable[[RoutedTurn], None],
        running: Callable[[], bool],
    ) -> None:
        self._router_id = router_id  # names this router's actors: two routers never share one
        self._namespace = namespace
        self._options = options
        self._workers_per_node = workers_per_node
        self._niceness = niceness
        self._reserve_cpus = reserve_cpus
        self._start_timeout = start_timeout
        self._interval = membership_interval
        self._loss_timeout = node_loss_timeout
        self._table = table
        self._changes = changes
        self._place = place
        self._running = running
        self.nodes: dict[str, NodeLink] = {}  # by node key
        self._live: list[NodeLink] | None = None  # see live()
        self._live_of = 0  # len(nodes) when _live was made
        # Node ids whose supervisor could not start, and when: tried again after FAILED_RETRY
        # seconds (a node still starting its Ray workers under load is not lost for good).
        self._failed: dict[str, float] = {}
        self._starts = itertools.count()
        self._actor_cls: Any = None
        self._tg: anyio.abc.TaskGroup | None = None
        self.nodes_lost = 0

    def live(self) -> list[NodeLink]:
        """The live node links (a list shared between calls: callers must not change it).

        Asked once per turn placed, so it is rebuilt only when a node came, or one it holds is no
        longer live, not made anew every time."""
        cached = self._live
        if cached is not None and self._live_of == len(self.nodes):
            for node in cached:
                if node.state != "live":
                    break
            else:
                return cached
        self._live = [n for n in self.nodes.values() if n.state == "live"]
        self._live_of = len(self.nodes)
        return self._live

    def live_by_key(self) -> dict[str, NodeLink]:
        return {n.key: n for n in self.live()}

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Start a node supervisor on every live node now; then follow joins and deaths in ``tg``."""
        self._actor_cls = ray.remote(NodeSupervisor)
        self._tg = tg
        await self.sync()
        if self.live():
            tg.start_soon(self._loop)

    async def _loop(self) -> None:
        while True:
            await anyio.sleep(self._interval)  # polling GCS: Ray has no join callback here
            try:
                await self.sync()
            except ray.exceptions.RayError as exc:  # GCS unreachable for a while: try again next time
                log.warning("could not read the Ray cluster's membership: %s", exc)

    async def sync(self) -> None:
        nodes = await anyio.to_thread.run_sync(ray.nodes)
        alive = {n["NodeID"]: n for n in nodes if n.get("Alive")}
        for node in self.live():
            if node.node_id not in alive:
                await self.lose(node, "Ray reports the node dead")
        starting = [
            info
            for nid, info in alive.items()
            if node_key(nid) not in self.nodes
            and time.monotonic() - self._failed.get(nid, -FAILED_RETRY) >= FAILED_RETRY
        ]
        if starting:
            async with anyio.create_task_group() as tg:
                for info in starting:
                    tg.start_soon(self._start_node, info)
        # No status poll here: a node's ``status()`` walks its workers' trees in /proc (≈ 9 ms,
        # blocking that node's loop: its turns' cancels and kills waited behind it once a second).
        # ``RaySupervisor.status()`` asks the nodes when a caller wants it; the results stream
        # decides whether a node is lost.

    async def _start_node(self, info: dict[str, Any]) -> None:
        node_id: str = info["NodeID"]
        key = node_key(node_id)
        cpus = int(info.get("Resources", {}).get("CPU", 0))
        workers = self._workers_per_node or max(cpus, 1)
        # RAY-NODE: one node supervisor per node, pinned to it, its workers' CPUs reserved.
        actor = self._actor_cls.options(
            name=f"node-{key}-{self._router_id}-{next(self._starts)}",  # a retry never meets a dying name
            namespace=self._namespace,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            num_cpus=min(workers, cpus) if self._reserve_cpus else 0,
            max_concurrency=100_000,
            max_restarts=0,
        ).remote(node_id, key, dict(self._options, workers=workers), self._niceness)
        try:
            with anyio.fail_after(self._start_timeout):
                started = await actor.start.remote()
        except (ray.exceptions.RayError, TimeoutError) as exc:
            log.warning("no node supervisor on node %s: %s", key, exc)
            self._failed[node_id] = time.monotonic()
            await anyio.to_thread.run_sync(kill_actor, actor)
            return
        if not self._running():
            await anyio.to_thread.run_sync(kill_actor, actor)
            return
        node = NodeLink(
            key=key,
            node_id=node_id,
            actor=actor,
            workers=workers,
            table=self._table,
            lose=self.lose,
            running=self._running,
            loss_timeout=self._loss_timeout,
            pid=started["pid"],
        )
        self.nodes[key] = node
        assert self._tg is not None
        self._tg.start_soon(node.results_stream)
        self._tg.start_soon(node.steps_stream)
        self._tg.start_soon(node.flusher)
        log.info("node supervisor up on node %s (pid %s, %d workers)", key, node.pid, workers)
        self._changes.notify()

    async def lose(self, node: NodeLink, reason: str) -> None:
        """RAY-LOSS: every turn the node held ends exactly once, ``crashed``/``NodeLost``, or
        with ``retry`` is submitted again on another node with ``attempts + 1``."""
        if node.state != "live":
            return
        node.state = "lost"
        self.nodes_lost += 1
        log.warning("turnpool node %s lost: %s; %d turn(s) held", node.key, reason, len(node.held))
        node.wake.set()
        self._table.unpin_node(node)
        # Fence: a node that is only unreachable must never finish a turn that runs again elsewhere.
        await anyio.to_thread.run_sync(kill_actor, node.actor)
        unsent = [t for t in node.pending if not t.done]
        node.pending = []
        held = sorted((t for t in node.held.values() if t not in unsent), key=lambda t: t.seq)
        node.held.clear()
        for turn in held:
            if turn.done:
                continue
            if turn.retry and self._running() and self.live():
                turn.attempts += 1
                turn.set_acked()
                self._place(turn)
            else:
                turn.set_acked()
                self._table.finish(turn, lost_result(turn, f"node {node.key} was lost: {reason}"))
        for turn in sorted(unsent, key=lambda t: t.seq):  # never reached the node: just send elsewhere
            if self._running() and self.live():
                self._place(turn)
            else:
                turn.set_acked()
                self._table.finish(turn, lost_result(turn, f"node {node.key} was lost: {reason}"))
        self._changes.notify()

    async def kill_all(self) -> None:
        """Kill every node supervisor this router started (the last step of closing)."""
        for node in self.nodes.values():
            await anyio.to_thread.run_sync(kill_actor, node.actor)
