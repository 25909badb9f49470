"""JOURNAL-DIRECT and JOURNAL-MERGE-ROWS: the daemon's event loop talks to the journal's writer process itself
(no writer thread on the fast path), and a turn's "running" and "ended" rows of one batch are one ``UPDATE``.
What that could break, attacked with a real writer process, real SQLite files and a real ``turnpool serve``:

* a batch still in flight when the event loop ends is committed by ``close`` (nothing handed over
  is lost because the loop that was to read the reply is gone);
* a merged row writes exactly what the two rows would have (start time, worker pid, outcome,
  result), and a turn queued again between its start and its end keeps both rows;
* the writer process SIGKILLed under a daemon on the loop path: later submits are acknowledged
  again (the journal goes back to its thread, which starts a new writer), and every acknowledged
  turn is in the journal after the daemon is SIGKILLed and restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from supervisor import Client, JournalUnavailable
from supervisor.journal import Journal, read_history
from supervisor.journal import writer as journal_writer
from supervisor.journal import writer_link as journal_link
from tests.support import daemonkit
from tests.support.daemonkit import FAST, serving
from tests.support.journalkit import completed, record


def test_a_batch_in_flight_when_the_loop_ends_is_committed_by_close(tmp_path: Path) -> None:
    """JOURNAL-DIRECT: rows handed over on an attached loop, the loop ended before it could read the
    commit's reply (and more rows pending behind it): ``close`` finishes the batch in flight and
    writes the rest; every accept's ``on_commit`` ran exactly once, and every row is in the file."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    committed: list[str] = []
    loop = asyncio.new_event_loop()
    try:

        async def attach() -> bool:
            return journal.attach()

        assert loop.run_until_complete(attach()) is True
        # The loop does not run again: the first batch's reply is never read by it.
        for i in range(200):
            journal.accepted(record(f"t{i}"), lambda i=i: committed.append(f"t{i}"))
            if i % 50 == 49:
                journal.hand_over()  # the first batch goes out; the next ones wait behind it
        assert journal._inflight is not None and journal._held.size
        loop.close()
    finally:
        if not loop.is_closed():
            loop.close()
        assert journal.close(timeout=30)
    assert sorted(committed) == sorted(f"t{i}" for i in range(200))
    assert len(read_history(path, limit=1000)) == 200


