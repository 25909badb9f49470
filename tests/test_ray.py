"""The Ray backend on a real multi-node cluster (issue 17): ``RaySupervisor`` keeps turnpool's
contract on every node, and a lost node costs its turns one truthful ``crashed``/``NodeLost``.

One cluster (``ray.cluster_utils.Cluster``: a head and one more node, two logical CPUs each, a
small object store) is started once for the module and shared; every test of the module is in
one xdist group (``--dist loadgroup``) so the module runs in one worker. Tests that lose a node
add a node of their own first. Ray's own processes are children of this test process (a child
subreaper), so the module's ``no_leftover_processes`` tells them apart from turnpool's: after
each test no process but Ray's may be left, and at module end Ray's are stopped and reaped too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import resource
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

from ray.cluster_utils import Cluster  # noqa: E402

from supervisor import RaySupervisor, UnknownTurn  # noqa: E402
from supervisor.ray.placement import node_of, rendezvous  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OBJECT_STORE = 80 * 2**20
# Node death is noticed by GCS health checks: faster than the defaults (5 × 3 s) so a killed
# raylet is known within a few seconds on a loaded machine.
SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
BOUND = 90  # generous: a two-core machine shared with other suites

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("ray"), pytest.mark.timeout(300)]


def _is_ray(p: psutil.Process) -> bool:
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return True  # gone meanwhile
    return cmd.startswith("ray::") or "site-packages/ray/" in cmd


def _reap_zombies() -> None:
    for p in psutil.Process().children(recursive=False):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(p.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            pass


def _turnpool_leftovers() -> list[psutil.Process]:
    _reap_zombies()
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not _is_ray(p):
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Overrides conftest's: Ray's own processes (raylets, GCS, idle Ray workers) come and go
    with the shared cluster; turnpool's (node supervisors' workers, zygotes, guardians, agents'
    children) must be gone after each test."""
    before = {p.pid for p in _turnpool_leftovers()}
    yield
    left = [p for p in _turnpool_leftovers() if p.pid not in before]
    if left:
        _, alive = psutil.wait_procs(left, timeout=10)
        desc = [f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in alive if p.is_running()]
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        _reap_zombies()
        assert not desc, f"test left turnpool processes behind: {desc}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "object_store_memory": OBJECT_STORE,
            "include_dashboard": False,
            "_system_config": SYSTEM_CONFIG,
        },
    )
    try:
        c.add_node(num_cpus=2, object_store_memory=OBJECT_STORE)
        c.wait_for_nodes(timeout=BOUND)
        ray.init(address=c.address, namespace="turnpool-test", log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        ours = psutil.Process().children(recursive=True)
        c.shutdown()
        _, alive = psutil.wait_procs(ours, timeout=30)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=10)
        _reap_zombies()


@pytest.fixture
async def sup(cluster: Cluster) -> AsyncIterator[RaySupervisor]:
    async with RaySupervisor(
        None, workers_per_node=2, grace=5.0, kill_after=1.0, spares=0, agent_path=[str(ROOT)]
    ) as s:
        await s.wait_nodes(2)  # the module's two nodes; tests that add one wait for it themselves
        yield s


async def _wait_node_dead(node_id: str) -> None:
    """Wait (bounded) until Ray no longer lists a removed node as alive, so the next test's
    router does not try to start a node supervisor on it."""
    with anyio.move_on_after(BOUND):
        while any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):  # noqa: ASYNC110
            await anyio.sleep(0.2)  # allowed: polling Ray's node table (it has no death callback here)


def _session_on(sup: RaySupervisor, key: str, prefix: str = "s") -> str:
    """A session name that rendezvous hashing places on node ``key``."""
    keys = [k for k, n in sup.nodes().items() if n["state"] == "live"]
    for i in range(10_000):
        name = f"{prefix}{i}"
        if rendezvous(name, keys) == key:
            return name
    raise AssertionError("no session maps to the node")


def _keys(sup: RaySupervisor) -> list[str]:
    return sorted(k for k, n in sup.nodes().items() if n["state"] == "live")


async def _first_event(sup: RaySupervisor, turn_id: str) -> Any:
    async for event in sup.handle(turn_id).events():
        return event
    raise AssertionError("the turn ended without an event")


