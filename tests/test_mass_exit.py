"""Many workers ending at once (``aclose()``, a daemon's SIGTERM): each adopted child is read once
(LADDER-ORPHANS), and what every dead worker left is still found and reaped.

Before LADDER-ORPHANS each worker's exit read /proc for every child of the supervisor that was not a
live worker - during a mass exit, the guardians of every worker already dead - so N exits cost N²
reads. The count of reads is the behaviour checked here, never a time.
"""

from __future__ import annotations

from typing import Any

import anyio
import psutil
import pytest

from supervisor import Supervisor
from supervisor import lowlevel as sup_lowlevel
from worker import proctree

pytestmark = pytest.mark.anyio

HAVE_CGROUP = proctree.cgroups_usable()
MODES = [
    pytest.param(
        True,
        id="cgroup",
        marks=pytest.mark.skipif(not HAVE_CGROUP, reason="no writable cgroup v2 hierarchy on this machine"),
    ),
    pytest.param(False, id="fallback"),
]


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p)]


@pytest.mark.parametrize("cgroups", MODES)
async def test_a_mass_exit_reads_each_adopted_child_about_once(
    monkeypatch: pytest.MonkeyPatch, cgroups: bool
) -> None:
    """``aclose()`` of 24 idle workers: the session of each child the supervisor adopted (a dead
    worker's guardian) is read a bounded number of times in all, not once per later exit."""
    n = 24
    reads: list[int] = []
    real = proctree.session_of

    def counted(pid: int) -> int | None:
        reads.append(pid)
        return real(pid)

    with anyio.fail_after(120):
        sup = Supervisor(workers=n, spares=0, cgroups=cgroups, start_timeout=60)
        await sup.start()
        try:
            monkeypatch.setattr(proctree, "session_of", counted)
        finally:
            await sup.aclose()
    per_child: dict[int, int] = {}
    for pid in reads:
        per_child[pid] = per_child.get(pid, 0) + 1
    # Quadratic before: about n * n / 2 reads (each exit read every guardian already adopted).
    assert len(reads) <= 3 * n, f"{len(reads)} reads of {len(per_child)} children for {n} exits"


@pytest.mark.parametrize("cgroups", MODES)
async def test_idle_workers_exiting_together_share_a_listing_of_our_children(
    monkeypatch: pytest.MonkeyPatch, cgroups: bool
) -> None:
    """LADDER-BATCH: ``aclose()`` of 24 idle workers lists this process's children a few times for
    all of them, not once per exit (the listing of N pids at each of N exits was O(N²)); every
    worker is gone when it returns."""
    n = 24
    listings = 0
    real = sup_lowlevel.orphans.adopted

    def counted() -> list[int]:
        nonlocal listings
        listings += 1
        return real()

    with anyio.fail_after(120):
        sup = Supervisor(workers=n, spares=0, cgroups=cgroups, start_timeout=60)
        await sup.start()
        try:
            pids = [w["pid"] for w in (await sup.status())["workers"]]
            monkeypatch.setattr(sup_lowlevel.orphans, "adopted", counted)
        finally:
            await sup.aclose()
    assert listings <= n // 3, f"{listings} listings of our children for {n} idle exits"
    assert len(pids) == n
    assert _alive(pids) == []


@pytest.mark.parametrize("cgroups", MODES)
async def test_aclose_of_many_busy_workers_leaves_no_process(cgroups: bool) -> None:
    """12 workers each running a turn that forked two children and a setsid daemon and ignores
    SIGTERM: ``aclose()`` kills every tree, and each dead worker's daemon is still found among
    the children adopted from the others (read once, kept across exits)."""
    n = 12
    pids: list[int] = []
    with anyio.fail_after(180):
        async with Supervisor(
            workers=n, spares=0, cgroups=cgroups, grace=0.2, kill_after=0.2, start_timeout=60
        ) as sup:
            handles = [
                await sup.submit("examples.agents:forker", {"children": 2, "ignore_sigterm": True})
                for _ in range(n)
            ]
            for h in handles:
                async for event in h.events():
                    data: Any = event
                    pids += [*data["children"], data["daemon"], data["worker"]]
                    break
            assert len(set(pids)) == 4 * n
    assert _alive(pids) == []
    for h in handles:
        assert (await h.result()).outcome in ("cancelled", "killed")