def test_a_turn_started_and_ended_in_one_batch_is_one_row_with_both_rows_values(tmp_path: Path) -> None:
    """JOURNAL-MERGE-ROWS: a turn started and ended in one batch is written as one end row that carries what
    the two would have (state ``ended``, ``started_at``, ``worker_pid``, outcome, result), its
    "running" row dropped; a turn queued again between its start and its end keeps its "queued
    again" row (its end shows the second start); rows of other turns and statements are untouched."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    try:
        for tid in ("a", "b"):
            journal.accepted(record(tid))
        journal.flush()
        before = time.time()
        with contextlib.closing(sqlite3.connect(path)) as con:
            seq = dict(con.execute("SELECT turn_id, seq FROM turns"))

        async def one_pass() -> list[tuple[str, list[int]]]:  # one pass: handed over together
            journal.started("a", 111)
            journal.ended(completed("a"))
            journal.started("b", 222)
            journal.requeued("b", 2)
            journal.started("b", 333)
            journal.ended(completed("b"))
            groups = journal._held.groups()
            journal.hand_over()
            return [(g.sql, [p[-1] for p in g.params]) for g in groups]

        # a: one row; b: queued again (which supersedes its first start), then its end.
        assert asyncio.run(one_pass()) == [
            (journal_link._REQUEUED, [seq["b"]]),
            (journal_link._ENDED, [seq["a"], seq["b"]]),
        ]
        journal.flush()
    finally:
        assert journal.close(timeout=30)
    rows = {r["turn_id"]: r for r in read_history(path)}
    for tid, pid, attempts in (("a", 111, 1), ("b", 333, 2)):
        row = rows[tid]
        assert row["state"] == "ended" and row["outcome"] == "completed"
        assert row["worker_pid"] == pid and row["attempts"] == attempts
        assert row["started_at"] >= before and row["ended_at"] >= row["started_at"]


def _writer_pid(daemon_pid: int) -> int:
    """The daemon's live journal writer. A child that is a zombie (the writer just killed, or any
    short-lived child the daemon has not reaped yet) has no command line to read and is no
    writer: skipped, not an error (psutil raises ``ZombieProcess`` for it; seen under the full
    suite)."""
    for child in psutil.Process(daemon_pid).children():
        try:
            cmdline = child.cmdline()
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
        if any("journal/writer.py" in part for part in cmdline):
            return child.pid
    raise AssertionError("the daemon has no journal writer process")


def _die_after_reply(journal: Journal, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """JOURNAL-LOST-WRITER, made exact: the next time the journal reads a whole reply from its writer (through
    ``journal_writer.<name>``: ``recv`` on the thread, ``parse`` on the loop), the writer process
    is SIGKILLed and the reply dropped — the writer died after its commit, before its answer."""
    real = getattr(journal_writer, name)

    def dying(*args: Any) -> Any:
        reply = real(*args)
        if reply is journal_writer.INCOMPLETE:
            return reply
        monkeypatch.setattr(journal_writer, name, real)
        child = journal._child
        assert child is not None
        child.kill()
        child.wait(30)
        return None

    monkeypatch.setattr(journal_writer, name, dying)


def _accept(journal: Journal, tid: str, said: dict[str, str]) -> None:
    journal.accepted(
        record(tid),
        lambda: said.__setitem__(tid, "committed"),
        lambda why, conflict: said.__setitem__(tid, f"refused: {why}"),
    )


def test_a_writer_that_dies_after_its_commit_keeps_the_acks_of_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JOURNAL-LOST-WRITER on the writer thread: the writer commits a batch of accept rows and dies before its
    reply. The rows are in the file, so the submits are acknowledged, not refused: a refusal says
    "not recorded, never run", and the next daemon on this journal would run them. A new writer
    takes the next batch."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    said: dict[str, str] = {}
    try:
        _die_after_reply(journal, monkeypatch, "recv")
        for tid in ("a", "b"):
            _accept(journal, tid, said)
        journal.flush()
        _accept(journal, "c", said)
        journal.flush()
    finally:
        assert journal.close(timeout=30)
    assert said == dict.fromkeys(("a", "b", "c"), "committed")
    again = Journal.open(path)
    try:
        assert [(t.turn_id, t.state) for t in again.recover()] == [
            ("a", "queued"),
            ("b", "queued"),
            ("c", "queued"),
        ]
    finally:
        assert again.close(timeout=30)


def test_a_writer_that_dies_after_its_commit_keeps_the_acks_of_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JOURNAL-LOST-WRITER on the event loop (JOURNAL-DIRECT): the reply of a committed batch never comes, the
    writer is dead. The loop hands the batch to a writer thread, which reads the file (not the loop: the disk
    may be why the writer died), finds the rows and acknowledges them; rows written meanwhile go after it, to
    a new writer; every accept is acknowledged exactly once."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    said: dict[str, str] = {}

    async def run() -> None:
        assert journal.attach()
        _die_after_reply(journal, monkeypatch, "parse")
        for i in range(50):
            _accept(journal, f"t{i}", said)
        journal.hand_over()
        assert journal._inflight is not None
        for i in range(50, 80):  # held behind the batch in flight
            _accept(journal, f"t{i}", said)
        with anyio.fail_after(30):
            while len(said) < 80:  # noqa: ASYNC110 - the commit callbacks come from the writer thread
                await anyio.sleep(0.01)  # allowed: bounded wait for the journal's thread to answer

    try:
        asyncio.run(run())
    finally:
        assert journal.close(timeout=30)
    assert said == {f"t{i}": "committed" for i in range(80)}
    with contextlib.closing(sqlite3.connect(path)) as con:
        assert con.execute("SELECT COUNT(*) FROM turns").fetchone()[0] == 80


@pytest.mark.anyio
async def test_a_killed_writer_process_is_replaced_and_acks_stay_durable() -> None:
    """JOURNAL-DIRECT: the journal's writer process SIGKILLed while the daemon's loop talks to it. Submits
    made meanwhile are refused (``JournalUnavailable``) or acknowledged, never acknowledged
    unwritten: later submits are acknowledged again, and after the daemon itself is SIGKILLed and
    restarted on the same journal every acknowledged turn is there."""
    keep = daemonkit.short_dir()
    journal = str(keep / "j.sqlite3")
    acked: list[str] = []
    try:
        with serving(*FAST, "--journal", journal) as d:
            async with Client.connect(d.endpoint, timeout=30) as client:
                with anyio.fail_after(60):
                    acked.extend(
                        [
                            (await client.submit("examples.agents:noop", turn_id=f"b{i}")).turn_id
                            for i in range(20)
                        ]
                    )
                    old = _writer_pid(d.pid)
                    os.kill(old, signal.SIGKILL)
                    i = 0
                    while True:  # until 20 more are acknowledged (by a new writer process)
                        try:
                            handle = await client.submit("examples.agents:noop", turn_id=f"c{i}")
                            acked.append(handle.turn_id)
                        except JournalUnavailable:
                            await anyio.sleep(0.05)  # allowed: the retry interval of a refused submit
                        i += 1
                        if len(acked) >= 40:
                            break
                    assert _writer_pid(d.pid) != old
                    handles = [client.submit("examples.agents:noop", turn_id=f"d{j}") for j in range(200)]
                    acked.extend(h.turn_id for h in await asyncio.gather(*handles))
            os.kill(d.pid, signal.SIGKILL)
            d.proc.wait(timeout=30)
        with serving(*FAST, "--journal", journal) as again:
            async with Client.connect(again.endpoint, timeout=30) as client:
                with anyio.fail_after(120):
                    missing = [t for t in acked if not await client.exists(t)]
    finally:
        shutil.rmtree(keep, ignore_errors=True)
    assert len(acked) >= 240
    assert missing == [], f"{len(missing)} of {len(acked)} acknowledged turns were lost"


@pytest.mark.anyio
async def test_a_writer_that_dies_while_the_daemon_is_idle_is_noticed_without_spinning() -> None:
    """JOURNAL-DIRECT: the writer process SIGKILLed while nothing is in flight. The end of its socket is
    read once (the journal goes back to its thread, which starts a new writer on the next
    commit), not left readable under the loop, which would call the reader callback forever:
    an idle daemon stays idle, and the next submit is acknowledged."""
    keep = daemonkit.short_dir()
    try:
        with serving(*FAST, "--journal", str(keep / "j.sqlite3")) as d:
            async with Client.connect(d.endpoint, timeout=30) as client:
                with anyio.fail_after(60):
                    await client.run("examples.agents:noop")
                    writer = psutil.Process(_writer_pid(d.pid))
                    writer.kill()
                    while writer.is_running() and writer.status() != psutil.STATUS_ZOMBIE:  # noqa: ASYNC110
                        await anyio.sleep(0.01)  # allowed: polling another process's child's state
                    daemon = psutil.Process(d.pid)
                    before = sum(daemon.cpu_times()[:2])
                    await anyio.sleep(1.0)  # allowed: the idle daemon's CPU is measured over a fixed second
                    spent = sum(daemon.cpu_times()[:2]) - before
                    assert spent < 0.5, f"the idle daemon used {spent:.2f} s of CPU in 1 s"
                    handle = await client.submit("examples.agents:noop", turn_id="after")
                    assert (await handle.result()).outcome == "completed"
    finally:
        shutil.rmtree(keep, ignore_errors=True)


def test_a_batch_larger_than_the_socket_buffer_is_sent_in_pieces(tmp_path: Path) -> None:
    """JOURNAL-DIRECT: one pass of the loop hands over 30,000 accept rows (a frame of megabytes, far more
    than the socket takes at once): the rest goes out as the socket drains (the loop's writer
    callback), the writer process commits the whole batch, every ``on_commit`` runs once."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    committed: list[int] = []
    n = 30_000
    try:

        async def main() -> bool:
            assert journal.attach()
            done = asyncio.Event()
            for i in range(n):
                journal.accepted(
                    record(f"t{i}"), lambda: (committed.append(1), len(committed) == n and done.set())
                )
            journal.hand_over()
            partial = bool(journal._wbuf)
            await asyncio.wait_for(done.wait(), 60)
            return partial

        assert asyncio.run(main()) is True, "the frame fitted the socket at once: nothing was tested"
    finally:
        assert journal.close(timeout=30)
    assert len(committed) == n
    assert len(read_history(path, limit=n + 1)) == n