async def _first_event_once_known(sup: RaySupervisor, turn_id: str) -> Any:
    """The first event of a turn whose submit may still be on its way to its node."""
    while True:
        try:
            return await _first_event(sup, turn_id)
        except UnknownTurn:
            await anyio.sleep(0.01)  # allowed: the submit is on its way; nothing to wait on here


async def _wait_file(path: Path) -> None:
    while not path.exists():  # noqa: ASYNC110, ASYNC240 - a file another process writes: no event
        await anyio.sleep(0.02)  # allowed: polling a file an agent writes in another process


async def _wait_gone(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Wait (bounded) until none of ``procs`` runs; zombies count as gone (and are reaped)."""
    with anyio.move_on_after(30):
        while True:
            _reap_zombies()
            alive = []
            for p in procs:
                try:
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                        alive.append(p)
                except psutil.Error:
                    pass
            if not alive:
                return []
            await anyio.sleep(0.05)  # allowed: other processes' deaths have no event to wait on here
    return alive


# ---- outcomes, events, cancellation --------------------------------------------------------


async def test_every_outcome_on_every_node(sup: RaySupervisor) -> None:
    """Promise: each outcome (completed, failed, aborted, killed, crashed) is reported truthfully
    for turns placed on each node of the cluster, and each turn id names the node it ran on."""
    agent = "tests.agents.cluster:"
    with anyio.fail_after(BOUND):
        for key in _keys(sup):
            session = _session_on(sup, key)
            done = await sup.run(agent + "where", {"k": key}, session=session)
            assert done.outcome == "completed" and done.output["node_pid"] == sup.nodes()[key]["pid"]
            assert done.output["sigblk"] & (1 << (signal.SIGINT - 1)) == 0  # Ray's SIGINT block reset
            failed = await sup.run(agent + "fail", session=session)
            assert failed.outcome == "failed" and failed.error is not None
            assert failed.error.type == "RuntimeError"
            crashed = await sup.run(agent + "crash", session=session)
            assert crashed.outcome == "crashed" and crashed.exit_code == 3
            h = await sup.submit(agent + "cooperative", session=session)
            assert node_of(h.turn_id) == key
            await _first_event(sup, h.turn_id)
            await h.cancel()
            aborted = await h.result()
            assert aborted.outcome == "aborted" and aborted.cause is not None
            assert aborted.cause.kind == "user"
            h = await sup.submit(agent + "stubborn", session=session, grace=0.2, kill_after=0.2)
            await _first_event(sup, h.turn_id)
            await h.cancel()
            killed = await h.result()
            assert killed.outcome == "killed" and killed.started
        # Without a session, turns spread over the nodes (least loaded first).
        handles = [await sup.submit(agent + "where", i) for i in range(8)]
        results = [await h.result() for h in handles]
        assert {r.output["node_pid"] for r in results} == {n["pid"] for n in sup.nodes().values()}


async def test_unrunnable_agents_are_refused_at_submit_on_every_node(
    cluster: Cluster, tmp_path: Path
) -> None:
    """ADAPT-PROBE on a cluster: a submit naming what no worker can run raises ``InvalidAgent`` naming
    the type (and, for a framework object the installed framework cannot run, the extra), on
    whichever node the turn is placed; nothing is accepted and a callable agent runs on."""
    from supervisor import InvalidAgent
    from tests.test_adapters_refusals import MODULE, _stand_ins, _write

    _write(tmp_path, "plain.py", MODULE)
    _stand_ins(tmp_path)
    async with RaySupervisor(None, workers_per_node=1, spares=0, agent_path=[str(tmp_path), str(ROOT)]) as s:
        await s.wait_nodes(2)
        refusals = []
        with anyio.fail_after(BOUND):
            for key in _keys(s):
                for agent in ("plain:thing", "fw_objects:old"):
                    with pytest.raises(InvalidAgent) as err:
                        await s.submit(agent, "hi", session=_session_on(s, key))
                    refusals.append(str(err.value))
            fine = await s.run("plain:fine", "hi")
    assert len(refusals) == 4
    assert all("'plain:thing' is a plain.Thing" in r for r in refusals[0::2]), refusals
    assert all("pip install 'turnpool[openai-agents]'" in r for r in refusals[1::2]), refusals
    assert fine.outcome == "completed" and fine.output == "fine"


async def test_events_from_a_remote_node_in_order_none_lost(sup: RaySupervisor, cluster: Cluster) -> None:
    """Promise: events emitted on a node other than the driver's arrive in order, none lost
    (streamed from the node in batches)."""
    head = cluster.head_node.node_id[:12]
    remote = next(k for k in _keys(sup) if k != head)
    n = 3000
    with anyio.fail_after(BOUND):
        h = await sup.submit("tests.agents.cluster:count", {"n": n}, session=_session_on(sup, remote))
        assert node_of(h.turn_id) == remote
        got = [e async for e in h.events()]
        assert got == list(range(n))
        assert (await h.result()).output == n


async def test_cooperative_cancel_ends_aborted_well_inside_grace(sup: RaySupervisor) -> None:
    """Promise: a cooperative turn cancelled on a remote node ends ``aborted`` well inside its
    grace (5 s): the Abort reaches it at once, no escalation."""
    with anyio.fail_after(BOUND):
        for key in _keys(sup):
            h = await sup.submit("tests.agents.cluster:cooperative", session=_session_on(sup, key), grace=5.0)
            await _first_event(sup, h.turn_id)
            t0 = time.monotonic()
            await h.cancel()
            result = await h.result()
            assert result.outcome == "aborted"
            assert time.monotonic() - t0 < 2.5


async def test_a_cancel_reply_and_the_results_stream_settle_a_turn_once(sup: RaySupervisor) -> None:
    """Promise (RAY-CANCEL-REPLY): a cooperative cancel's end comes back in the cancel call's own
    reply, so the turn has its result when ``cancel()`` returns; the same end also arrives in a
    second concurrent cancel's reply and on the node's results stream, and the turn is still
    settled exactly once: one result object for every handle, one ``aborted`` on the node."""
    with anyio.fail_after(BOUND):
        for key in _keys(sup):
            session = _session_on(sup, key, "cr")
            h = await sup.submit("tests.agents.cluster:cooperative", session=session, grace=5.0)
            await _first_event(sup, h.turn_id)
            late_before = sup.nodes()[key]["late"]
            before = (await sup.status())["nodes"]
            aborted_before = next(n for n in before if n["key"] == key).get("outcomes", {}).get("aborted", 0)
            # Both cancel calls are sent before either reply is read: each reply carries the end.
            causes = await asyncio.gather(h.cancel(), h.cancel({"kind": "deadline"}))
            settled = sup.result_now(h.turn_id)
            assert settled is not None, "the cancel returned before the turn's end reached the caller"
            assert settled.outcome == "aborted"
            # The first cause to reach the node wins (Ray may run an async actor's calls in either
            # order), and both cancels return that one.
            assert settled.cause in ({"kind": "user"}, {"kind": "deadline"})
            assert causes == [settled.cause, settled.cause]
            # The session's next turn ends after it on the same node: once its result is in, the
            # results stream has delivered the cancelled turn's end too (results stream in order).
            after = await sup.run("tests.agents.cluster:where", session=session)
            assert after.outcome == "completed"
            assert sup.nodes()[key]["late"] - late_before == 2  # the other reply and the stream
            assert await h.result() is settled
            assert await sup.handle(h.turn_id).result() is settled
            status = await sup.status()
            node = next(n for n in status["nodes"] if n["key"] == key)
            assert node["outcomes"].get("aborted", 0) - aborted_before == 1


async def test_stubborn_turn_killed_with_its_grandchildren_and_setsid_daemon(
    sup: RaySupervisor, tmp_path: Path
) -> None:
    """Promise: a turn that ignores Abort ends ``killed`` after its grace, and when its result
    arrives its forked child and double-forked setsid daemon are gone."""
    with anyio.fail_after(BOUND):
        for key in _keys(sup):
            pid_file = tmp_path / f"{key}.pids"
            h = await sup.submit(
                "tests.agents.cluster:daemon_then_hang",
                {"pid_file": str(pid_file)},
                session=_session_on(sup, key),
                grace=0.3,
                kill_after=0.3,
            )
            started = await _first_event(sup, h.turn_id)
            procs = [psutil.Process(started[k]) for k in ("daemon", "child", "worker")]
            t0 = time.monotonic()
            await h.cancel()
            result = await h.result()
            assert result.outcome == "killed"
            assert time.monotonic() - t0 >= 0.3
            assert [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []


def _thread_niceness(pid: int) -> dict[int, int]:
    """The niceness of each thread of ``pid`` (Linux keeps one per thread)."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
            found[int(tid)] = os.getpriority(os.PRIO_PROCESS, int(tid))
    return found


async def test_node_supervisors_and_their_workers_run_at_normal_niceness(sup: RaySupervisor) -> None:
    """Promise (RAY-PRIORITY): Ray starts its workers at nice 15, below every other process; a
    node supervisor (which keeps the grace and does the kill) and the workers it starts run at
    ``node_niceness`` (0) instead, so a loaded machine does not stretch a kill's overshoot."""
    limit = resource.getrlimit(resource.RLIMIT_NICE)[0]
    if os.geteuid() != 0 and limit != resource.RLIM_INFINITY and limit < 20:
        pytest.skip("this machine cannot: a process here may not lower its niceness to 0")
    with anyio.fail_after(BOUND):
        for key, info in sup.nodes().items():
            if info["state"] != "live":
                continue
            assert set(_thread_niceness(info["pid"]).values()) == {0}, (key, _thread_niceness(info["pid"]))
            result = await sup.run("tests.agents.cluster:where", session=_session_on(sup, key, "nice"))
            assert result.outcome == "completed", result
            assert result.output["nice"] == 0, result.output


async def test_cancelling_run_or_its_ray_ref_cancels_the_turn(sup: RaySupervisor) -> None:
    """Promise: cancelling the task awaiting ``run`` — or ``ray.cancel`` of the ref from
    ``run_ref`` — cancels the turn with cause ``user`` and waits for its truthful end."""
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            run = functools.partial(sup.run, "tests.agents.cluster:cooperative", turn_id="run-cancel-1")
            tg.start_soon(run)
            await _first_event_once_known(sup, "run-cancel-1")
            tg.cancel_scope.cancel()
        result = await sup.result("run-cancel-1")
        assert result.outcome == "aborted" and result.cause is not None and result.cause.kind == "user"

        ref = sup.run_ref("tests.agents.cluster:cooperative", None, turn_id="ref-cancel-1")
        await _first_event_once_known(sup, "ref-cancel-1")
        ray.cancel(ref)
        with pytest.raises((ray.exceptions.TaskCancelledError, ray.exceptions.RayTaskError)):
            await ref
        result = await sup.result("ref-cancel-1")
        assert result.outcome == "aborted" and result.cause is not None and result.cause.kind == "user"


# ---- sessions and ids ----------------------------------------------------------------------


async def test_sessions_stay_in_order_while_a_node_joins(
    sup: RaySupervisor, cluster: Cluster, tmp_path: Path
) -> None:
    """Promise: a session's turns run one at a time, in submission order, while a node joins
    (rendezvous hashing may move a session to the new node only between its turns); the new
    node gets a node supervisor and takes turns."""
    sessions = [f"join-{i}" for i in range(6)]
    logs = {s: tmp_path / f"{s}.log" for s in sessions}
    handles = []
    joined = None
    try:
        with anyio.fail_after(BOUND * 2):
            for round_ in range(6):
                if round_ == 2:
                    joined = cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE)
                    await sup.wait_nodes(3)
                handles.extend(
                    [
                        await sup.submit(
                            "tests.agents.cluster:logged",
                            {"log": str(logs[s]), "tag": round_, "hold": 0.05},
                            session=s,
                        )
                        for s in sessions
                    ]
                )
            results = [await h.result() for h in handles]
            assert {r.outcome for r in results} == {"completed"}
            for s in sessions:
                lines = logs[s].read_text().split("\n")[:-1]
                expected = []
                for round_ in range(6):
                    expected += [f"start {round_}", f"end {round_}"]
                assert [" ".join(line.split()[:2]) for line in lines] == expected, s
            new_key = joined.node_id[:12] if joined is not None else ""
            assert sup.nodes()[new_key]["state"] == "live"
            r = await sup.run("tests.agents.cluster:where", session=_session_on(sup, new_key, "new"))
            assert r.output["node_pid"] == sup.nodes()[new_key]["pid"]
    finally:
        if joined is not None:
            await anyio.to_thread.run_sync(cluster.remove_node, joined)
            await _wait_node_dead(joined.node_id)


