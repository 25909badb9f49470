"""Step records in a daemon's journal (LOOP-STEP-DURABLE, LOOP-RESUME): the 3-tool turn of
``test_durability.py``, submitted with ``retry=True``, SIGKILLs its daemon at every boundary; the
daemon restarted on the same journal resumes it from the last step its journal committed, with
the same promises as a worker's death: no completed call runs again, the idempotent call runs
again with the same key, a call that started and did not complete is told to the model."""

from __future__ import annotations

import functools
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import msgspec
import pytest

from supervisor.journal.steps import view_steps
from tests.support import httpkit
from tests.support.daemonkit import short_dir, start, stop_process
from tests.support.durablekit import (
    AGENT,
    ARGS,
    BOUNDARIES,
    check_resumed,
    result_on_a_new_daemon,
    run_through_killed_daemons,
    submit_until_its_daemon_dies,
)

pytestmark = pytest.mark.anyio


async def test_sigkill_of_the_daemon_at_every_boundary_resumes_from_the_last_committed_step(
    tmp_path: Path,
) -> None:
    """One journal, a daemon per boundary: the turn killing the daemon at a boundary is resumed by
    the next daemon started on the journal, which the next boundary's turn then kills."""
    home = short_dir()
    journal = home / "journal.sqlite3"
    dirs = {b: tmp_path / b for b in ("baseline", *BOUNDARIES)}
    for d in dirs.values():
        d.mkdir()
    try:
        baseline, resumed = await run_through_killed_daemons(
            home,
            journal,
            AGENT,
            {"dir": str(dirs["baseline"]), "kill": None},
            [functools.partial(_value, dirs[b], b) for b in BOUNDARIES],
        )
        assert baseline.outcome == "completed" and baseline.attempts == 1, baseline
        for boundary, (result, events) in zip(BOUNDARIES, resumed, strict=True):
            check_resumed(boundary, dirs[boundary], result, events, baseline.output)
            # LOOP-STEP-INSPECT: the journal shows every call completed (the told one with its error output).
            steps = view_steps(journal, result.turn_id)
            assert [s["step"] for s in steps] == [0, 1, 2, 3], (boundary, steps)
            assert all(c["state"] == "completed" for s in steps for c in s["calls"]), (boundary, steps)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _value(d: Path, kill: str, pid: int) -> dict[str, Any]:
    return {"dir": str(d), "kill": kill, "pid": pid}


@pytest.mark.parametrize("damage", ["corrupt", "foreign"])
async def test_a_corrupt_or_foreign_step_record_is_refused_at_resume(tmp_path: Path, damage: str) -> None:
    """LOOP-STEP-CORRUPT: a record in the journal that cannot be read, or that belongs to another turn, is
    refused when the turn resumes: the turn ends ``failed`` with ``StepRecordError`` saying why, and
    no call runs again (the loop never runs blind)."""
    home = short_dir()
    journal = home / "journal.sqlite3"
    first = start(*ARGS, "--journal", str(journal), home=home)
    try:
        value = {"dir": str(tmp_path), "kill": "in_reserve", "pid": first.pid}
        turn_id = await submit_until_its_daemon_dies(first, AGENT, value)
    finally:
        stop_process(first.proc)
    con = sqlite3.connect(journal)
    with con:
        data = con.execute("SELECT data FROM steps WHERE turn_id = ? AND seq = 1", (turn_id,)).fetchone()[0]
        if damage == "corrupt":
            bad = b"\xc1" + bytes(data)[1:]
        else:
            record = msgspec.msgpack.decode(data)
            bad = msgspec.msgpack.encode({**record, "turn": "another-turn"})
        con.execute("UPDATE steps SET data = ? WHERE turn_id = ? AND seq = 1", (bad, turn_id))
    con.close()
    try:
        result = await result_on_a_new_daemon(home, journal, turn_id)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert result.outcome == "failed" and result.attempts == 2, result
    assert result.error is not None and result.error.type == "StepRecordError", result
    why = "cannot be read" if damage == "corrupt" else "belongs to turn 'another-turn'"
    assert why in result.error.message, result.error
    assert len((tmp_path / "charges").read_text().splitlines()) == 1  # nothing ran again
    assert len((tmp_path / "reserves").read_text().splitlines()) == 1


async def test_result_steps_and_history_show_which_calls_completed_before_a_crash(tmp_path: Path) -> None:
    """LOOP-STEP-INSPECT: after the daemon died inside the third tool, ``turnpool result ID --steps`` shows
    the two calls before it completed (with their outputs) and the third started, its outcome
    unknown; ``turnpool history --steps`` sums it up per turn."""
    home = short_dir()
    journal = home / "journal.sqlite3"
    first = start(*ARGS, "--journal", str(journal), home=home)
    try:
        value = {"dir": str(tmp_path), "kill": "in_lookup", "pid": first.pid}
        turn_id = await submit_until_its_daemon_dies(first, AGENT, value)
        shown = first.cli("result", turn_id, "--steps", "--journal", str(journal))
        listed = first.cli("history", "--steps", "--json", "--journal", str(journal))
    finally:
        stop_process(first.proc)
    second = start(*ARGS, "--journal", str(journal), "--http", "127.0.0.1:0", home=home)
    try:
        async with httpkit.client(second) as http:
            with anyio.fail_after(60):
                done = await httpkit.result(http, turn_id)
            got = await http.get(f"/v1/turns/{turn_id}/steps")
            unknown = await http.get("/v1/turns/no-such-turn/steps")
    finally:
        stop_process(second.proc)
        shutil.rmtree(home, ignore_errors=True)
    # The HTTP API, once the turn resumed and ended: every call completed, the third with the
    # error output the model was told (its outcome unknown), never run again.
    assert done["outcome"] == "completed" and done["attempts"] == 2, done
    assert got.status_code == 200, got.text
    states = [(c["name"], c["state"]) for s in got.json()["steps"] for c in s["calls"]]
    assert states == [("charge", "completed"), ("reserve", "completed"), ("lookup", "completed")]
    assert "unknown" in got.json()["steps"][2]["calls"][0]["output"]["error"]
    httpkit.error_of(unknown, 404, "unknown_turn")
    assert len((tmp_path / "lookups").read_text().splitlines()) == 1
    assert shown.returncode == 0, shown.stderr
    out = json.loads(shown.stdout)
    assert out["turn_id"] == turn_id and out["result"] is None  # it has not ended
    calls = [(c["name"], c["state"], c.get("output")) for s in out["steps"] for c in s["calls"]]
    assert calls == [
        ("charge", "completed", {"charged": 5}),
        ("reserve", "completed", {"reserved": "12A"}),
        ("lookup", "started", None),
    ], out
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["steps"] for r in rows] == ["3 steps; calls: 2 completed, 1 started"], rows
