"""LADDER-PROOF: a dead worker whose tree is provably gone is reaped without a listing of the
supervisor's children; where it is not provably gone, what it left is still found before the result.

The proof (``reaper.left_nothing``): the worker's cgroup is empty, no process maps the page every fork
of the worker inherited, its process group is empty and no zombie waits among our children. Each test
below either counts the listings (the behaviour that changed) or makes a tree that an empty cgroup
alone would wrongly call gone: they failed with a skip on the cgroup alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from supervisor import Supervisor
from supervisor import lowlevel as sup_lowlevel
from worker import proctree

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not proctree.cgroups_usable(), reason="no writable cgroup v2 hierarchy here"),
]

BOUND = 60.0


def _pids(pid_file: Path) -> list[int]:
    return [int(x) for x in pid_file.read_text().split()]


async def _kill_one(sup: Supervisor, agent: str, inp: Any) -> Any:
    handle = await sup.submit(agent, inp)
    async for _ in handle.events():
        break
    await handle.cancel()
    return await handle.result()


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = sup_lowlevel.orphans.adopted

    def counted() -> list[int]:
        calls.append(1)
        return real()

    monkeypatch.setattr(sup_lowlevel.orphans, "adopted", counted)
    return calls


async def test_a_killed_worker_that_left_nothing_costs_no_listing_of_our_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five spinners killed at the SIGTERM step, one after the other: none left a process, and none of
    the five exits lists the supervisor's children (one listing each before)."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=2, spares=0, grace=0.05, kill_after=2.0) as sup:
            listings = _counting(monkeypatch)
            for _ in range(5):
                result = await _kill_one(sup, "benchmarks._agents:spin", None)
                assert result.outcome == "killed", result
            assert listings == [], f"{len(listings)} listings of our children for 5 kills"


async def test_an_escapee_made_at_the_sigterm_step_is_found_before_the_result(tmp_path: Path) -> None:
    """The agent's own SIGTERM handler makes a ``fork → setsid → fork`` grandchild that moves itself to
    the root cgroup and closes every descriptor, after the SIGTERM step listed the tree: the worker's
    cgroup is empty when it is reaped, yet the grandchild maps the worker's proof page, so it is looked
    for (by its tree marker's mapping) and is not alive when ``killed`` arrives."""
    pid_file = tmp_path / "pids"
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0, grace=0.05, kill_after=2.0) as sup:
            result = await _kill_one(sup, "tests.agents.tree:escape_at_sigterm", {"pid_file": str(pid_file)})
            assert result.outcome == "killed", result
            escapee = _pids(pid_file)
            alive = [p for p in escapee if psutil.pid_exists(p)]
            for pid in alive:  # the test's own clean-up, if the promise broke
                psutil.Process(pid).kill()
            assert alive == [], "the escapee outlived its killed turn"


async def test_a_zombie_left_at_the_sigterm_step_is_reaped_before_the_result(tmp_path: Path) -> None:
    """The agent's own SIGTERM handler forks a child that exits at once, and the worker dies without
    reaping it: its cgroup is empty and nothing maps the page, but the zombie is ours, and it is reaped
    before ``killed`` arrives."""
    pid_file = tmp_path / "pids"
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0, grace=0.05, kill_after=2.0) as sup:
            result = await _kill_one(sup, "tests.agents.tree:zombie_at_sigterm", {"pid_file": str(pid_file)})
            assert result.outcome == "killed", result
            assert pid_file.exists(), result
            assert [p for p in _pids(pid_file) if psutil.pid_exists(p)] == []


async def test_a_worker_started_as_a_fresh_interpreter_is_never_taken_as_proved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the zygote a worker has no proof page (and a guardian of its own): its exit is always
    followed by the listing."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0, zygote=False, grace=0.05, kill_after=2.0) as sup:
            listings = _counting(monkeypatch)
            result = await _kill_one(sup, "benchmarks._agents:spin", None)
            assert result.outcome == "killed", result
            assert listings, "a worker without a proof page was taken as proved"