async def test_cancel_session_reaches_the_owning_node(sup: RaySupervisor) -> None:
    """Promise: ``cancel_session`` reaches the node the session is on: its running turn and the
    turns queued behind it all end ``aborted``; a turn submitted afterwards runs normally."""
    key = _keys(sup)[-1]
    session = _session_on(sup, key, "cs")
    with anyio.fail_after(BOUND):
        running = await sup.submit("tests.agents.cluster:cooperative", session=session)
        queued = [await sup.submit("tests.agents.cluster:cooperative", session=session) for _ in range(2)]
        await _first_event(sup, running.turn_id)
        cancelled = await sup.cancel_session(session)
        assert sorted(cancelled) == sorted([running.turn_id] + [h.turn_id for h in queued])
        for h in [running, *queued]:
            assert (await h.result()).outcome == "aborted"
        after = await sup.run("tests.agents.cluster:where", session=session)
        assert after.outcome == "completed"


async def test_a_repeated_turn_id_runs_once(sup: RaySupervisor, tmp_path: Path) -> None:
    """Promise: a caller's ``turn_id`` is routed by its hash, so submitting it again (at once
    or after it ended) reaches the same node and the turn runs once."""
    log = tmp_path / "once.log"
    with anyio.fail_after(BOUND):
        for i in range(4):
            tid = f"job-{i}"
            first, second = await _both(sup, tid, {"log": str(log)})
            assert first.turn_id == second.turn_id == tid
            assert sup.node_of_turn(tid) == rendezvous(tid, _keys(sup))
            assert (await first.result()) == (await second.result())
            again = await sup.submit("tests.agents.cluster:once", {"log": str(log)}, turn_id=tid)
            assert (await again.result()).outcome == "completed"
        lines = log.read_text().split("\n")[:-1]
        assert sorted(line.split()[0] for line in lines) == [f"job-{i}" for i in range(4)]


