"""What an agent touches in its worker stays its own (SEC-WORKER-FILES, WORKER-CWD, WORKER-REBIND in
``docs/design.md``).

An agent runs as the supervisor's user. These tests play the agent that goes after what other
workers and the engine keep: another worker's start marker and End log (to forge the end of a turn
it does not run), everything in its working directory (``rm -rf ./*``), and the engine's private
directory deleted from outside (a temp cleaner).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import urllib.request
from pathlib import Path

import anyio
import pytest

from supervisor import Supervisor
from supervisor import lowlevel as sup_lowlevel
from tests.support import daemonkit
from tests.support.events import first_event

pytestmark = pytest.mark.anyio

BOUND = 60


@pytest.mark.parametrize("zygote", [True, False])
async def test_an_agent_cannot_forge_the_end_of_another_workers_turn(zygote: bool) -> None:
    """Promise: an agent that looks for another worker's start marker and End log - in its cwd, in
    every directory its own, that worker's and the supervisor's command lines name, and among that
    worker's and the supervisor's open descriptors (``/proc/<pid>/fd``) - finds nothing to write
    into; when it SIGKILLs that worker, the other user's turn ends ``crashed`` (signal 9), never
    ``completed`` with the forged output."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=2, spares=0, zygote=zygote, prefetch=1) as sup:
            victim = await sup.submit("tests.agents.own:wait_long")
            await first_event(victim)
            slot = next(s for s in sup.pool.slots.values() if s.turn is not None)
            attack = await sup.run("tests.agents.own:forge", {"victim_pid": slot.pid, "victim_id": slot.id})
            assert attack.outcome == "completed", attack
            result = await victim.result()
            assert (result.outcome, result.exit_code, result.output) == ("crashed", -9, None), result
            assert attack.output == {"forged": [], "marker_found": False}, attack.output
            # The pool goes on: the killed worker is replaced.
            assert (await sup.run("examples.agents:echo", {"text": "x"})).outcome == "completed"


@pytest.mark.parametrize("zygote", [True, False])
async def test_an_agent_that_empties_its_cwd_leaves_the_pool_working(zygote: bool) -> None:
    """Promise: each worker's agents run in an empty 0700 directory of that worker's own, not the
    engine's; ``rm -rf ./*`` there removes only what its own agents put there, and the turns after
    it - each on a new worker (``max_turns_per_worker=1``) - complete."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=2, spares=0, zygote=zygote, max_turns_per_worker=1) as sup:
            first = await sup.run("tests.agents.own:leave_files")
            assert first.outcome == "completed", first
            wiped = await sup.run("tests.agents.own:wipe_cwd")
            assert wiped.outcome == "completed", wiped
            for _ in range(4):
                r = await sup.run("examples.agents:echo", {"text": "after"})
                assert r.outcome == "completed", r
            assert wiped.output["cwd"] != first.output  # each worker its own directory
            assert wiped.output["removed"] == []  # a new worker's directory starts empty
            cwd = Path(wiped.output["cwd"])
            assert cwd.parent == sup.pool.work_dir and cwd.parent != sup.pool.runtime_dir
            assert not Path(sup.link.endpoint[len("ipc://") :]).is_relative_to(cwd)
            # A worker's directory goes with the worker (removed off the loop once it is reaped).
            while Path(first.output).exists():  # noqa: ASYNC110, ASYNC240
                await anyio.sleep(0.01)  # allowed: bounded poll of a removal done in a thread
    assert not sup.pool.work_dir.exists() and not sup.pool.runtime_dir.exists()


async def test_while_the_pool_closes_a_reaped_workers_directory_goes_at_once() -> None:
    """WORKER-CWD at ``aclose()``: each idle worker's directory is removed once that worker is reaped,
    while the others still exit (here a stopped worker holds the close), not all at the end after
    the last exit - on a disk where each ``rmdir`` waits for the journal, 512 of them in a row were
    ≈ 0.4 s added to a daemon's SIGTERM. The whole directory is gone when ``aclose()`` returns."""
    with anyio.fail_after(BOUND):
        sup = Supervisor(workers=3, spares=0, stop_timeout=BOUND)
        await sup.start()
        try:
            while sum(1 for w in (await sup.status())["workers"] if w["state"] == "idle" and w["pid"]) < 3:  # noqa: ASYNC110
                await anyio.sleep(0.01)  # allowed: bounded poll until every worker is idle
            held, *others = list(sup.pool.slots.values())
            dirs = [Path(str(s.workdir)) for s in others]
            assert all(d.is_dir() for d in dirs), dirs
            os.kill(held.pid, signal.SIGSTOP)  # it cannot exit until it is continued
            async with anyio.create_task_group() as tg:
                tg.start_soon(sup.aclose)
                try:
                    with anyio.fail_after(BOUND / 4):  # well before the stopped worker's stop_timeout
                        while any(s.id in sup.pool.slots for s in others) or any(d.exists() for d in dirs):  # noqa: ASYNC110
                            await anyio.sleep(0.01)  # allowed: bounded poll of reaps and removals (threads)
                    assert list(sup.pool.slots) == [held.id], "the stopped worker still holds the close"
                finally:
                    os.kill(held.pid, signal.SIGCONT)
        finally:
            await sup.aclose()
    assert sup.pool.work_dir is not None and not sup.pool.work_dir.exists()