class FakeTree:
    """Children and their facts, with a manual clock and a count of reads."""

    def __init__(self) -> None:
        self.now = 0.0
        self.kids: dict[int, sup_lowlevel.OrphanFacts] = {}
        self.reads: list[int] = []

    def children(self) -> list[int]:
        return list(self.kids)

    def read(self, pid: int, now: float) -> sup_lowlevel.OrphanFacts:
        self.reads.append(pid)
        return self.kids[pid]._replace(read_at=now)

    def index(self) -> sup_lowlevel.OrphanIndex:
        return sup_lowlevel.OrphanIndex(children=self.children, read=self.read, clock=lambda: self.now)


def _facts(session: int, markers: tuple[str, ...] = (), cgroup: str | None = None) -> Any:
    return sup_lowlevel.OrphanFacts(session, frozenset(markers), cgroup, 0.0)


def test_each_child_is_read_once_across_exits() -> None:
    tree = FakeTree()
    for w in range(100, 110):  # ten dead workers' guardians, each in its worker's session
        tree.kids[w + 1000] = _facts(w)
    tree.kids[5] = _facts(5)  # the host's own child
    index = tree.index()
    for w in range(100, 110):
        assert index.of(w, f"m{w}", set()) == [w + 1000]
        del tree.kids[w + 1000]  # killed and reaped
        index.forget([w + 1000])
    assert sorted(tree.reads) == sorted([5, *range(1100, 1110)])


def test_markers_and_cgroups_name_setsid_descendants() -> None:
    tree = FakeTree()
    tree.kids[7] = _facts(7, ("mA",))  # a setsid daemon of worker A's tree
    tree.kids[8] = _facts(8, (), "/cg/pool/w2")  # a zombie whose only mark is its (removed) cgroup
    tree.kids[9] = _facts(9, ("mB",))
    index = tree.index()
    live = {9}  # a live worker: never read
    assert index.of(1, "mA", live, "/cg/pool/w1") == [7]
    assert index.of(2, "mC", live, "/cg/pool/w2") == [8]
    assert index.of(3, "mB", live) == []
    assert 9 not in tree.reads
    assert index.of(3, "mB", set()) == [9]


def test_stale_facts_and_departed_children_are_read_again() -> None:
    tree = FakeTree()
    tree.kids[7] = _facts(7)
    index = tree.index()
    assert index.of(1, "m1", set()) == []
    tree.now += sup_lowlevel.ORPHAN_FACTS_FRESH / 2
    assert index.of(1, "m1", set()) == []
    assert tree.reads == [7]
    tree.now += sup_lowlevel.ORPHAN_FACTS_FRESH
    assert index.of(1, "m1", set()) == []
    assert tree.reads == [7, 7]  # too old: read again
    del tree.kids[7]  # reaped by someone else; the pid comes back as a dead worker's orphan
    assert index.of(1, "m1", set()) == []
    assert len(index) == 0
    tree.kids[7] = _facts(1)
    assert index.of(1, "m1", set()) == [7]


@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "spawned"])
def test_a_crashed_workers_orphans_are_found_when_the_loop_runs_in_another_thread(
    tmp_path: Any, zygote: bool
) -> None:
    """LADDER-ORPHANS reads the children of the process's leader thread, where the kernel hands orphans:
    with the blocking front the engine's loop (which spawns the workers) runs in a thread of its own,
    and a crashed turn's setsid daemon and child, orphaned to this process, are still found and
    reaped before the result."""
    from supervisor import SyncSupervisor

    pid_file = tmp_path / "pids"
    with SyncSupervisor(workers=1, spares=0, cgroups=False, zygote=zygote) as sup:
        result = sup.run("tests.agents.tree:daemonize_then_crash", {"pid_file": str(pid_file)})
        assert result.outcome == "crashed", result
        assert _alive([int(x) for x in pid_file.read_text().split()]) == []  # before aclose()