async def _both(sup: RaySupervisor, tid: str, payload: dict[str, Any]) -> list[Any]:
    out: list[Any] = [None, None]

    async def one(i: int) -> None:
        out[i] = await sup.submit("tests.agents.cluster:once", payload, turn_id=tid)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0)
        tg.start_soon(one, 1)
    return out


async def test_status_shows_per_node_pools(sup: RaySupervisor) -> None:
    """Promise: ``status()`` shows each node's pool (its workers, queue and outcomes)."""
    status = await sup.status()
    assert len(status["nodes"]) == len(_keys(sup)) >= 2
    for node in status["nodes"]:
        assert node["state"] == "live" and len(node["workers"]) == 2
        assert {w["state"] for w in node["workers"]} <= {"idle", "starting", "busy"}
    assert len(status["workers"]) == 2 * len(status["nodes"])


async def test_one_at_a_time_turns_spread_over_the_nodes(sup: RaySupervisor) -> None:
    """Promise: turns with no session or id go to the least loaded node, and among equally loaded
    ones round robin: turns run one at a time (every node idle at each submit) still use every
    node, rather than all landing on the first one."""
    live = len(_keys(sup))
    results = [await sup.run("tests.agents.cluster:where", i) for i in range(2 * live)]
    assert {r.outcome for r in results} == {"completed"}
    assert len({r.output["node_pid"] for r in results}) == live >= 2