@pytest.mark.parametrize("zygote", [True, False])
async def test_the_engine_directory_deleted_from_outside_is_made_again(zygote: bool) -> None:
    """Promise: the engine's private directory (the worker endpoint) and the workers' directories
    deleted from outside while the pool runs (a temp cleaner) are made again and the endpoint bound
    anew before the next worker starts: the workers already connected keep serving, the next
    turns on new workers complete, and ``status()`` counts the re-binding."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=2, spares=0, zygote=zygote, max_turns_per_worker=1) as sup:
            assert (await sup.run("examples.agents:echo", {"text": "before"})).outcome == "completed"
            assert sup.pool.runtime_dir is not None
            # The cleaner removes every directory this supervisor (this process) has there.
            base = sup.pool.runtime_dir.parent
            mine = [p for p in base.iterdir() if p.name.split("-")[1:2] == [str(os.getpid())]]
            assert sup.pool.runtime_dir in mine
            for path in mine:
                shutil.rmtree(path)
            for i in range(4):
                r = await sup.run("examples.agents:echo", {"text": f"after {i}"})
                assert r.outcome == "completed", r
            status = await sup.status()
            assert status["worker_endpoint_rebinds"] >= 1, status
            assert stat.S_IMODE(os.stat(sup.pool.runtime_dir).st_mode) == 0o700


async def test_an_endpoint_that_cannot_be_made_again_is_reported() -> None:
    """Promise: when the engine's private directory cannot be made again (something else now
    stands at its path), no worker is started against a missing endpoint: each start fails with
    the reason in ``status()["last_start_error"]`` and backs off; once the path is free again the
    pool refills and queued turns run."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0, max_turns_per_worker=1) as sup:
            assert (await sup.run("examples.agents:echo", {"text": "before"})).outcome == "completed"
            assert sup.pool.runtime_dir is not None
            shutil.rmtree(sup.pool.runtime_dir)
            sup.pool.runtime_dir.write_text("squatted")
            handle = await sup.submit("examples.agents:echo", {"text": "queued"})
            while "no longer a directory" not in str((await sup.status())["last_start_error"]):  # noqa: ASYNC110
                await anyio.sleep(0.01)  # allowed: bounded poll of the pool's own status
            assert not any(s["state"] in ("idle", "busy") for s in (await sup.status())["workers"])
            sup.pool.runtime_dir.unlink()
            assert (await handle.result()).outcome == "completed"


@pytest.mark.parametrize("zygote", [True, False])
async def test_a_workers_token_and_own_files_are_not_readable_through_proc(zygote: bool) -> None:
    """Promise: a worker's spawn token is not in its ``/proc/<pid>/environ`` (nor on its command
    line), with the zygote or as a fresh interpreter, and its start marker and End log are memory
    files of mode 0 that no descriptor of the worker's or the supervisor's leads to once it runs:
    re-opening one through ``/proc/<pid>/fd`` would need the right to trace the process."""
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0, zygote=zygote) as sup:
            assert (await sup.run("examples.agents:echo", {"text": "x"})).outcome == "completed"
            slot = next(iter(sup.pool.slots.values()))
            for name in ("environ", "cmdline"):
                with open(f"/proc/{slot.pid}/{name}", "rb") as f:  # noqa: ASYNC230 - /proc, instant
                    assert slot.token.encode() not in f.read(), name
            for pid in (slot.pid, os.getpid()):
                links = _fd_links(pid)
                assert not [t for t in links if "-started" in t or "-ends" in t], (pid, links)


def _fd_links(pid: int) -> list[str]:
    """What ``pid``'s open descriptors point at (one closed while listed is skipped)."""
    links = []
    for n in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{n}"))
        except FileNotFoundError:
            continue
    return links


