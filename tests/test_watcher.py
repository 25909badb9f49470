"""TREE-WATCHER: the workers a zygote forks are watched by one process of the pool, not by a guardian
process each (what each guardian promised is proven in test_supervisor_death.py and
test_tree_cleanup.py, which run with the zygote by default)."""

from __future__ import annotations

import anyio
import psutil
import pytest

from supervisor import Supervisor

pytestmark = pytest.mark.anyio


async def test_zygote_forked_workers_share_one_watcher_and_fork_no_guardian() -> None:
    with anyio.fail_after(60):
        async with Supervisor(workers=4, spares=0) as sup:
            assert sup.pool.zygote is not None
            workers = [w["pid"] for w in (await sup.status())["workers"]]
            assert len(workers) == 4
            for pid in workers:
                assert psutil.Process(pid).children() == [], "a worker forked a guardian"
            # (Besides it, the zygote may have a short-lived child: the fork of its next embryo.)
            children = {c.pid for c in psutil.Process(sup.pool.zygote.pid).children()}
            watchers = children & sup.pool.zygote.embryos  # reaped with the embryos at the end
            assert len(watchers) == 1, (children, sup.pool.zygote.embryos)
            watcher = watchers.pop()
        assert not psutil.pid_exists(watcher)


async def test_workers_started_as_fresh_interpreters_keep_their_guardian() -> None:
    with anyio.fail_after(60):
        async with Supervisor(workers=2, spares=0, zygote=False) as sup:
            for w in (await sup.status())["workers"]:
                assert len(psutil.Process(w["pid"]).children()) == 1  # its guardian