# ---- node loss -----------------------------------------------------------------------------


@pytest.mark.parametrize("graceful", [True, False], ids=["graceful", "raylet-killed"])
async def test_a_lost_node_ends_its_turns_once_and_retries_elsewhere(
    sup: RaySupervisor, cluster: Cluster, tmp_path: Path, graceful: bool
) -> None:
    """Promise: when a node is removed (gracefully, or by killing its raylet) while turns run,
    every turn it held ends exactly once, ``crashed`` with a ``NodeLost`` error, within a
    bounded time; a ``retry=True`` turn runs again on another node, once (``attempts`` 2); no
    process of the lost node's turnpool trees (agents' setsid daemons included) is left."""
    doomed = cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE)
    removed = False
    try:
        with anyio.fail_after(BOUND * 2):
            await sup.wait_nodes(3)
            key = doomed.node_id[:12]
            node_pid = sup.nodes()[key]["pid"]
            # Two workers on the doomed node: one turn hangs, one will be retried, one is queued.
            sessions = [_session_on(sup, key, "doom")]
            hang = []
            for i, session in enumerate(sessions):
                h = await sup.submit(
                    "tests.agents.cluster:daemon_then_hang",
                    {"pid_file": str(tmp_path / f"{i}.pids")},
                    session=session,
                )
                hang.append(h)
            queued = await sup.submit("tests.agents.cluster:where", session=sessions[0])
            retry_log = tmp_path / "retry.log"
            retried = await sup.submit(
                "tests.agents.cluster:hang_unless_retried",
                {"log": str(retry_log)},
                session=_session_on(sup, key, "retry"),
                retry=True,
            )
            assert {sup.node_of_turn(h.turn_id) for h in [*hang, queued, retried]} == {key}
            started = [await _first_event(sup, h.turn_id) for h in hang]
            await _wait_file(retry_log)
            tree = psutil.Process(node_pid).children(recursive=True)
            tree += [psutil.Process(s[k]) for s in started for k in ("daemon", "child")]
            assert len(tree) >= 5  # zygote, 2 workers, their guardians (and the agent's 2)

            t0 = time.monotonic()
            await anyio.to_thread.run_sync(lambda: cluster.remove_node(doomed, allow_graceful=graceful))
            removed = True
            ends = [await h.result() for h in [*hang, queued]]
            lost_after = time.monotonic() - t0
            for r in ends:
                assert r.outcome == "crashed" and r.error is not None and r.error.type == "NodeLost", r
            assert lost_after < 60
            again = await retried.result()
            assert again.outcome == "completed" and again.attempts == 2 and again.output == 2
            runs = retry_log.read_text().split()
            assert len(runs) == 2 and runs[0] == str(node_pid) and runs[1] != str(node_pid)
            assert sup.nodes()[key]["state"] == "lost"
            left = await _wait_gone(tree)
            assert left == [], [(p.pid, p.cmdline()) for p in left]
            # Each turn ended once: a second look gives the same result.
            assert [await h.result() for h in [*hang, queued]] == ends
    finally:
        if not removed:
            cluster.remove_node(doomed)
        await _wait_node_dead(doomed.node_id)