def test_own_files_have_mode_zero_and_hold_no_descriptor() -> None:
    """SEC-WORKER-FILES, as policy: a worker's own file is born with mode 0 (no re-open through ``/proc``
    without the right to trace its holder), and a mapping of it keeps no descriptor (Python's
    ``mmap.mmap`` would keep a duplicate open)."""
    from worker import lowlevel

    fd = lowlevel.own_file("w0-ends", lowlevel.ENDLOG_SIZE)
    try:
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0
        before = set(os.listdir("/proc/self/fd"))
        view = lowlevel.own_file_view(fd, lowlevel.ENDLOG_SIZE)
        assert set(os.listdir("/proc/self/fd")) <= before
        view.close()
    finally:
        os.close(fd)


def test_a_daemon_survives_a_wiped_cwd_and_an_emptied_runtime_dir() -> None:
    """Promise, through ``turnpool serve``: an agent's ``rm -rf ./*`` and a temp cleaner that empties the
    daemon's runtime directory (``$XDG_RUNTIME_DIR/turnpool``: the engine's and the workers' directories)
    leave the daemon running turns, each on a new worker (``--max-turns-per-worker 1``); its metrics count
    the re-binding."""
    served = daemonkit.start(*daemonkit.FAST, "--max-turns-per-worker", "1", "--metrics-port", "0")
    try:
        out = served.cli("submit", "tests.agents.own:wipe_cwd", "--wait")
        assert out.returncode == 0 and json.loads(out.stdout)["outcome"] == "completed", out
        runtime = served.home / "turnpool"
        assert any(p.name.startswith("sup-") for p in runtime.iterdir())
        for path in list(runtime.iterdir()):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        for i in range(3):
            out = served.cli("submit", "examples.agents:echo", "--input", json.dumps({"text": i}), "--wait")
            assert out.returncode == 0 and json.loads(out.stdout)["outcome"] == "completed", out
        with urllib.request.urlopen(served.metrics_url, timeout=30) as reply:
            metrics = reply.read().decode()
        assert re.search(r"^turnpool_worker_endpoint_rebinds_total [1-9]", metrics, re.M), metrics
    finally:
        daemonkit.stop_process(served.proc)


def test_remove_tree_takes_empty_and_full_directories_and_follows_no_link(tmp_path: Path) -> None:
    """WORKER-CWD: the pool's directory with its workers' - most empty (one ``rmdir`` each), some with
    what agents left, one a symlink out - is removed whole; nothing behind a link is touched."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    pool = tmp_path / "work"
    pool.mkdir()
    for i in range(20):
        (pool / f"w{i}").mkdir()
    (pool / "w3" / "sub").mkdir()
    (pool / "w3" / "sub" / "file").write_text("left")
    (pool / "w4" / "link").symlink_to(outside)
    (pool / "w5").rmdir()
    (pool / "w5").symlink_to(outside)
    sup_lowlevel.remove_tree(str(pool))
    assert not pool.exists()
    assert (outside / "keep").read_text() == "x"
    empty = tmp_path / "empty"
    empty.mkdir()
    sup_lowlevel.remove_tree(str(empty))
    assert not empty.exists()


async def test_an_idle_worker_removes_its_own_empty_directory_as_it_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """WORKER-CWD at ``aclose()``: an idle zygote-forked worker whose agents left its directory empty removes
    it itself as it exits (WORKER-QUICK-EXIT), in parallel with the other exits, so none is left to the
    supervisor's thread, which removed them one after another after each reap; a directory an agent left
    something in is still removed by the supervisor, and the pool's directory is gone at the end."""
    reaper = sup_lowlevel.reaper
    left_for_us: list[bool] = []
    real = reaper._remove_all

    def recorded(paths: list[str]) -> None:
        left_for_us.extend(os.path.lexists(p) for p in paths)
        real(paths)

    monkeypatch.setattr(reaper, "_remove_all", recorded)
    n = 4
    with anyio.fail_after(BOUND):
        sup = Supervisor(workers=n, spares=0)
        await sup.start()
        try:
            result = await sup.run("tests.agents.own:leave_files")
            assert result.outcome == "completed", result
            while sum(1 for w in (await sup.status())["workers"] if w["state"] == "idle" and w["pid"]) < n:  # noqa: ASYNC110
                await anyio.sleep(0.01)  # allowed: bounded poll until every worker is idle
        finally:
            await sup.aclose()
    assert len(left_for_us) == n
    assert sum(left_for_us) == 1, (
        f"{sum(left_for_us)} of {n} directories were left for the supervisor to remove"
    )
    assert sup.pool.work_dir is not None and not sup.pool.work_dir.exists()
