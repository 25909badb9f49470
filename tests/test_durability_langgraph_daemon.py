"""A LangGraph graph compiled with ``TurnCheckpointer`` run as a ``retry=True`` turn through
``turnpool serve`` with its journal (LOOP-STEP-DURABLE, LOOP-RESUME): SIGKILL of the daemon at every boundary
(as the model node runs, inside the tool node, between the tool's end and its writes' record,
after the last checkpoint), then the daemon restarted on the same journal resumes the graph from
its last committed checkpoint: the ``charge`` tool runs once across both attempts (a call whose
outcome is unknown is told to the model, never run again) and the output is the one an
uninterrupted run gives."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="needs the langgraph extra")

from tests.support.daemonkit import short_dir
from tests.support.durablekit import lines, run_through_killed_daemons

pytestmark = pytest.mark.anyio

AGENT = "tests.agents.langgraph_durable:durable_trip"
BOUNDARIES = ("model1", "model2", "in_charge", "after_charge", "end")


def final_text(output: dict[str, Any]) -> str:
    return str(output["messages"][-1]["content"])


def prompt(d: Path, kill: str | None, pid: int) -> dict[str, Any]:
    return {
        "input": {
            "messages": [{"role": "user", "content": "charge me"}],
            "dir": str(d),
            "kill": kill,
            "pid": pid,
        }
    }


async def test_sigkill_of_the_daemon_at_every_boundary_of_a_graph(tmp_path: Path) -> None:
    """One journal, a daemon per boundary: the graph's turn killing the daemon at a boundary is
    resumed by the next daemon started on the journal, which the next boundary's turn then kills."""
    home = short_dir()
    dirs = {b: tmp_path / b for b in ("baseline", *BOUNDARIES)}
    for d in dirs.values():
        d.mkdir()
    try:
        base, resumed = await run_through_killed_daemons(
            home,
            home / "journal.sqlite3",
            AGENT,
            prompt(dirs["baseline"], None, 0),
            [functools.partial(prompt, dirs[kill], kill) for kill in BOUNDARIES],
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert base.outcome == "completed" and base.attempts == 1, base
    assert final_text(base.output) == 'Done: {"charged": 5}'
    for kill, (r, events) in zip(BOUNDARIES, resumed, strict=True):
        d = dirs[kill]
        seen = [e for e in events if isinstance(e, dict) and e.get("type") == "resumed"]
        # The resumed event counts the model steps the journal held (the planner's recorded answers).
        from_step = {"model1": 0, "model2": 1, "in_charge": 1, "after_charge": 1, "end": 2}[kill]
        assert seen == [{"type": "resumed", "attempt": 2, "from_step": from_step}], (kill, seen)
        assert (d / "killed").exists(), kill
        assert r.outcome == "completed" and r.attempts == 2, (kill, r)
        assert len(lines(d, "charges")) == 1, kill  # exactly once across both attempts
        opens = lines(d, "opens")
        if kill in ("in_charge", "after_charge"):
            # Its writes were never committed: the outcome is unknown and told to the model.
            text = final_text(r.output)
            assert "outcome of tool call 'call_c1'" in text and "unknown" in text, (kill, text)
            assert opens == ["1", "2"], (kill, opens)  # the planner's first answer not asked again
        else:
            assert final_text(r.output) == final_text(base.output), (kill, r.output)
            # Only the planner call the kill cut is made again (none after the last step).
            assert len(opens) == {"model1": 3, "model2": 3, "end": 2}[kill], (kill, opens)
