"""turnpool on a Ray cluster (``RaySupervisor``) against plain Ray tasks, on the same two-node
``ray.cluster_utils.Cluster``, in one run: no-op throughput, cooperative cancel, stubborn-kill
overshoot, node loss, and what each system's forced cancel leaves alive.

Plain Ray is measured first, while its tasks may use every CPU; the node supervisors then reserve
those CPUs for turnpool's workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from ._common import ROOT, command, have, log, med, ms, pct, rate, ratio, table

OBJECT_STORE = 80 * 2**20
SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}

_DAEMON = (
    "import os, sys, time\n"
    "if os.fork() > 0: os._exit(0)\n"
    "os.setsid()\n"
    "if os.fork() > 0: os._exit(0)\n"
    "sys.stdout.write(str(os.getpid()) + '\\n'); sys.stdout.flush(); os.close(1)\n"
    "while True: time.sleep(1)\n"
)


# How long a cooperative cancel of a running Ray task may take before it counts as not stopped.
COOP_BOUND = 10.0


def forker_task(path: str) -> None:
    """A Ray task shaped like ``examples.agents:forker``: two children and a setsid daemon, their
    pids written to ``path``, then a spin only a kill ends."""
    pids = [
        subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]).pid
        for _ in range(2)
    ]
    d = subprocess.Popen([sys.executable, "-c", _DAEMON], stdout=subprocess.PIPE)
    assert d.stdout is not None
    pids.append(int(d.stdout.readline()))
    d.wait()
    with open(path + ".tmp", "w") as f:
        f.write(" ".join(map(str, pids)))
    os.replace(path + ".tmp", path)
    while True:
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_file(path: str, bound: float = 60.0) -> str:
    deadline = time.monotonic() + bound
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.005)
    with open(path) as f:
        return f.read()


def _count_left(pids: list[int], settle: float = 2.0) -> int:
    """How many of ``pids`` are still alive ``settle`` seconds after the cancel returned; then
    kills them (by pid: this bench stops what it started)."""
    time.sleep(settle)
    left = [p for p in pids if _alive(p)]
    for p in left:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
    return len(left)


def _plain_ray(ray: Any, n: int, reps: int, cancels: int) -> dict[str, Any]:
    from . import _tasks

    noop = ray.remote(_tasks.noop)
    ray.get([noop.remote() for _ in range(100)])
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ray.get([noop.remote() for _ in range(n)])
        rates.append(n / (time.perf_counter() - t0))
    sleepy = ray.remote(max_retries=0)(_tasks.sleepy_started)
    coop: list[float] = []
    stuck = 0
    with tempfile.TemporaryDirectory() as d:
        for i in range(cancels):
            path = os.path.join(d, f"{i}.started")
            ref = sleepy.remote(path)
            _wait_file(path)  # running (a pending task's cancel ends at once, having run nothing)
            time.sleep(0.2)  # inside its sleep loop, like the turnpool side's started turn
            t0 = time.perf_counter()
            ray.cancel(ref, force=False)
            try:
                ray.get(ref, timeout=COOP_BOUND)
            except ray.exceptions.GetTimeoutError:  # not stopped: counted apart, not in the p50
                stuck += 1
                ray.cancel(ref, force=True)
                continue
            except Exception:  # noqa: BLE001 - TaskCancelledError is the expected end
                pass
            coop.append(time.perf_counter() - t0)
    fork = ray.remote(max_retries=0)(forker_task)
    left = 0
    started = 0
    with tempfile.TemporaryDirectory() as d:
        for i in range(3):
            path = os.path.join(d, f"{i}.pids")
            ref = fork.remote(path)
            try:
                pids = [int(x) for x in _wait_file(path, bound=180.0).split()]
            except TimeoutError:  # never scheduled (its CPU still held): counted as not measured
                ray.cancel(ref, force=True)
                continue
            started += len(pids)
            ray.cancel(ref, force=True)
            with contextlib.suppress(Exception):  # cancelled or worker died: the expected end
                ray.get(ref, timeout=60)
            left += _count_left(pids)
    return {"rates": rates, "coop": coop, "stuck": stuck, "left": left, "started": started}


async def _turnpool(cluster: Any, n: int, reps: int, cancels: int) -> dict[str, Any]:
    import anyio

    from supervisor import RaySupervisor, Supervisor

    out: dict[str, Any] = {}
    # The same kill on an embedded pool in this process, this run: the machine's own floor now.
    async with Supervisor(workers=2, spares=0, grace=0.2, agent_path=[str(ROOT)]) as local:
        floor = []
        for _ in range(max(10, cancels // 2)):
            h = await local.submit("examples.agents:stubborn")
            async for _event in h.events():
                break
            t0 = time.perf_counter()
            await h.cancel()
            assert (await h.result()).outcome == "killed"
            floor.append(time.perf_counter() - t0 - 0.2)
        out["floor"] = floor
    async with RaySupervisor(
        None, workers_per_node=2, grace=0.2, kill_after=0.5, spares=0, agent_path=[str(ROOT)]
    ) as sup:
        await sup.wait_nodes(2)
        await asyncio.gather(*(sup.run("examples.agents:noop") for _ in range(200)))
        rates = []
        for _ in range(reps):
            t0 = time.perf_counter()
            handles = await asyncio.gather(*(sup.submit("examples.agents:noop") for _ in range(n)))
            await asyncio.gather(*(h.result() for h in handles))
            rates.append(n / (time.perf_counter() - t0))
        out["rates"] = rates

        async def first_event(h: Any) -> Any:
            async for event in h.events():
                return event

        coop = []
        for _ in range(cancels):
            h = await sup.submit("benchmarks._agents:awaiting", grace=5.0)
            await first_event(h)
            t0 = time.perf_counter()
            await h.cancel()
            result = await h.result()
            assert result.outcome == "aborted", result
            coop.append(time.perf_counter() - t0)
        out["coop"] = coop

        over = []
        for _ in range(max(10, cancels // 2)):
            h = await sup.submit("examples.agents:stubborn", grace=0.2)
            await first_event(h)
            t0 = time.perf_counter()
            await h.cancel()
            result = await h.result()
            assert result.outcome == "killed", result
            over.append(time.perf_counter() - t0 - 0.2)
        out["overshoot"] = over

        left = started = 0
        for _ in range(3):
            h = await sup.submit("examples.agents:forker", {"children": 2})
            pids_event = await first_event(h)
            pids = [*pids_event["children"], pids_event["daemon"]]
            started += len(pids)
            await h.cancel()
            assert (await h.result()).outcome == "killed"
            left += await anyio.to_thread.run_sync(_count_left, pids)
        out["left"], out["started"] = left, started

        # Node loss: a third node holding four hung turns has its raylet killed.
        losses = []
        for _ in range(2):
            # On this thread: Ray registers signal handlers for a node it starts.
            node = cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE)
            await sup.wait_nodes(3)
            key = node.node_id[:12]
            from supervisor.ray.placement import rendezvous

            keys = [k for k, v in sup.nodes().items() if v["state"] == "live"]
            sessions = [s for s in (f"loss{i}" for i in range(10_000)) if rendezvous(s, keys) == key][:4]
            handles = [await sup.submit("examples.agents:stubborn", session=s) for s in sessions]
            for h in handles[:2]:
                await first_event(h)  # two run (two workers), two are queued behind them
            t0 = time.perf_counter()
            await anyio.to_thread.run_sync(functools.partial(cluster.remove_node, node, allow_graceful=False))
            results = [await h.result() for h in handles]
            losses.append(time.perf_counter() - t0)
            assert all(r.error is not None and r.error.type == "NodeLost" for r in results), results
        out["loss"] = losses
    return out


def run(quick: bool) -> str:
    if not have("ray"):
        return "## Ray cluster: turnpool vs plain Ray tasks\n\nSkipped: ray is not installed.\n"
    import ray
    from ray.cluster_utils import Cluster

    n, reps, cancels = (2000, 2, 10) if quick else (5000, 3, 30)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "object_store_memory": OBJECT_STORE,
            "include_dashboard": False,
            "_system_config": SYSTEM_CONFIG,
        },
    )
    try:
        cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE)
        cluster.wait_for_nodes(timeout=120)
        ray.init(
            address=cluster.address,
            namespace="turnpool-bench",
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        )
        # Ray's own objects (tens of thousands, from its import and ray.init) frozen out of the
        # driver's garbage collection, for both sides alike: the README's cluster section tells
        # users to do the same (each full collection otherwise walks them all, ≈ 90 ms at load 10).
        gc.freeze()
        log("plain Ray tasks ...")
        plain = _plain_ray(ray, n, reps, cancels)
        log("RaySupervisor ...")
        tp = asyncio.run(_turnpool(cluster, n, reps, cancels))
    finally:
        ray.shutdown()
        cluster.shutdown()
    tp_rate, ray_rate = med(tp["rates"]), med(plain["rates"])
    # A cancel that did not stop its task within COOP_BOUND is left out of Ray's p50 and said.
    tp_coop, ray_coop = med(tp["coop"]), med(plain["coop"]) if plain["coop"] else COOP_BOUND
    stuck_note = (
        f"; {plain['stuck']} of {cancels} not stopped within {COOP_BOUND:.0f} s, left out of the p50"
        if plain["stuck"]
        else ""
    )
    rows = [
        [
            "no-op throughput",
            f"{n:,} turns × {reps}",
            rate(tp_rate),
            rate(ray_rate),
            ratio(tp_rate / ray_rate),
        ],
        [
            "cooperative cancel → end seen by the caller (p50)",
            f"{cancels} cancels",
            ms(tp_coop),
            f"{ms(ray_coop)} (`force=False`){stuck_note}",
            f"{tp_coop / ray_coop:.2f}× of Ray's",
        ],
        [
            "stubborn kill: overshoot past the 0.2 s grace (p50 / p90)",
            f"{len(tp['overshoot'])} kills",
            f"{ms(med(tp['overshoot']))} / {ms(pct(tp['overshoot'], 90))}",
            "— (`force=True` has no grace)",
            f"embedded pool, same run: {ms(med(tp['floor']))} / {ms(pct(tp['floor'], 90))}",
        ],
        [
            "node loss (raylet SIGKILLed) → all 4 turns it held ended `crashed`/NodeLost",
            f"{len(tp['loss'])} losses",
            " / ".join(ms(x) for x in tp["loss"]),
            "—",
            "",
        ],
        [
            "processes alive 2 s after a forced cancel (2 children + a setsid daemon each)",
            "3 cancels",
            f"{tp['left']} of {tp['started']}",
            f"{plain['left']} of {plain['started']} (`force=True`)",
            "",
        ],
    ]
    verdicts = (
        f"throughput {ratio(tp_rate / ray_rate)} Ray's (target ≥ 5×); cooperative cancel p50 "
        f"{tp_coop / ray_coop:.2f}× Ray's `force=False` (target ≤ 0.5×); kill overshoot p90 "
        f"{ms(pct(tp['overshoot'], 90))} (target < 50 ms); forced cancel left {tp['left']} processes "
        f"(Ray: {plain['left']})"
    )
    return (
        "## Ray cluster: turnpool vs plain Ray tasks\n\n"
        f"Target: {verdicts}.\n\n"
        "One `ray.cluster_utils.Cluster` (2 nodes × 2 logical CPUs, 80 MiB object stores) on this "
        "machine; plain Ray tasks first, then `RaySupervisor(workers_per_node=2)` on the same cluster. "
        "Node loss: a third node joins, four `stubborn` turns go to it (two running, two queued), "
        "its raylet is killed; the time is until the last of them has its `NodeLost` result "
        "(Ray's health check, 3 × 1 s here, dominates).\n\n"
        + table(["what", "samples", "turnpool", "plain Ray", "turnpool vs Ray"], rows)
        + f"\n\nCommand: {command('ray', quick)}.\n"
    )


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
    sys.exit(0)
