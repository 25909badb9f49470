"""JOURNAL-APPEND: the journal's schema 2, where rows are inserted and never rewritten, and the upgrade of a
schema-1 journal in place. What it could break, attacked on real SQLite files with a real writer
process and a real ``turnpool serve``:

* a journal written by an older turnpool (schema 1, every state a turn can be in) is read by
  ``turnpool history`` as it is, upgraded in one transaction when a daemon opens it, and recovered
  as before: queued turns run, a turn that may have run ends ``crashed``, ended results are kept;
* a turn's state is derived from the rows it has (queued, dispatched, running, ended), and a turn
  recovery queues again is neither started nor cleared any more: a second crash before it runs
  does not count it as run again (its whole cleared run is forgotten with it);
* the runs of cleared turns do not pile up: they are pruned once their turns have ended;
* a conflicting or refused accept leaves no row behind, and never writes onto the other turn that
  holds its id.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import time
from pathlib import Path

import anyio
import msgspec
import pytest

import wire
from supervisor import Client
from supervisor.journal import Journal, read_history, read_result
from supervisor.journal import writer as journal_writer
from tests.support import daemonkit
from tests.support.daemonkit import FAST, serving
from tests.support.journalkit import SCHEMA_1, completed, record


def _schema_1_file(path: Path) -> wire.TurnResult:
    """A schema-1 journal holding a turn in each state (as turnpool before JOURNAL-APPEND wrote them),
    in a private directory; returns the result recorded for the ended one."""
    path.parent.chmod(0o700)
    done = wire.TurnResult(
        turn_id="v1-ended",
        outcome="completed",
        output={"x": 1},
        started=True,
        worker_pid=11,
        ended_at=time.time(),
    )
    payload = bytes(wire.encode_payload({"text": "hi"}))
    now = time.time()
    with contextlib.closing(sqlite3.connect(path)) as con:
        con.executescript(SCHEMA_1)
        rows = [
            ("v1-ended", "ended", now, 11, now, "completed", msgspec.msgpack.encode(done)),
            ("v1-running", "running", now, 12, None, None, None),
            ("v1-dispatched", "dispatched", None, None, None, None, None),
            ("v1-queued", "queued", None, None, None, None, None),
        ]
        for turn_id, state, started, pid, ended, outcome, result in rows:
            con.execute(
                "INSERT INTO turns (turn_id, agent, input, session, state, accepted_at, started_at,"
                " worker_pid, ended_at, outcome, result) VALUES (?, 'examples.agents:echo', ?, 's1', ?, ?, ?,"
                " ?, ?, ?, ?)",
                (turn_id, payload, state, now, started, pid, ended, outcome, result),
            )
        con.commit()
    return done


@pytest.mark.anyio
async def test_a_schema_1_journal_is_read_then_upgraded_in_place_and_recovered() -> None:
    """An older turnpool's journal (schema 1) with a turn in every state: ``turnpool history`` reads
    it untouched; a daemon started on it upgrades it (``user_version`` 2) and recovers it as schema 1
    promised — the queued turn runs, the dispatched and running ones end ``crashed``
    (``SupervisorLost``, started true), the ended one's result is exactly what was recorded — and new
    turns are accepted and recorded after them."""
    home = daemonkit.short_dir()
    path = home / "old" / "j.sqlite3"
    path.parent.mkdir()
    try:
        done = _schema_1_file(path)
        states = {r["turn_id"]: r["state"] for r in read_history(path)}
        assert states == {
            "v1-ended": "ended",
            "v1-running": "running",
            "v1-dispatched": "dispatched",
            "v1-queued": "queued",
        }
        assert read_result(path, "v1-ended") == done
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
            assert con.execute("PRAGMA user_version").fetchone()[0] == 1  # read, not changed
        with serving(*FAST, "--journal", str(path)) as d:
            async with Client.connect(d.endpoint, timeout=30) as client:
                with anyio.fail_after(60):
                    results = {t: await client.handle(t).result() for t in states}
                    fresh = await client.run("examples.agents:echo", {"text": "new"}, turn_id="v2-new")
        assert results["v1-ended"] == done
        assert results["v1-queued"].outcome == "completed" and results["v1-queued"].output == {"text": "hi"}
        for lost in ("v1-running", "v1-dispatched"):
            assert results[lost].outcome == "crashed" and results[lost].started, results[lost]
            assert results[lost].error is not None and results[lost].error.type == "SupervisorLost"
        assert fresh.outcome == "completed"
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
            assert con.execute("PRAGMA user_version").fetchone()[0] == 2
            assert not con.execute("SELECT name FROM sqlite_master WHERE name = 'turns_v1'").fetchall()
            seqs = dict(con.execute("SELECT turn_id, seq FROM turns"))
        assert seqs["v2-new"] > max(v for k, v in seqs.items() if k != "v2-new")
        history = {r["turn_id"]: r for r in read_history(path)}
        assert {t: history[t]["state"] for t in history} == dict.fromkeys([*states, "v2-new"], "ended")
        assert history["v1-running"]["outcome"] == "crashed"
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_turn_queued_again_is_neither_started_nor_cleared_at_the_next_crash(tmp_path: Path) -> None:
    """States come from rows: accepted → ``queued``, in a cleared run → ``dispatched``, started →
    ``running``. Recovery queues the two ``retry=True`` turns of one cleared run again (attempts 2):
    if the daemon dies again before they run, the next recovery finds them ``queued`` with attempts
    2 — not ``running``/``dispatched``, which would count a run that never happened (attempts 3)
    — while a third turn of a later run stays ``dispatched``."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    for tid in ("r1", "r2", "other", "q"):
        journal.accepted(record(tid, retry=tid != "q"))
    journal.dispatched(["r1", "r2"], lambda: None)
    journal.flush()
    journal.dispatched(["other"], lambda: None)
    journal.started("r1", 4242)
    journal.flush()
    assert journal.close(timeout=30)

    again = Journal.open(path)
    found = {t.turn_id: (t.state, t.attempts, t.worker_pid) for t in again.recover()}
    assert found == {
        "r1": ("running", 1, 4242),
        "r2": ("dispatched", 1, None),
        "other": ("dispatched", 1, None),
        "q": ("queued", 1, None),
    }
    again.requeued("r1", 2)
    again.requeued("r2", 2)
    again.flush()
    assert again.close(timeout=30)  # the daemon dies before either ran

    third = Journal.open(path)
    found = {t.turn_id: (t.state, t.attempts, t.worker_pid) for t in third.recover()}
    assert found == {
        "r1": ("queued", 2, None),
        "r2": ("queued", 2, None),
        "other": ("dispatched", 1, None),
        "q": ("queued", 1, None),
    }
    third.ended(completed("r1"))
    third.flush()
    assert third.close(timeout=30)
    rows = {r["turn_id"]: r for r in read_history(path)}
    assert rows["r1"]["state"] == "ended" and rows["r1"]["attempts"] == 2
    assert read_result(path, "r1") == completed("r1")


