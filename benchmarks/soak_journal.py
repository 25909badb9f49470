"""The journal under a million turns: ``python -m benchmarks.soak_journal`` (``make soak-journal``;
``--turns`` to change the million). Writes N turns (accept row, end row) through ``Journal`` in
rounds of 10,000, twice: with the default retention (JOURNAL-KEEP-NEWEST: the newest ``KEEP_TURNS`` ended
turns; retention applied after each round, as the writer does every minute) and with none. After
each: the file's size (with its WAL) and how long ``turnpool history``'s queries take (the newest
page, and one filtered by outcome). Printed as Markdown and appended to ``benchmarks/SOAK.md``;
the scaled-down check is ``tests/test_journal_retention.py``."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import wire
from supervisor.journal import Journal, read_history
from supervisor.journal.store import KEEP_TURNS
from tests.support.journalkit import record

ROUND = 10_000


def _size(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def soak(turns: int, keep_turns: int | None) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="tp-journal-soak-"))
    path = home / "j.sqlite3"
    journal = Journal.open(path, keep_turns=keep_turns or 0)
    sizes: list[int] = []
    t0 = time.monotonic()
    try:
        for r in range(max(1, turns // ROUND)):
            for i in range(ROUND):
                journal.accepted(record(f"{r}-{i}"))
            for i in range(ROUND):
                outcome = "failed" if i % 100 == 0 else "completed"
                journal.ended(wire.TurnResult(turn_id=f"{r}-{i}", outcome=outcome, ended_at=time.time()))
            journal.flush()
            journal.compact()
            sizes.append(_size(path))
        write_s = time.monotonic() - t0
        journal.close()
        t1 = time.perf_counter()
        newest = read_history(path)
        newest_s = time.perf_counter() - t1
        t1 = time.perf_counter()
        failed = read_history(path, outcome="failed")
        failed_s = time.perf_counter() - t1
        return {
            "turns": turns,
            "keep_turns": keep_turns,
            "write_s": write_s,
            "size_mib": sizes[-1] / 2**20,
            "peak_mib": max(sizes) / 2**20,
            "half_mib": sizes[len(sizes) // 2] / 2**20,
            "newest_s": newest_s,
            "failed_s": failed_s,
            "rows": (len(newest), len(failed)),
        }
    finally:
        shutil.rmtree(home, ignore_errors=True)


def report(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"## The journal under {rows[0]['turns']:,} turns "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"`python -m benchmarks.soak_journal --turns {rows[0]['turns']}`: turns written in rounds of "
        f"{ROUND:,} through `Journal` (retention applied after each round); then `turnpool history`'s "
        "queries on the file.",
        "",
        "| retention | file at half-way | file at the end (peak) | newest 100 | filtered by outcome "
        "| written in |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        keep = f"newest {r['keep_turns']:,} (default)" if r["keep_turns"] else "none"
        lines.append(
            f"| {keep} | {r['half_mib']:.0f} MiB | {r['size_mib']:.0f} MiB ({r['peak_mib']:.0f}) | "
            f"{r['newest_s'] * 1e3:.1f} ms | {r['failed_s'] * 1e3:.1f} ms | {r['write_s']:.0f} s |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak_journal")
    parser.add_argument("--turns", type=int, default=1_000_000)
    args = parser.parse_args()
    text = report([soak(args.turns, KEEP_TURNS), soak(args.turns, None)])
    print(text)
    with Path(__file__).with_name("SOAK.md").open("a") as f:
        f.write("\n" + text)


if __name__ == "__main__":
    main()