async def test_ray_kill_of_a_node_supervisor_leaves_no_process(sup: RaySupervisor, tmp_path: Path) -> None:
    """Promise: ``ray.kill`` of a node supervisor's actor (Ray SIGKILLs the actor and its
    direct children) ends the node's turns ``crashed``/``NodeLost`` and leaves no process of
    its trees: each worker's guardian outlives its worker and sweeps the worker's session and
    tree marker, so the agent's forked child and setsid daemon die too."""
    key = _keys(sup)[-1]
    info = sup.nodes()[key]
    with anyio.fail_after(BOUND):
        h = await sup.submit(
            "tests.agents.cluster:daemon_then_hang",
            {"pid_file": str(tmp_path / "k.pids")},
            session=_session_on(sup, key, "kill"),
        )
        started = await _first_event(sup, h.turn_id)
        tree = psutil.Process(info["pid"]).children(recursive=True)
        tree += [psutil.Process(started[k]) for k in ("daemon", "child")]
        assert {started["worker"], started["daemon"], started["child"]} <= {p.pid for p in tree}
        ray.kill(info["actor"], no_restart=True)
        result = await h.result()
        assert result.outcome == "crashed" and result.error is not None
        assert result.error.type == "NodeLost"
        left = await _wait_gone(tree)
        assert left == [], [(p.pid, p.cmdline()) for p in left]


# ---- front ends ----------------------------------------------------------------------------


