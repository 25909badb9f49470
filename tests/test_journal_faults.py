"""The journal under attack: daemon SIGKILLs under load, a full disk, a read-only remount, a
deleted journal, a frozen filesystem, a small ``--max-queue`` at restart, reused turn ids.

Every test runs a real ``turnpool serve`` (``tests/support/daemonkit.py``) and real agents that count
their own executions (``tests/agents/journal.py``: one line per run in a log file), so "ran
twice" is counted by the agents themselves, not inferred from the daemon's word. Disks are real:
tmpfs and a loop-mounted ext4 image, mounted here (root) and unmounted in teardown.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from supervisor import Client, JournalUnavailable, TurnIdConflict
from supervisor.journal import lock_name, read_history
from tests.support.daemonkit import (
    FAST,
    Served,
    serving,
    short_dir,
    start,
    status,
    stop_process,
    wait_journal_released,
    wait_status,
)
from tests.support.diskkit import fill, run_quiet, tmpfs

pytestmark = pytest.mark.anyio

AGENT = "tests.agents.journal:count"


# ---- real disks ----------------------------------------------------------------------------


@contextlib.contextmanager
def ext4_image(size_mb: int = 64, options: str = "loop") -> Iterator[Path]:
    """A loop-mounted ext4 filesystem (one that ``fsfreeze`` can freeze), unmounted afterwards."""
    home = short_dir()
    image, where = home / "fs.img", home / "mnt"
    where.mkdir()
    try:
        with open(image, "wb") as f:
            f.truncate(size_mb * 1024 * 1024)
        run_quiet("mkfs.ext4", "-q", "-F", str(image))
        run_quiet("mount", "-o", options, str(image), str(where))
    except (OSError, subprocess.CalledProcessError) as exc:
        shutil.rmtree(home, ignore_errors=True)
        pytest.skip(f"this machine cannot loop-mount an ext4 image: {exc}")
    os.chmod(where, 0o700)
    try:
        yield where
    finally:
        thaw(where)
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=60)
        shutil.rmtree(home, ignore_errors=True)


def thaw(where: Path) -> None:
    subprocess.run(["fsfreeze", "-u", str(where)], capture_output=True, timeout=60)


def trigger_fs_error(where: Path) -> None:
    """A real ext4 error on the filesystem at ``where`` (its sysfs test hook)."""
    source = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE", str(where)], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    Path(f"/sys/fs/ext4/{Path(source).name}/trigger_fs_error").write_text("turnpool test\n")


def repair(image: Path) -> None:
    subprocess.run(["e2fsck", "-fy", str(image)], capture_output=True, timeout=120)


def runs(log: Path) -> collections.Counter[str]:
    """How many times each turn id ran, as its agent counted."""
    if not log.exists():
        return collections.Counter()
    return collections.Counter(line for line in log.read_text().splitlines() if line)


# ---- item 2: SIGKILL under load --------------------------------------------------------------


async def _round(
    served: Served,
    ids: list[str],
    log: Path,
    retry_ids: set[str],
    acked: set[str],
    kill_after: int,
    freeze: Path | None,
) -> None:
    """Submit ``ids`` concurrently; once ``kill_after`` of them are acknowledged, SIGKILL the
    daemon (with ``freeze``: freeze that filesystem first, so journal writes stall)."""
    reached = anyio.Event()
    n = 0

    async def one(client: Client, tid: str) -> None:
        nonlocal n
        try:
            await client.submit(AGENT, {"log": str(log), "ms": 2}, turn_id=tid, retry=tid in retry_ids)
        except Exception:  # noqa: BLE001 - the daemon died under this submit: its ack is lost
            return
        acked.add(tid)
        n += 1
        if n >= kill_after:
            reached.set()

    async with (
        Client.connect(served.endpoint, request_timeout=60) as client,
        anyio.create_task_group() as tg,
    ):
        for tid in ids:
            tg.start_soon(one, client, tid)
        with anyio.move_on_after(60):
            await reached.wait()
        if freeze is not None:
            run_quiet("fsfreeze", "-f", str(freeze))
            before = len(runs(log))
            # Turns may go on running while the journal is frozen (the bug): give them the
            # chance, bounded; with the gate nothing new starts and this times out.
            with anyio.move_on_after(1.0):
                while len(runs(log)) < before + 20:  # noqa: ASYNC110 — a file, not an event
                    await anyio.sleep(0.01)  # allowed: polling the agents' own log, bounded
        served.proc.kill()
        if freeze is not None:
            run_quiet("fsfreeze", "-u", str(freeze))  # a task stuck on the frozen disk dies after the thaw
        served.proc.wait(timeout=60)
        stop_process(served.proc)
        tg.cancel_scope.cancel()


async def _kill_under_load(where: Path, rounds: int, per_round: int, freeze: bool) -> None:
    journal = where / "journal.sqlite3"
    log = where / "runs.log"
    home = short_dir()
    rng = random.Random(1313)
    all_ids: list[str] = []
    retry_ids: set[str] = set()
    acked: set[str] = set()
    try:
        for r in range(rounds):
            new = [f"r{r}-{i}" for i in range(per_round)]
            retry_ids.update(t for t in new if rng.random() < 0.2)
            all_ids.extend(new)
            # Lost acks are retried with the same turn_id (and input); some acked ids are re-sent too.
            again = [t for t in all_ids[:-per_round] if t not in acked or rng.random() < 0.05]
            wait_journal_released(journal)  # the last round's daemon was SIGKILLed: its writer dies after it
            served = start(*FAST, "--journal", str(journal), home=home)
            await _round(
                served,
                new + again,
                log,
                retry_ids,
                acked,
                rng.randint(20, per_round // 2),
                where if freeze else None,
            )
        wait_journal_released(journal)
        served = start(*FAST, "--journal", str(journal), home=home)
        try:
            async with Client.connect(served.endpoint, request_timeout=60) as client:
                with anyio.fail_after(240):
                    results = {}
                    for tid in sorted(acked):  # every acknowledged id is known and ends
                        results[tid] = await client.handle(tid).result()
                    for tid in all_ids:
                        if tid not in acked:
                            h = await client.submit(
                                AGENT, {"log": str(log), "ms": 2}, turn_id=tid, retry=tid in retry_ids
                            )
                            results[tid] = await h.result()
        finally:
            stop_process(served.proc)
        counted = runs(log)
        twice = {t: c for t, c in counted.items() if t not in retry_ids and c > 1}
        assert not twice, f"turns without retry=True ran more than once: {twice}"
        for tid, res in results.items():
            assert res.outcome in ("completed", "crashed"), res
            if res.outcome == "completed":
                assert 1 <= counted[tid] <= res.attempts, (tid, counted[tid], res)
            if tid not in retry_ids and res.outcome == "crashed":
                assert res.error is not None and res.error.type == "SupervisorLost"
        assert set(results) == set(all_ids)
        rows = read_history(journal, limit=100_000)
        assert {r["turn_id"] for r in rows} == set(all_ids)
        assert all(r["state"] == "ended" for r in rows)
    finally:
        shutil.rmtree(home, ignore_errors=True)


async def test_sigkill_under_load_never_runs_an_acknowledged_turn_twice() -> None:
    """JOURNAL-GATE (issue 13 item 2): SIGKILL the daemon at random points under load, six times,
    restarting each time; lost acks are retried with the same turn_id. Every acknowledged id ends
    exactly once, no turn without ``retry=True`` runs twice (the agents count their own runs), a
    completed turn ran at most ``attempts`` times."""
    where = short_dir()
    try:
        await _kill_under_load(where, rounds=6, per_round=300, freeze=False)
    finally:
        shutil.rmtree(where, ignore_errors=True)


async def test_sigkill_with_a_frozen_journal_disk_never_runs_a_turn_twice() -> None:
    """JOURNAL-GATE: the journal's filesystem is frozen (``fsfreeze``) just before each SIGKILL, so journal
    commits stall: a turn must not reach a worker before its rows are committed, so nothing runs
    twice after the restart (before the fix nearly every kill produced a duplicate)."""
    with ext4_image() as where:
        await _kill_under_load(where, rounds=3, per_round=200, freeze=True)


# ---- item 3: write failures ------------------------------------------------------------------


def _metric(served: Served, name: str) -> float:
    with urllib.request.urlopen(served.metrics_url, timeout=30) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


async def test_full_disk_refuses_submits_then_recovers() -> None:
    """JOURNAL-UNAVAILABLE (item 3): the journal's tmpfs fills up. Submits get ``JournalUnavailable`` (never
    an ack for what is not durable), status says ``accepting`` false with the journal's error, the metric
    ``turnpool_journal_available`` is 0; a refused turn never runs. When space is freed the daemon writes and
    acknowledges again, and everything acknowledged survives a SIGKILL."""
    with tmpfs("3m") as where:
        journal, log = where / "journal.sqlite3", where / "runs.log"
        home = short_dir()
        served = start(*FAST, "--journal", str(journal), "--metrics-port", "0", home=home)
        try:
            async with Client.connect(served.endpoint) as client:
                with anyio.fail_after(60):
                    before = [await client.run(AGENT, {"log": str(log)}, turn_id=f"ok{i}") for i in range(3)]
                assert all(r.outcome == "completed" for r in before)
                filler = fill(where)
                big = {"log": str(log), "pad": "x" * 300_000}
                with anyio.fail_after(60), pytest.raises(JournalUnavailable, match="journal"):
                    await client.submit(AGENT, big, turn_id="refused")
                st = await wait_status(served, lambda s: s["daemon"]["journal_error"])
                assert st["daemon"]["accepting"] is False and "journal" in st["daemon"]["journal_error"]
                assert _metric(served, "turnpool_journal_available") == 0
                with anyio.fail_after(60), pytest.raises(JournalUnavailable):
                    await client.submit(AGENT, {"log": str(log)}, turn_id="refused-small")
                filler.unlink()
                await wait_status(served, lambda s: s["daemon"]["accepting"])
                assert _metric(served, "turnpool_journal_available") == 1
                with anyio.fail_after(60):
                    after = await client.run(AGENT, {"log": str(log)}, turn_id="refused-small")
                assert after.outcome == "completed" and after.attempts == 1
                # A result leaves once its end row is handed to the writer, not once committed
                # (guarantees, "Known limits"): wait for the row, so the kill below tests what is
                # recorded, not that race.
                await _in_journal(journal, "refused-small", "ended")
        finally:
            served.proc.kill()
            served.proc.wait(timeout=60)
            stop_process(served.proc)
        assert runs(log) == collections.Counter({"ok0": 1, "ok1": 1, "ok2": 1, "refused-small": 1})
        again = start(*FAST, "--journal", str(journal), home=home)
        try:
            async with Client.connect(again.endpoint) as client:
                with anyio.fail_after(60):
                    for tid in ("ok0", "ok1", "ok2", "refused-small"):
                        assert (await client.handle(tid).result()).outcome == "completed"
        finally:
            stop_process(again.proc)
            shutil.rmtree(home, ignore_errors=True)


async def test_read_only_remount_refuses_submits_and_loses_no_acknowledged_turn() -> None:
    """JOURNAL-UNAVAILABLE: the journal's ext4 filesystem remounts itself read-only after an error (as with
    ``errors=remount-ro``; ``trigger_fs_error`` raises a real one). Submits get
    ``JournalUnavailable`` and status shows the error; SIGTERM still ends the daemon (bounded),
    non-zero, saying the journal could not be written. After a repair (fsck) and a restart every
    acknowledged turn ends exactly once; the refused one never ran.

    (A plain ``mount -o remount,ro`` is refused by the kernel while SQLite holds the file open
    for writing, so the emergency read-only remount is the one a running daemon can meet. It
    aborts the filesystem's own journal, dropping writes not yet synced, as a power loss does: so
    the daemon runs with ``--durability full``; with ``normal`` the last commits can be lost here.)"""
    with ext4_image(options="loop,errors=remount-ro") as where:
        journal, log = where / "journal.sqlite3", Path(short_dir()) / "runs.log"
        home = short_dir()
        served = start(*FAST, "--journal", str(journal), "--durability", "full", home=home)
        try:
            async with Client.connect(served.endpoint) as client:
                with anyio.fail_after(60):
                    ok = [await client.run(AGENT, {"log": str(log)}, turn_id=f"ok{i}") for i in range(3)]
                    queued = await client.submit(AGENT, {"log": str(log), "ms": 2000}, turn_id="long")
                await _in_journal(journal, ok[-1].turn_id, "ended")
                # No write in flight at the error: a commit racing the filesystem's abort can be
                # reported durable by fdatasync and still be lost (see docs/guarantees.md).
                await _in_journal(journal, "long", "running")
                trigger_fs_error(where)
                with anyio.fail_after(60), pytest.raises(JournalUnavailable, match="journal"):
                    await client.submit(AGENT, {"log": str(log)}, turn_id="refused")
                st = await status(served)
                assert st["daemon"]["accepting"] is False and "journal" in st["daemon"]["journal_error"]
                shown = served.cli("status")  # piped: tab-separated facts (CLI-PLAIN)
                assert "accepting\tno\n" in shown.stdout and "journal_error\t" in shown.stdout, shown
            served.signal(signal.SIGTERM)
            assert served.wait(timeout=60) != 0
            assert "could not be written" in served.stderr()
        finally:
            stop_process(served.proc)
        run_quiet("umount", str(where))
        repair(where.parent / "fs.img")
        run_quiet("mount", "-o", "loop", str(where.parent / "fs.img"), str(where))
        again = start(*FAST, "--journal", str(journal), home=home)
        try:
            async with Client.connect(again.endpoint) as client:
                with anyio.fail_after(60):
                    for r in ok:
                        assert await client.handle(r.turn_id).result() == r
                    assert (await client.handle(queued.turn_id).result()).outcome in ("completed", "crashed")
                    with pytest.raises(Exception, match="unknown turn"):
                        await client.handle("refused").result()
        finally:
            stop_process(again.proc)
            shutil.rmtree(home, ignore_errors=True)
        counted = runs(log)
        assert "refused" not in counted and all(c == 1 for c in counted.values()), counted
        shutil.rmtree(log.parent, ignore_errors=True)


async def _in_journal(journal: Path, turn_id: str, state: str) -> None:
    with anyio.fail_after(30):
        while not any(  # noqa: ASYNC110 — a file, not an event
            r["turn_id"] == turn_id and r["state"] == state for r in read_history(journal)
        ):
            await anyio.sleep(0.02)  # allowed: polling the journal file for the end row, bounded


async def test_deleted_journal_is_noticed_and_its_path_stays_locked() -> None:
    """JOURNAL-UNAVAILABLE: the journal file is deleted under a live daemon. A second daemon on the same path
    is still refused (the lock is not a file); the first daemon's next write notices the deletion: the submit
    gets ``JournalUnavailable`` and the daemon stops with exit code 3 and a message."""
    home = short_dir()
    journal = home / "journal.sqlite3"
    served = start(*FAST, "--journal", str(journal), home=home)
    try:
        async with Client.connect(served.endpoint) as client:
            with anyio.fail_after(60):
                done = await client.run(AGENT, {"log": "/dev/null"})
            await _in_journal(journal, done.turn_id, "ended")  # no write is pending when the file goes
            for side in (journal, Path(f"{journal}-wal"), Path(f"{journal}-shm"), Path(f"{journal}.lock")):
                side.unlink(missing_ok=True)
            second = served.cli(
                "serve", *FAST, "--journal", str(journal), "--endpoint", f"ipc://{home}/2.sock"
            )
            assert second.returncode == 1
            assert f"locked by another live daemon (pid {served.pid})" in second.stderr
            with anyio.fail_after(60), pytest.raises(JournalUnavailable, match="deleted"):
                await client.submit(AGENT, {"log": "/dev/null"})
        assert served.wait(timeout=60) == 3
        assert "deleted" in served.stderr()
    finally:
        stop_process(served.proc)
        shutil.rmtree(home, ignore_errors=True)


async def test_sigterm_ends_the_daemon_in_bounded_time_with_a_frozen_journal_disk() -> None:
    """JOURNAL-UNAVAILABLE: the journal's filesystem is frozen (``fsfreeze``) with turns in flight. SIGTERM
    ends the daemon within a bound (drain 0 + worker stop + the 5 s journal close bound + margin), and it says
    that the journal could not be written."""
    with ext4_image() as where:
        journal = where / "journal.sqlite3"
        home = short_dir()
        served = start(*FAST, "--journal", str(journal), home=home)
        try:
            async with Client.connect(served.endpoint) as client:
                with anyio.fail_after(60):
                    await client.run(AGENT, {"log": "/dev/null"})
                run_quiet("fsfreeze", "-f", str(where))
                with anyio.move_on_after(1.0):  # this submit's commit stalls on the frozen disk
                    await client.submit(AGENT, {"log": "/dev/null"})
            t0 = time.monotonic()
            served.signal(signal.SIGTERM)
            try:
                code = served.wait(timeout=30)
            except subprocess.TimeoutExpired:
                code = None
            took = time.monotonic() - t0
            assert code is not None, "SIGTERM did not end the daemon within 30 s with a frozen disk"
            assert code != 0 and took < 20, (code, took)
            assert "could not be written" in served.stderr()
        finally:
            thaw(where)
            stop_process(served.proc)
            shutil.rmtree(home, ignore_errors=True)


def test_journal_lock_is_an_abstract_socket_not_a_file(tmp_path: Path) -> None:
    """JOURNAL-UNAVAILABLE: the single-daemon lock is an abstract unix socket named from the journal's real
    path: nothing on disk to delete."""
    name = lock_name(tmp_path / "j.sqlite3")
    assert name.startswith(b"\0")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.bind(name)  # free now: nobody holds it
    finally:
        probe.close()


# ---- item 4: --max-queue at restart ----------------------------------------------------------


async def test_restart_readmits_more_queued_turns_than_max_queue() -> None:
    """JOURNAL-RECOVERY (item 4): the journal holds more queued turns than the restarted daemon's
    ``--max-queue``: it starts anyway and runs every one of them (they were acknowledged)."""
    home = short_dir()
    journal, log = home / "journal.sqlite3", home / "runs.log"
    served = start(*FAST, "--workers", "1", "--journal", str(journal), home=home)
    try:
        async with Client.connect(served.endpoint) as client:
            blocker = await client.submit("examples.agents:slow", {"seconds": 600})
            with anyio.fail_after(30):
                while (await client.status())["running"] < 1:  # noqa: ASYNC110 — a request per loop
                    await anyio.sleep(0.02)  # allowed: polling status until the blocker runs, bounded
            ids = [(await client.submit(AGENT, {"log": str(log)}, session="q")).turn_id for _ in range(8)]
            assert blocker.turn_id
    finally:
        served.proc.kill()  # the queued turns stay queued in the journal
        served.proc.wait(timeout=60)
        stop_process(served.proc)
    again = start(*FAST, "--workers", "1", "--max-queue", "2", "--journal", str(journal), home=home)
    try:
        async with Client.connect(again.endpoint) as client:
            with anyio.fail_after(120):
                results = [await client.handle(t).result() for t in ids]
        assert [r.outcome for r in results] == ["completed"] * 8
        assert runs(log) == collections.Counter({t: 1 for t in ids})
    finally:
        stop_process(again.proc)
        shutil.rmtree(home, ignore_errors=True)


# ---- item 12: reused ids -----------------------------------------------------------------


async def test_reused_evicted_turn_id_is_the_existing_turn_across_a_restart() -> None:
    """JOURNAL-LOOKUP (item 12): with ``--keep-results 1`` a finished turn's id is evicted from memory. The
    same id submitted again (same agent and input) is the existing turn, answered from the journal
    and never run again; with another input it is refused, never acknowledged and lost. After a
    SIGKILL and restart the id still gives its one result."""
    home = short_dir()
    journal, log = home / "journal.sqlite3", home / "runs.log"
    served = start(*FAST, "--keep-results", "1", "--journal", str(journal), home=home)
    try:
        async with Client.connect(served.endpoint) as client:
            with anyio.fail_after(60):
                first = await client.run(AGENT, {"log": str(log)}, turn_id="reused")
                await client.run(AGENT, {"log": str(log)}, turn_id="other")  # evicts "reused"
                again = await client.submit(AGENT, {"log": str(log)}, turn_id="reused")
                assert await again.result() == first
                with pytest.raises(TurnIdConflict, match="its input differs"):
                    await client.submit(AGENT, {"log": str(log), "ms": 50}, turn_id="reused")
    finally:
        served.proc.kill()
        served.proc.wait(timeout=60)
        stop_process(served.proc)
    restarted = start(*FAST, "--keep-results", "1", "--journal", str(journal), home=home)
    try:
        async with Client.connect(restarted.endpoint) as client:
            with anyio.fail_after(60):
                assert await client.handle("reused").result() == first
        assert runs(log) == collections.Counter({"reused": 1, "other": 1})
    finally:
        stop_process(restarted.proc)
        shutil.rmtree(home, ignore_errors=True)


# ---- item 13: modes ------------------------------------------------------------------------


async def test_journal_files_are_private_and_open_directories_are_refused() -> None:
    """SEC-JOURNAL: the journal and its ``-wal``/``-shm`` side files are 0600 whatever the umask; a
    journal directory that other users can read or write is refused with a clear message."""
    home = short_dir()
    journal = home / "journal.sqlite3"
    old = os.umask(0o022)
    try:
        with serving(*FAST, "--journal", str(journal)) as served:
            async with Client.connect(served.endpoint) as client:
                with anyio.fail_after(60):
                    await client.run(AGENT, {"log": "/dev/null"})
            for side in (journal, Path(f"{journal}-wal"), Path(f"{journal}-shm")):
                assert side.exists(), side
                assert stat.S_IMODE(side.stat().st_mode) == 0o600, (side, oct(side.stat().st_mode))
            shared = served.home / "shared"
            shared.mkdir(mode=0o755)
            os.chmod(shared, 0o755)
            refused = served.cli(
                "serve",
                *FAST,
                "--journal",
                str(shared / "j.sqlite3"),
                "--endpoint",
                f"ipc://{served.home}/x.sock",
            )
            assert refused.returncode == 1 and "readable or writable by other users" in refused.stderr
            assert not (shared / "j.sqlite3").exists()
    finally:
        os.umask(old)
        shutil.rmtree(home, ignore_errors=True)


def test_journal_unavailable_is_public_and_has_its_wire_code() -> None:
    """JOURNAL-UNAVAILABLE: ``JournalUnavailable`` is exported from ``supervisor`` and the client turns the
    daemon's ``journal_unavailable`` error code into it."""
    import supervisor
    from supervisor.client.client import _error
    from wire import client_link

    assert "JournalUnavailable" in supervisor.__all__ and "journal_unavailable" in client_link.ERROR_CODES
    err = _error(
        client_link.Error(1, "journal_unavailable", "cannot write the journal: disk full"),
        None,
        "ipc://x",
    )
    assert isinstance(err, JournalUnavailable) and "disk full" in str(err)


