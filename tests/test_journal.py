"""The journal on its own: batched durable writes, exact round trip, refusal of bad files."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import wire
from supervisor.journal import Journal, JournalError, read_history, read_result
from tests.support.daemonkit import turnpool_argv
from tests.support.journalkit import record


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_accept_is_acknowledged_after_commit_and_round_trips(tmp_path: Path) -> None:
    """``on_commit`` runs only once the row is committed; the ended record reads back exactly
    as the client saw it; recover() lists only unfinished turns, in order."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    committed = threading.Event()
    journal.accepted(record("a", "s"), committed.set)
    assert committed.wait(10)
    # Visible to an independent reader at once.
    assert [t.turn_id for t in journal.recover()] == ["a"]
    journal.accepted(record("b", "s", retry=True))
    journal.started("a", 1234)
    result = wire.TurnResult(
        turn_id="a",
        outcome="aborted",
        cause=wire.USER,
        started=True,
        worker_pid=1234,
        output={"partial": [1, 2]},
        session="s",
        ended_at=time.time(),
    )
    journal.ended(result)
    journal.flush()
    assert read_result(path, "a") == result
    assert read_result(path, "b") is None
    pending = journal.recover()
    assert [(t.turn_id, t.state, t.retry) for t in pending] == [("b", "queued", True)]
    assert json.loads(json.dumps(read_history(path, outcome="aborted")))[0]["cause"] == "user"
    assert [r["turn_id"] for r in read_history(path, session="s")] == ["b", "a"]
    journal.close()
    assert (path.stat().st_mode & 0o777) == 0o600
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_writes_are_batched(tmp_path: Path) -> None:
    """A burst of 2,000 accepted turns is committed in far fewer transactions."""
    journal = Journal.open(tmp_path / "j.sqlite3")
    done = threading.Semaphore(0)
    for i in range(2000):
        journal.accepted(record(f"t{i}"), done.release)
    for _ in range(2000):
        assert done.acquire(timeout=30)
    assert journal.rows_written == 2000
    assert journal.commits < 200
    journal.close()


def test_locked_by_another_live_daemon(tmp_path: Path) -> None:
    """A journal held by another live process is refused with its pid; the file is untouched."""
    path = tmp_path / "j.sqlite3"
    Journal.open(path).close()
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from supervisor.journal import Journal; j = Journal.open(sys.argv[1]); "
            "print('ready', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        before = digest(path)
        with pytest.raises(JournalError, match=f"locked by another live daemon \\(pid {holder.pid}\\)"):
            Journal.open(path)
        assert digest(path) == before
        # The holder's journal writer (a child process) holds the lock too, until it has written
        # everything it was handed (JOURNAL-UNAVAILABLE): free again once both are gone.
        writers = psutil.Process(holder.pid).children()
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        _, alive = psutil.wait_procs(writers, timeout=30)
        assert alive == []
    Journal.open(path).close()  # free again once the holder and its writer are gone


def test_corrupt_newer_and_foreign_files_are_refused_untouched(tmp_path: Path) -> None:
    """Garbage, a journal from a newer schema, and someone else's SQLite file are refused with a
    clear error, and their bytes are left exactly as they were."""
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"this is not a database" * 100)
    newer = tmp_path / "newer.sqlite3"
    Journal.open(newer).close()
    with sqlite3.connect(newer) as con:
        con.execute("PRAGMA user_version=99")
    foreign = tmp_path / "foreign.sqlite3"
    with sqlite3.connect(foreign) as con:
        con.execute("CREATE TABLE things (x)")
    for path, message in (
        (garbage, "corrupt or not an SQLite file"),
        (newer, "newer than"),
        (foreign, "not a turnpool journal"),
    ):
        before = digest(path)
        with pytest.raises(JournalError, match=message):
            Journal.open(path)
        assert digest(path) == before


@pytest.mark.parametrize("table", ["turns", "ends", "open_turns", "cleared", "events"])
def test_a_journal_missing_a_table_is_refused_untouched_never_recreated(tmp_path: Path, table: str) -> None:
    """JOURNAL-REFUSE-BAD: a journal with a turn in it whose ``table`` was dropped (quick_check still says ok)
    is refused at open, by ``turnpool serve`` and by ``turnpool history``, with one line naming the table; the
    file is left as it was (before, the writer recreated the table empty and the turns were gone)."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    done = threading.Event()
    journal.accepted(record("t1"), done.set)
    assert done.wait(30)
    journal.close()
    with sqlite3.connect(path) as con:
        con.execute(f"DROP TABLE {table}")
    before = digest(path)
    with pytest.raises(JournalError, match=f"is damaged: its table {table} is missing"):
        Journal.open(path)
    assert digest(path) == before
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    for argv in (
        ["serve", "--workers", "1", "--journal", str(path), "--endpoint", f"ipc://{tmp_path}/s.sock"],
        ["history", "--journal", str(path)],
    ):
        done_cli = subprocess.run(
            turnpool_argv(*argv),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        lines = done_cli.stderr.strip().splitlines()
        assert done_cli.returncode != 0 and len(lines) == 1, done_cli.stderr
        assert f"table {table} is missing" in lines[0], lines[0]
    assert digest(path) == before
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert table not in tables


def test_retention_removes_old_ended_turns(tmp_path: Path) -> None:
    """``keep_days`` compaction deletes ended turns older than the limit and nothing else."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path, keep_days=1)
    for name in ("old", "recent", "open"):
        journal.accepted(record(name))
    journal.ended(wire.TurnResult(turn_id="old", outcome="completed", ended_at=time.time() - 3 * 86400))
    journal.ended(wire.TurnResult(turn_id="recent", outcome="completed", ended_at=time.time()))
    journal.flush()
    assert journal.compact() == 1
    assert sorted(r["turn_id"] for r in read_history(path)) == ["open", "recent"]
    journal.close()


def test_history_and_result_commands(tmp_path: Path) -> None:
    """``turnpool history`` lists and filters; ``turnpool result`` prints the recorded result as JSON;
    bad input gets a clear message and a non-zero exit."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    journal.accepted(record("x1", "s1"))
    journal.accepted(record("x2", "s2"))
    journal.ended(wire.TurnResult(turn_id="x1", outcome="killed", cause=wire.DEADLINE, ended_at=time.time()))
    journal.close()
    turnpool = [sys.executable, "-m", "supervisor.cli"]
    out = subprocess.run(
        [*turnpool, "history", "--journal", str(path), "--json", "--session", "s1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["turn_id"], r["outcome"], r["cause"]) for r in rows] == [
        ("x1", "killed", {"kind": "deadline"})
    ]
    table = subprocess.run(
        [*turnpool, "history", "--journal", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert "x1" in table and "x2" in table
    res = subprocess.run(
        [*turnpool, "result", "x1", "--journal", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(res)["outcome"] == "killed" and json.loads(res)["cause"] == {"kind": "deadline"}
    missing = subprocess.run(
        [*turnpool, "result", "nope", "--journal", str(path)], capture_output=True, text=True
    )
    assert missing.returncode == 1 and "unknown turn id 'nope'" in missing.stderr
    absent = subprocess.run(
        [*turnpool, "history", "--journal", str(tmp_path / "none.sqlite3")], capture_output=True, text=True
    )
    assert absent.returncode == 2 and "no journal at" in absent.stderr
    bad_since = subprocess.run(
        [*turnpool, "history", "--journal", str(path), "--since", "yesterday-ish"],
        capture_output=True,
        text=True,
    )
    assert bad_since.returncode == 2 and "--since" in bad_since.stderr