def test_batch_spreads_jobs_across_nodes(cluster: Cluster, tmp_path: Path) -> None:
    """Promise: ``turnpool batch JOBS --ray ADDRESS`` runs every job on the cluster, spread
    over its nodes, one result line per job."""
    import json
    import subprocess
    import sys

    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"id": f"j{i}", "input": i}) + "\n" for i in range(12)))
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "supervisor.cli", "batch", str(jobs), "-o", str(out)]
    cmd += ["--agent", "tests.agents.cluster:where", "--ray", cluster.address, "--path", str(ROOT)]
    cmd += ["--workers-per-node", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=BOUND * 2, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 12 and {line["outcome"] for line in lines} == {"completed"}
    assert len({line["output"]["node_pid"] for line in lines}) >= 2


def test_serve_ray_keeps_its_client_endpoint_and_runs_turns_cluster_wide(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Promise: ``turnpool serve --ray ADDRESS`` serves the usual client endpoint; turns submitted
    through ``Client`` run on every node; ``turnpool status`` shows each node's pool; SIGTERM
    disposes and exits 0 leaving no process behind."""
    import subprocess
    import sys

    from supervisor import SyncClient

    endpoint = f"ipc://{tmp_path}/ray.sock"
    cmd = [sys.executable, "-m", "supervisor.cli", "serve", "--ray", cluster.address, "--endpoint", endpoint]
    cmd += ["--workers-per-node", "2", "--path", str(ROOT), "--spares", "0"]
    daemon = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert daemon.stdout is not None
        line = daemon.stdout.readline()  # the ready line (or EOF if it failed)
        assert line.startswith("turnpool serve: ready on"), daemon.stderr.read() if daemon.stderr else line
        with SyncClient.connect(endpoint) as client:
            results = [client.run("tests.agents.cluster:where", i) for i in range(6)]
            handles = [client.submit("tests.agents.cluster:where", i) for i in range(8)]
            results += [h.result() for h in handles]
            assert {r.outcome for r in results} == {"completed"}
            assert len({r.output["node_pid"] for r in results}) >= 2
            h = client.submit("tests.agents.cluster:count", {"n": 50})
            assert list(h.events()) == list(range(50))
            status = client.status()
        assert len(status["nodes"]) >= 2 and all(len(n["workers"]) == 2 for n in status["nodes"])
        shown = subprocess.run(
            [sys.executable, "-m", "supervisor.cli", "status", "--endpoint", endpoint],
            capture_output=True,
            text=True,
            timeout=BOUND,
        )
        assert shown.returncode == 0, shown.stderr
        for node in status["nodes"]:
            assert node["key"] + "/" in shown.stdout
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=BOUND) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
        daemon.communicate()  # reaps it and closes its pipes


async def test_submit_many_and_results_run_each_input_once_across_the_nodes(sup: RaySupervisor) -> None:
    """Promise (API-MANY on a cluster): ``submit_many`` of 40 echo turns returns 40 distinct
    handles in input order, spread over the nodes; ``results`` answers in input order with each
    input echoed back; one bad input submits nothing."""
    with anyio.fail_after(BOUND):
        with pytest.raises(TypeError, match="turn input #1"):
            await sup.submit_many("examples.agents:echo", [1, object()])
        handles = await sup.submit_many("examples.agents:echo", [{"i": i} for i in range(40)])
        results = await sup.results(handles)
    assert len({h.turn_id for h in handles}) == 40
    assert len({node_of(h.turn_id) for h in handles}) == len(_keys(sup))
    assert [r.output for r in results] == [{"i": i} for i in range(40)]
    assert [r.turn_id for r in results] == [h.turn_id for h in handles]


async def test_a_lost_node_resumes_a_retried_agent_turn_from_its_last_step(
    sup: RaySupervisor, cluster: Cluster, tmp_path: Path
) -> None:
    """RAY-STEP-RECORDS: a ``retry=True`` 3-tool ``AgentLoop`` turn whose node is removed while its third tool
    runs (the first two completed, the third started after its effect) runs again on another node
    from its last recorded step: its records lived with the router. No call runs twice; the third,
    whose outcome the loss left unknown, is told to the model; the model is not asked again for
    the three responses it gave."""
    doomed = cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE)
    removed = False
    try:
        with anyio.fail_after(BOUND * 2):
            await sup.wait_nodes(3)
            key = doomed.node_id[:12]
            handle = await sup.submit(
                "tests.agents.durable:trip",
                {"dir": str(tmp_path), "hang": "in_lookup"},
                session=_session_on(sup, key, "durable"),
                retry=True,
            )
            assert sup.node_of_turn(handle.turn_id) == key
            await _wait_file(tmp_path / "hanging")
            await anyio.to_thread.run_sync(lambda: cluster.remove_node(doomed, allow_graceful=False))
            removed = True
            result = await handle.result()
        assert result.outcome == "completed" and result.attempts == 2, result
        assert sup.node_of_turn(handle.turn_id) != key
        for name in ("charges", "reserves", "lookups"):
            assert len((tmp_path / name).read_text().splitlines()) == 1, name
        assert len((tmp_path / "opens").read_text().splitlines()) == 4  # 3 recorded, the 4th asked once
        assert "'c3'" in result.output["text"] and "unknown" in result.output["text"], result.output
    finally:
        if not removed:
            cluster.remove_node(doomed)
        await _wait_node_dead(doomed.node_id)