def test_cleared_runs_are_pruned_once_their_turns_ended(tmp_path: Path) -> None:
    """Every clearance adds a ``cleared`` row; every ``PRUNE_EVERY`` batches the writer forgets the
    runs that hold no open turn, so the table stays small however many turns went by (a turn's
    state is looked up in it) — even while one long turn, cleared first, stays open: its run is
    kept, the runs after it are not."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    journal.accepted(record("long"))
    journal.dispatched(["long"], lambda: None)
    n = journal_writer.PRUNE_EVERY + 20
    for i in range(n):  # one batch each
        journal.accepted(record(f"t{i}"))
        journal.dispatched([f"t{i}"], lambda: None)
        journal.ended(completed(f"t{i}"))
        journal.flush()
    assert journal.close(timeout=30)
    with contextlib.closing(sqlite3.connect(path)) as con:
        (left,) = con.execute("SELECT COUNT(*) FROM cleared").fetchone()
    assert left < 30, f"{left} cleared runs kept after {n} turns ended"
    reopened = Journal.open(path)
    try:
        assert [(t.turn_id, t.state) for t in reopened.recover()] == [("long", "dispatched")]
    finally:
        assert reopened.close(timeout=30)


def test_a_conflicting_accept_writes_nothing_and_never_touches_the_turn_with_its_id(tmp_path: Path) -> None:
    """JOURNAL-LOOKUP with JOURNAL-APPEND: a second accept of an id already in the journal inserts nothing and
    is refused; the refused turn's end (its withdrawal) writes no row, and the first turn's own rows (open,
    then its real end) stay its own."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    journal.accepted(record("same", tag=b"first"))
    journal.flush()
    refused: list[tuple[str, bool]] = []
    journal.accepted(
        record("same", tag=b"second"), lambda: None, lambda why, conflict: refused.append((why, conflict))
    )
    journal.flush()
    assert len(refused) == 1 and refused[0][1] is True
    journal.ended(
        wire.TurnResult(turn_id="same", outcome="failed", error=wire.TurnError("ValueError", "conflict"))
    )
    journal.flush()
    assert [(r["turn_id"], r["state"]) for r in read_history(path)] == [("same", "queued")]
    with contextlib.closing(sqlite3.connect(path)) as con:
        assert con.execute("SELECT COUNT(*) FROM ends").fetchone()[0] == 0
        assert con.execute("SELECT COUNT(*) FROM turns").fetchone()[0] == 1
    journal.ended(completed("same"))  # the first turn's own end
    journal.flush()
    assert journal.close(timeout=30)
    assert read_result(path, "same") == completed("same")
    assert [(r["turn_id"], r["state"]) for r in read_history(path)] == [("same", "ended")]


def test_an_upgrade_says_how_many_turns_and_is_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The upgrade of a schema-1 file takes time in proportion to it (one transaction over every
    turn): the writer first says how many turns it converts, the daemon logs it and waits for that
    many instead of its usual start-up bound (a big journal would otherwise be refused at every
    start, its upgrade rolled back each time). Opening the upgraded file again converts nothing."""
    path = tmp_path / "j" / "j.sqlite3"
    path.parent.mkdir()
    _schema_1_file(path)
    with caplog.at_level("WARNING", logger="turnpool.journal"):
        journal = Journal.open(path)
        assert journal.close(timeout=30)
    assert [r.getMessage() for r in caplog.records if "upgrading" in r.getMessage()] == [
        f"journal {path}: upgrading 4 turns to schema 2"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="turnpool.journal"):
        again = Journal.open(path)
        assert again.close(timeout=30)
    assert not [r for r in caplog.records if "upgrading" in r.getMessage()]
