"""Step records when the journal's disk fills (LOOP-STEP-DURABLE, JOURNAL-UNAVAILABLE): a daemon's journal on
a small tmpfs that fills while a ``retry=True`` turn of ``tests/agents/durable.py`` records its steps.

A record is acknowledged only once committed, so no tool runs on a record the disk refused; what was
committed before stays; the daemon answers meanwhile and writes again when space returns; a SIGKILL
while the disk is full resumes from what was committed; a turn that waits past its timeout ends
with that outcome."""

from __future__ import annotations

import resource
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from supervisor import Client, JournalUnavailable
from supervisor.journal import read_history
from supervisor.journal.steps import view_steps
from tests.support.daemonkit import Served, short_dir, start, status, stop_process, wait_status
from tests.support.diskkit import fill, tmpfs
from tests.support.durablekit import AGENT, ARGS, lines, result_on_a_new_daemon

pytestmark = pytest.mark.anyio


async def _until_file(path: Path) -> None:
    with anyio.fail_after(60):
        while not path.exists():  # noqa: ASYNC110, ASYNC240 - a file the agent makes: no event to wait on
            await anyio.sleep(0.02)  # allowed: pacing a bounded wait for the agent's file


async def _writes_again(served: Served, client: Client) -> None:
    """The journal took its rows again: the daemon accepts, and a new turn runs."""
    await wait_status(served, lambda s: s["daemon"]["accepting"])
    with anyio.fail_after(60):
        assert (await client.run("examples.agents:echo", 2)).output == 2


def _writer_of(served: Served) -> psutil.Process:
    """The daemon's journal writer process (JOURNAL-UNAVAILABLE: the only one that writes the file)."""
    (writer,) = [p for p in psutil.Process(served.pid).children() if "writer.py" in " ".join(p.cmdline())]
    return writer


def _fill_disk(where: Path) -> Callable[[], None]:
    """Fill the journal's tmpfs; returns what frees it."""
    return fill(where).unlink


def _limit_file_size(served: Served, journal: Path) -> Callable[[], None]:
    """Set the writer's RLIMIT_FSIZE to the journal's write-ahead log's size, so its next append fails
    (EFBIG: Python ignores SIGXFSZ); returns what lifts the limit."""
    writer = _writer_of(served)
    wal = journal.with_name(journal.name + "-wal")
    size = wal.stat().st_size
    hard = resource.prlimit(writer.pid, resource.RLIMIT_FSIZE)[1]
    resource.prlimit(writer.pid, resource.RLIMIT_FSIZE, (size, hard))  # the soft limit: it can go back up
    return lambda: resource.prlimit(writer.pid, resource.RLIMIT_FSIZE, (hard, hard))


async def _paused_then_blocked(
    served: Served, d: Path, block: Callable[[], Callable[[], None]], pause: str = "model2", **submit: Any
) -> tuple[str, Callable[[], None]]:
    """Submit the trip turn paused at its second model call (its first step and first call
    committed), make the journal unwritable (``block``), let the turn go on, and wait until the
    journal says it cannot write. Returns the turn id and what makes the journal writable again."""
    async with Client.connect(served.endpoint) as client:
        handle = await client.submit(AGENT, {"dir": str(d), "pause": pause}, retry=True, **submit)
    await _until_file(d / "paused")
    unblock = block()
    (d / "go").write_text("")
    await wait_status(served, lambda s: s["daemon"]["journal_error"])
    return handle.turn_id, unblock


@pytest.mark.parametrize("how", ["full", "file_size_limit"])
async def test_a_full_disk_holds_the_next_tool_until_its_record_commits(tmp_path: Path, how: str) -> None:
    """The disk fills between two steps (or the writer reaches its RLIMIT_FSIZE: EFBIG): the next
    step's records cannot commit, so the tool they guard does not run (``reserve``: never, while the
    journal cannot write); the daemon answers (status says ``journal_error``; a submit is refused
    with ``JournalUnavailable``). Space returns: the records commit, the turn completes in its one
    attempt with every call run once, and the journal holds every step."""
    home = short_dir()
    with tmpfs("3m") as where:
        journal = where / "journal.sqlite3"
        served = start(*ARGS, "--journal", str(journal), home=home)
        try:
            block = (
                (lambda: _fill_disk(where)) if how == "full" else (lambda: _limit_file_size(served, journal))
            )
            turn_id, unblock = await _paused_then_blocked(served, tmp_path, block)
            st = await status(served)
            assert st["daemon"]["accepting"] is False and "journal" in st["daemon"]["journal_error"], st
            why = "database or disk is full" if how == "full" else "disk I/O error"
            assert why in st["daemon"]["journal_error"], st
            async with Client.connect(served.endpoint) as client:
                with anyio.fail_after(60), pytest.raises(JournalUnavailable):
                    await client.submit("examples.agents:echo", 1)
                # Committed before the disk filled: the first step and its call.
                assert lines(tmp_path, "charges") and not lines(tmp_path, "reserves")
                st = await wait_status(served, lambda s: s["running"] == 1)
                assert not lines(tmp_path, "reserves"), "a tool ran on a record the disk refused"
                unblock()
                with anyio.fail_after(60):
                    result = await client.handle(turn_id).result()
                await _writes_again(served, client)
        finally:
            stop_process(served.proc)
            shutil.rmtree(home, ignore_errors=True)
        assert result.outcome == "completed" and result.attempts == 1, result
        assert [len(lines(tmp_path, n)) for n in ("charges", "reserves", "lookups")] == [1, 1, 1]
        steps = view_steps(journal, turn_id)
        assert [s["step"] for s in steps] == [0, 1, 2, 3], steps
        assert all(c["state"] == "completed" for s in steps for c in s["calls"]), steps