async def test_lost_ack_retried_after_a_restart_runs_once() -> None:
    """JOURNAL-ACK/JOURNAL-GATE/JOURNAL-LOOKUP: a submit whose commit stalls (the journal's filesystem frozen)
    is not acknowledged, nor is a repeat of its id meanwhile, and the turn does not run. The daemon is
    SIGKILLed; the client, never having seen an ack, submits the same turn_id after the restart: it runs
    exactly once (before the fix it had already run unacknowledged, and ran again)."""
    with ext4_image() as where:
        journal = where / "journal.sqlite3"
        logdir = short_dir()
        log = logdir / "runs.log"
        home = short_dir()
        served = start(*FAST, "--journal", str(journal), home=home)
        acks: list[str] = []
        try:
            async with Client.connect(served.endpoint, request_timeout=60) as client:
                with anyio.fail_after(60):
                    await client.run(AGENT, {"log": str(log)}, turn_id="warm")
                run_quiet("fsfreeze", "-f", str(where))

                async def submit() -> None:
                    h = await client.submit(AGENT, {"log": str(log)}, turn_id="lost")
                    acks.append(h.turn_id)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(submit)
                    tg.start_soon(submit)  # the same id again while the first is not durable
                    with anyio.move_on_after(1.0):  # unacknowledged, it must not run: give it the chance
                        while "lost" not in runs(log):  # noqa: ASYNC110 — a file, not an event
                            await anyio.sleep(0.01)  # allowed: polling the agent's own log, bounded
                    served.proc.kill()
                    run_quiet("fsfreeze", "-u", str(where))
                    served.proc.wait(timeout=60)
                    tg.cancel_scope.cancel()
        finally:
            thaw(where)
            stop_process(served.proc)
        assert acks == []
        wait_journal_released(journal)  # its writer, stuck on the frozen disk, dies after the thaw
        again = start(*FAST, "--journal", str(journal), home=home)
        try:
            async with Client.connect(again.endpoint) as client:
                with anyio.fail_after(60):
                    h = await client.submit(AGENT, {"log": str(log)}, turn_id="lost")
                    assert (await h.result()).outcome == "completed"
        finally:
            stop_process(again.proc)
            shutil.rmtree(home, ignore_errors=True)
        assert runs(log) == collections.Counter({"warm": 1, "lost": 1})
        shutil.rmtree(logdir, ignore_errors=True)


