"""JOURNAL-KEEP-NEWEST: the journal keeps the newest ``keep_turns`` ended turns (100,000 by default), so a
daemon that runs for ever has a bounded journal file. The full million-turn soak is ``python -m
benchmarks.soak_journal``; this is it scaled down."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

import wire
from supervisor.journal import Journal, read_history
from supervisor.journal.store import KEEP_TURNS
from tests.support.daemonkit import turnpool_argv
from tests.support.journalkit import record


def _turns(journal: Journal, prefix: str, n: int) -> None:
    for i in range(n):
        journal.accepted(record(f"{prefix}-{i}"))
    for i in range(n):
        journal.ended(wire.TurnResult(turn_id=f"{prefix}-{i}", outcome="completed", ended_at=time.time()))
    journal.flush()


def test_keep_turns_keeps_the_newest_ended_turns_and_every_open_one(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "j.sqlite3", keep_turns=3)
    try:
        _turns(journal, "t", 5)
        journal.accepted(record("open"))
        journal.flush()
        assert journal.compact() == 2
        left = [r["turn_id"] for r in read_history(tmp_path / "j.sqlite3")]
        assert left == ["open", "t-4", "t-3", "t-2"]
    finally:
        journal.close()


def test_the_default_keeps_100000_and_zero_keeps_all(tmp_path: Path) -> None:
    assert KEEP_TURNS == 100_000
    journal = Journal.open(tmp_path / "a.sqlite3")
    assert journal.keep_turns == KEEP_TURNS
    journal.close()
    journal = Journal.open(tmp_path / "b.sqlite3", keep_turns=0)
    try:
        assert journal.keep_turns is None
        _turns(journal, "t", 5)
        assert journal.compact() == 0
    finally:
        journal.close()
    with pytest.raises(TypeError, match="keep_turns"):
        Journal(tmp_path / "c.sqlite3", keep_turns=1.5)  # type: ignore[arg-type]


def test_the_file_stays_bounded_under_a_long_run(tmp_path: Path) -> None:
    """20 rounds of 1,000 turns with ``keep_turns=2000``: the file stops growing once the limit is
    reached (SQLite reuses the freed pages), where without retention it grows with every round."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path, keep_turns=2000)
    sizes = []
    try:
        for r in range(20):
            _turns(journal, f"r{r}", 1000)
            journal.compact()
            sizes.append(path.stat().st_size + Path(f"{path}-wal").stat().st_size)
        assert len(read_history(path, limit=10_000)) == 2000
    finally:
        journal.close()
    # Bounded: over the last 10 rounds (10,000 turns written) the file grew by less than what 2
    # rounds added while it was filling up (and kept nothing past the limit).
    per_round = (sizes[4] - sizes[0]) / 4
    assert sizes[-1] - sizes[9] < 2 * per_round, sizes


def test_serve_validates_keep_turns() -> None:
    bad = subprocess.run(
        turnpool_argv("serve", "--no-journal", "--keep-turns", "5"), capture_output=True, text=True
    )
    assert bad.returncode != 0 and "--keep-turns" in bad.stderr
    neg = subprocess.run(turnpool_argv("serve", "--keep-turns", "-1"), capture_output=True, text=True)
    assert neg.returncode != 0 and "--keep-turns" in neg.stderr