async def test_a_sigkill_while_the_disk_is_full_resumes_from_what_was_committed(tmp_path: Path) -> None:
    """The daemon is SIGKILLed while the disk is full and the next step's records wait for it. It is
    started again on the same journal (first still full: it starts and answers; then with space):
    the turn resumes as attempt 2 from the committed steps, and each call ran once in all — the one
    whose record the disk refused had never started."""
    home = short_dir()
    with tmpfs("3m") as where:
        journal = where / "journal.sqlite3"
        first = start(*ARGS, "--journal", str(journal), home=home)
        try:
            turn_id, unblock = await _paused_then_blocked(first, tmp_path, lambda: _fill_disk(where))
            first.proc.kill()
            first.proc.wait(timeout=60)
        finally:
            stop_process(first.proc)
        try:
            # Still full: it refuses to start, saying why, and leaves the journal as it was.
            refused = start(*ARGS, "--journal", str(journal), home=home, check_ready=False)
            try:
                code = refused.proc.wait(timeout=60)
            finally:
                stop_process(refused.proc)
            said = refused.stderr()
            assert code == 1 and "database or disk is full" in said, (code, said)
            unblock()
            result = await result_on_a_new_daemon(home, journal, turn_id)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        assert result.outcome == "completed" and result.attempts == 2, result
        assert [len(lines(tmp_path, n)) for n in ("charges", "reserves", "lookups")] == [1, 1, 1]
        steps = view_steps(journal, turn_id)
        assert all(c["state"] == "completed" for s in steps for c in s["calls"]), steps


async def test_a_turn_that_waits_on_a_full_disk_past_its_timeout_ends_timed_out(tmp_path: Path) -> None:
    """The disk stays full past the turn's timeout: the turn ends (its timeout's outcome), the tool
    whose record never committed never ran; once space returns the daemon writes and accepts again,
    and the journal holds the turn's end."""
    home = short_dir()
    with tmpfs("3m") as where:
        journal = where / "journal.sqlite3"
        served = start(*ARGS, "--journal", str(journal), home=home)
        try:
            turn_id, unblock = await _paused_then_blocked(
                served, tmp_path, lambda: _fill_disk(where), timeout=3.0
            )
            async with Client.connect(served.endpoint) as client:
                with anyio.fail_after(60):
                    result = await client.handle(turn_id).result()
                unblock()
                await _writes_again(served, client)
        finally:
            stop_process(served.proc)
            shutil.rmtree(home, ignore_errors=True)
        # Its timeout's outcome: the loop was waiting (cooperatively) for the record's acknowledgement.
        assert result.outcome == "aborted" and result.cause is not None, result
        assert result.cause.kind == "deadline", result
        assert not lines(tmp_path, "reserves")
        (row,) = [r for r in read_history(journal) if r["turn_id"] == turn_id]
        assert row["outcome"] == "aborted", row  # its end row, written once the disk took it


async def test_a_worker_that_dies_while_its_records_wait_resumes_from_them(tmp_path: Path) -> None:
    """The worker dies while the first call's ``started`` record waits for the full disk: the next
    attempt resumes from the records the supervisor holds (committed once space returns), so the
    call counts as started with its outcome unknown — the model is told so — although it never ran
    (the safe side: never run twice)."""
    home = short_dir()
    with tmpfs("3m") as where:
        journal = where / "journal.sqlite3"
        served = start(*ARGS, "--journal", str(journal), home=home)
        try:
            turn_id, unblock = await _paused_then_blocked(
                served, tmp_path, lambda: _fill_disk(where), pause="model1"
            )
            psutil.Process(int((tmp_path / "paused").read_text())).kill()
            await wait_status(served, lambda s: s["daemon"]["journal_error"] and s["running"])
            unblock()
            async with Client.connect(served.endpoint) as client:
                with anyio.fail_after(60):
                    result = await client.handle(turn_id).result()
        finally:
            stop_process(served.proc)
            shutil.rmtree(home, ignore_errors=True)
        assert result.outcome == "completed" and result.attempts == 2, result
        assert not lines(tmp_path, "charges")  # it never ran
        assert "unknown" in result.output["text"] and "c1" in result.output["text"], result.output
        assert [len(lines(tmp_path, n)) for n in ("reserves", "lookups")] == [1, 1]
