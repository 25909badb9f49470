"""``RaySupervisor``: the driver-side router over one ``NodeSupervisor`` actor per Ray node.

It implements the ``Backend`` contract (submit, run, handle, events, cancel, cancel_session,
status, when_idle), so ``TurnHandle``, the batch runner and every other front end run on a
cluster unchanged. Ray supplies placement, discovery, membership and failure signals; turnpool
does no clustering of its own, and every cancellation rule stays inside a node's engine.

The router composes three objects, each with its own state:

* ``TurnTable`` (``turns``) — for each turn it has sent, which node holds it (until its result
  arrives), and for each session with turns in flight, the node it is pinned to;
* ``Membership`` (``membership``) — the node supervisors, started as nodes join, and what
  happens to a lost node's turns;
* ``NodeLink`` (``link``) — one node's submit and result streams.

What stays here is the public face and the placement policy: which node a turn goes to.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import math
import secrets
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import ray
import ray.exceptions

import wire
from wire import Cause, TurnResult, validate_cause

from .._checks import check_agent, check_optional_str, check_seconds
from .._errors import SupervisorClosed, UnknownTurn, WorkerStartError
from .._handle import TurnHandle
from .._many import ManyTurns
from .._stream import OwnedStreams
from .batches import decode_cancel_reply, encode_requests
from .membership import Membership
from .node import CANCEL_REPLY_WAIT
from .node_link import NodeLink
from .placement import new_turn_id, node_of, rendezvous
from .turn_table import NODE_LOST, Changes, RoutedTurn, TurnTable, lost_result

__all__ = ["NAMESPACE", "NODE_LOST", "RaySupervisor"]

log = logging.getLogger("turnpool.ray")

NAMESPACE = "turnpool"


class RaySupervisor(ManyTurns, OwnedStreams):
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

    ``node_niceness`` (default 0, the niceness Ray's own daemons run at) is set on each node
    supervisor and so on its workers, in place of the 15 Ray starts its workers at: the node
    supervisor keeps the grace and does the kill, and at 15 a loaded node starves both
    (RAY-PRIORITY). ``None`` keeps Ray's.

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
        node_niceness: int | None = 0,
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
        if node_niceness is not None and (
            isinstance(node_niceness, bool)
            or not isinstance(node_niceness, int)
            or not -20 <= node_niceness <= 19
        ):
            raise ValueError(f"node_niceness must be an int from -20 to 19 or None, got {node_niceness!r}")
        self.address = address
        self.workers_per_node = workers_per_node
        self.namespace = namespace
        self.node_loss_timeout = float(node_loss_timeout)
        self.membership_interval = float(membership_interval)
        self.start_timeout = float(start_timeout)
        self.reserve_cpus = bool(reserve_cpus)
        self.node_niceness = node_niceness
        self.keep_results = keep_results
        options = dict(supervisor_options or {})
        options.update(grace=grace, kill_after=kill_after, spares=spares, agent_path=agent_path)
        # Validate every engine option here, at the call, not on the nodes (RAY-BOUNDARY).
        from .._engine.supervisor import Supervisor

        Supervisor(workers=1, **options)
        self._options = options
        self._changes = Changes()
        self._table = TurnTable(keep_results, self._changes)
        self._members = Membership(
            router_id=secrets.token_hex(4),
            namespace=namespace,
            options=options,
            workers_per_node=workers_per_node,
            niceness=node_niceness,
            reserve_cpus=self.reserve_cpus,
            start_timeout=self.start_timeout,
            membership_interval=self.membership_interval,
            node_loss_timeout=self.node_loss_timeout,
            table=self._table,
            changes=self._changes,
            place=self._place_again,
            running=self._running,
        )
        self._seq = itertools.count()
        self._state = "new"
        self._inited_ray = False
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def nodes_lost(self) -> int:
        """How many node supervisors this router has declared lost."""
        return self._members.nodes_lost

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
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self._members.start(self._tg)
            if not self._members.live():
                raise WorkerStartError("no node supervisor could be started on the Ray cluster")
        except BaseException:
            await self.aclose()
            raise

    def _init_ray(self) -> None:
        ray.init(address=self.address, namespace=self.namespace, log_to_driver=False)

    def _running(self) -> bool:
        return self._state == "running"

    async def aclose(self) -> None:
        """Dispose every node's engine (each turn ends, cause ``disposed``, every tree reaped),
        stop the node supervisors, and disconnect from Ray if this router connected."""
        if self._state in ("closing", "closed"):
            while self._state != "closed":
                await self._changes.wait()
            return
        if self._state == "new":
            self._state = "closed"
            return
        self._state = "closing"
        with anyio.CancelScope(shield=True):
            live = self._members.live()
            async with anyio.create_task_group() as tg:
                for node in live:
                    tg.start_soon(self._close_node, node)
            for turn in list(self._table.turns.values()):  # a node that could not close: nothing ran on
                if not turn.done:
                    self._table.finish(turn, lost_result(turn, "the router closed"))
        # Left outside the shield: a task group is exited from the scope it was entered in.
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(None, None, None)
        finally:
            with anyio.CancelScope(shield=True):
                await self._members.kill_all()
                if self._inited_ray:
                    await anyio.to_thread.run_sync(ray.shutdown)
            self._state = "closed"
        self._changes.notify()

    async def _close_node(self, node: NodeLink) -> None:
        try:
            with anyio.fail_after(
                self._options.get("stop_timeout", 5.0) + 2 * _max_ladder(self._options) + 30
            ):
                await node.actor.close.remote()
            with anyio.move_on_after(10):  # the stream ends once the last result is in it
                while node.held and node.state == "live":
                    await self._changes.wait()
        except (ray.exceptions.RayError, TimeoutError) as exc:
            log.warning("node %s did not close: %s", node.key, exc)
        node.state = "closed"

    def _check_open(self) -> None:
        if self._state != "running":
            raise SupervisorClosed("the RaySupervisor is not running")

    # ---- placement ----------------------------------------------------------------------

    def _choose(self, turn: RoutedTurn) -> NodeLink:
        live = self._members.live()
        if not live:
            raise SupervisorClosed("no live turnpool node on the Ray cluster")
        if turn.session is not None:
            # RAY-SESSIONS: a session stays on its node while it has turns in flight.
            pinned = self._table.pinned(turn.session)
            if pinned is not None:
                return pinned
            by_key = {n.key: n for n in live}
            return by_key[rendezvous(turn.session, by_key)]
        if turn.turn_id and turn.attempts == 1:
            # RAY-IDS: a router-made id names its node; a caller's id goes where its hash says.
            by_key = {n.key: n for n in live}
            named = node_of(turn.turn_id)
            if named is not None and named in by_key:
                return by_key[named]
            if turn.id_given:
                return by_key[rendezvous(turn.turn_id, by_key)]
        return min(live, key=NodeLink.load)

    def _place(self, turn: RoutedTurn, *, resend: bool = False, node: NodeLink | None = None) -> None:
        if node is None:
            node = self._choose(turn)
        turn.node = node
        self._table.pin(turn, node)
        if resend:
            turn.resent = True
            # A retried turn keeps its id, so its handle keeps working; a router-made id then names
            # the node that lost it, and lookups go through this router's table.
        node.send(turn)

    def _place_again(self, turn: RoutedTurn) -> None:
        """A lost node's turn (retried, or never sent) goes to another live node."""
        self._place(turn, resend=True)

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
        # TypeError (LINK-EXACT too) or PayloadTooLarge at the call, before any Ray call; these bytes are
        # what the node's engine gets (RAY-BATCHES).
        raw = wire.encode_payload(input, what="turn input", exact=True)
        session = check_optional_str("session", session)
        turn_id = check_optional_str("turn_id", turn_id)
        for name, value in (("timeout", timeout), ("grace", grace), ("kill_after", kill_after)):
            check_seconds(name, value)
        if not isinstance(retry, bool):
            raise TypeError(f"retry must be True or False, got {retry!r}")
        turn = RoutedTurn(
            turn_id=turn_id or "",
            agent=agent,
            raw=raw,
            seq=next(self._seq),
            session=session,
            retry=retry,
            timeout=timeout,
            grace=grace,
            kill_after=kill_after,
            id_given=turn_id is not None,
        )
        existing = self._table.get(turn_id) if turn_id is not None else None
        if existing is not None:
            # RAY-IDS: the same id goes to the node that has it; that node's engine runs it once
            # (or refuses the same id with another request). Sent on its own: no order to keep.
            await existing.wait_acked()
            node = existing.node
            if node is not None and node.state == "live":
                try:
                    refused = await node.actor.submit_batch.remote(encode_requests([turn.row()]))
                except ray.exceptions.RayError:
                    refused = []  # the node is gone: the existing turn ends through the router
                if refused:
                    raise refused[0][1]
            return TurnHandle(self, existing.turn_id)
        node = self._choose(turn)
        if turn_id is None:
            turn.turn_id = new_turn_id(node.key)
        self._table.add(turn)
        self._place(turn, node=node)
        await turn.wait_acked()
        if turn.ack_error is not None:
            raise turn.ack_error
        return TurnHandle(self, turn.turn_id)

    async def run(self, agent: str, input: Any = None, **kwargs: Any) -> TurnResult:
        """``submit`` then ``result``; cancelling the caller cancels the turn (cause ``user``)
        and waits for its truthful end (RAY-RUN-CANCEL)."""
        handle = await self.submit(agent, input, **kwargs)
        try:
            return await self.result(handle.turn_id)
        except BaseException:
            with anyio.CancelScope(shield=True):
                turn = self._table.get(handle.turn_id)
                if turn is not None and not turn.done:
                    await self.cancel(handle.turn_id)
                    await turn.wait_done()
            raise

    def run_ref(self, agent: str, input: Any = None, **kwargs: Any) -> Any:
        """A Ray ``ObjectRef`` to the ``TurnResult`` of a turn run on a node, for Ray-native code.

        ``ray.cancel(ref)`` cancels the turn with cause ``user`` on its node, which waits for the
        turn's truthful end (RAY-RUN-CANCEL). The turn goes to the least loaded node (or its
        session's node) and is not tracked by this router."""
        self._check_open()
        check_agent(agent)
        session, turn_id = kwargs.get("session"), kwargs.get("turn_id")
        # A caller's id goes where its hash says.
        turn = RoutedTurn(
            turn_id=turn_id or "",
            agent=agent,
            raw=None,
            seq=0,
            session=session,
            retry=False,
            id_given=bool(turn_id),
        )
        return self._choose(turn).actor.run.remote(agent, input, **kwargs)

    def handle(self, turn_id: str) -> TurnHandle:
        """A handle on a turn this router sent or a router-made id naming a live node; raises
        ``UnknownTurn`` otherwise."""
        if turn_id in self._table or self._owner(turn_id) is not None:
            return TurnHandle(self, turn_id)
        raise UnknownTurn(turn_id)

    def _owner(self, turn_id: str) -> NodeLink | None:
        turn = self._table.get(turn_id)
        if turn is not None:
            return turn.node
        key = node_of(turn_id)
        if key is None:
            live = self._members.live_by_key()
            return live[rendezvous(turn_id, live)] if live else None
        node = self._members.nodes.get(key)
        return node if node is not None and node.state == "live" else None

    async def result(self, turn_id: str) -> TurnResult:
        """Wait for the turn's one outcome; raises ``UnknownTurn``."""
        turn = self._table.get(turn_id)
        if turn is not None:
            await turn.wait_done()
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
        followed: NodeLink | None = None
        while True:
            turn = self._table.get(turn_id)
            if turn is not None:
                await turn.wait_acked()
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
            turn = self._table.get(turn_id)
            if turn is None:
                return
            await self._settled(turn, node)
            if turn.done:
                return

    async def _settled(self, turn: RoutedTurn, node: NodeLink) -> None:
        """Wait until the turn's end arrived, or it moved to another node."""
        while not turn.done and turn.node is node:
            await self._changes.wait()

    async def cancel(self, turn_id: str, cause: Any = None) -> Cause | None:
        """Cancel the turn on its node (default cause ``{"kind": "user"}``); returns the winning
        cause. Raises ``UnknownTurn``, ``TypeError``/``ValueError`` for a bad cause."""
        accepted = validate_cause(cause)
        turn = self._table.get(turn_id)
        if turn is not None:
            await turn.wait_acked()
            if turn.done:
                assert turn.result is not None
                return turn.result.cause
        node = self._owner(turn_id)
        if node is None:
            raise UnknownTurn(turn_id)
        # RAY-CANCEL-REPLY: for a turn this router holds, the node waits (briefly) for the end
        # and sends it in this reply, so a cooperative cancel costs one Ray call, not two.
        wait = CANCEL_REPLY_WAIT if turn is not None else 0.0
        try:
            ok, value = await node.actor.cancel_until_end.remote(turn_id, accepted.kind, wait)
        except ray.exceptions.RayError:
            # The node is gone: the turn ends crashed/NodeLost (or runs again) through the router.
            return accepted
        if not ok:
            raise value
        winner, result = decode_cancel_reply(value)
        if result is not None:
            node.settle(result)  # once: the results stream's copy, before or after, is dropped
        return winner

    async def cancel_session(self, session: str, cause: Any = None) -> list[str]:
        """Cancel the running turn of ``session`` and clear its turns queued now, on the node
        the session is pinned to. Returns the ids cancelled."""
        accepted = validate_cause(cause)
        if not isinstance(session, str) or not session:
            raise TypeError(f"session must be a non-empty string, got {session!r}")
        self._check_open()
        # Turns of the session still on their way to the node are queued now too: let them arrive.
        for turn in list(self._table.turns.values()):
            if turn.session == session and not turn.acked:
                await turn.wait_acked()
        pinned = self._table.pinned(session)
        live = self._members.live_by_key()
        if pinned is not None:
            node = pinned
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
        nodes (API-ONE-CONTRACT: ``status()`` is the awaitable that asks them first)."""
        nodes = []
        workers: list[dict[str, Any]] = []
        outcomes: collections.Counter[str] = collections.Counter()
        queue = running = 0
        for node in self._members.nodes.values():
            status = dict(node.status or {})
            status.update(node_id=node.node_id, key=node.key, state=node.state, held=len(node.held))
            nodes.append(status)
            if node.state != "live":
                continue
            # The id names the node too: a status table of all workers shows whose pool each is.
            workers.extend(
                dict(worker, node=node.key, id=f"{node.key}/{worker.get('id')}")
                for worker in status.get("workers", [])
            )
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
        for node in self._members.live():
            with contextlib.suppress(ray.exceptions.RayError):
                node.status = await node.actor.status.remote()
        return self.status_now()

    async def when_idle(self) -> None:
        """Return once every turn this router sent has ended and every live node is idle."""
        while self._table.open:
            await self._changes.wait()
        for node in self._members.live():
            with contextlib.suppress(ray.exceptions.RayError):
                await node.actor.when_idle.remote()

    # ---- for tests and tools ----------------------------------------------------------------

    def nodes(self) -> dict[str, dict[str, Any]]:
        """The node supervisors by node key: node id, actor, pid, state, turns held, and
        ``late``: results that arrived for a turn already ended (RAY-CANCEL-REPLY)."""
        return {
            n.key: {
                "node_id": n.node_id,
                "actor": n.actor,
                "pid": n.pid,
                "state": n.state,
                "held": len(n.held),
                "late": n.late,
            }
            for n in self._members.nodes.values()
        }

    def result_now(self, turn_id: str) -> TurnResult | None:
        """The result of a turn this router sent, if it has arrived (``None`` if not yet)."""
        turn = self._table.get(turn_id)
        return turn.result if turn is not None and turn.done else None

    def sent(self, turn_id: str) -> bool:
        """Whether this router sent (and still keeps) a turn with this id."""
        return turn_id in self._table

    def node_of_turn(self, turn_id: str) -> str | None:
        """The key of the node that holds (or last held) a turn this router sent."""
        turn = self._table.get(turn_id)
        return turn.node.key if turn is not None and turn.node is not None else node_of(turn_id)

    async def wait_nodes(self, count: int) -> None:
        """Wait until at least ``count`` node supervisors are live (nodes join asynchronously)."""
        while len(self._members.live()) < count:
            await self._changes.wait()


def _max_ladder(options: dict[str, Any]) -> float:
    grace = options.get("max_grace", options.get("grace", 5.0)) or 0.0
    return float(grace) + float(options.get("kill_after", 2.0) or 0.0) if math.isfinite(grace) else 60.0