def test_an_id_already_in_the_journal_is_reported_never_silently_kept(tmp_path: Path) -> None:
    """JOURNAL-LOOKUP (item 12): recording a turn whose id the journal already holds does not report a commit
    (which would acknowledge a turn that will not run): the accept row reports a conflict."""
    import threading
    from types import SimpleNamespace

    from supervisor.journal import Journal

    journal = Journal.open(tmp_path / "j.sqlite3")
    try:
        outcomes: list[tuple[str, object]] = []
        done = threading.Event()

        def turn(input: bytes) -> SimpleNamespace:
            return SimpleNamespace(
                id="same",
                agent="a:b",
                input=input,
                session=None,
                parent=None,
                timeout=None,
                grace=1.0,
                kill_after=1.0,
                retry=False,
                attempts=1,
            )

        journal.accepted(
            turn(b"\x01"),
            lambda: outcomes.append(("committed", None)),
            lambda why, conflict: outcomes.append(("failed", conflict)),
        )
        journal.accepted(
            turn(b"\x02"),
            lambda: outcomes.append(("committed", None)),
            lambda why, conflict: (outcomes.append(("failed", conflict)), done.set()),
        )
        assert done.wait(30)
        assert outcomes == [("committed", None), ("failed", True)]
        assert read_history(tmp_path / "j.sqlite3")[0]["state"] == "queued"
    finally:
        journal.close()
