"""Step records and resume (S-DURABLE, S-RESUME, S-UNKNOWN): a 3-tool ``AgentLoop`` turn submitted
with ``retry=True`` is SIGKILLed at every boundary — its worker here, its daemon in
``test_durability_daemon.py`` — and resumed from its last recorded step: a completed call never runs
again, the idempotent call runs again with the same key, a call that started and did not complete is
told to the model (or fails the turn), recorded model responses are not asked for again, and the
final output is the uninterrupted run's."""

from __future__ import annotations

import json
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import Supervisor, TurnHandle, TurnResult

pytestmark = pytest.mark.anyio

AGENT = "tests.agents.durable:trip"
TOOLS = ("charge", "reserve", "lookup")
BOUNDARIES = (
    ["model1", "model2", "model3", "model4"]
    + [f"in_{t}" for t in TOOLS]
    + [f"after_{t}" for t in TOOLS]
    + ["end"]
)


def lines(d: Path, name: str) -> list[str]:
    path = d / name
    return path.read_text().splitlines() if path.exists() else []


async def events_of(handle: TurnHandle) -> list[Any]:
    with anyio.fail_after(60):
        async with aclosing(handle.events()) as events:
            return [e async for e in events]


def from_step(boundary: str) -> int:
    """Model responses recorded when the kill comes at ``boundary``."""
    if boundary.startswith("model"):
        return int(boundary[5:]) - 1
    if boundary == "end":
        return 4
    return TOOLS.index(boundary.split("_", 1)[1]) + 1


def check_resumed(
    boundary: str, d: Path, result: TurnResult, events: list[Any], baseline: dict[str, Any]
) -> None:
    """What a turn killed once at ``boundary`` and resumed must show (worker or daemon alike)."""
    assert result.outcome == "completed", (boundary, result)
    assert result.attempts == 2, (boundary, result)
    assert (d / "killed").exists(), boundary
    resumed = [e for e in events if isinstance(e, dict) and e.get("type") == "resumed"]
    assert resumed == [{"type": "resumed", "attempt": 2, "from_step": from_step(boundary)}], (
        boundary,
        events,
    )
    # Exactly once per call across both attempts: completed calls are not run again, and a call that
    # started without completing is not run again either unless its tool is idempotent.
    assert len(lines(d, "charges")) == 1, boundary
    assert len(lines(d, "lookups")) == 1, boundary
    reserves = lines(d, "reserves")
    if boundary in ("in_reserve", "after_reserve"):
        assert len(reserves) == 2 and reserves[0] == reserves[1], (boundary, reserves)  # same key
    else:
        assert len(reserves) == 1, boundary
    # The model is asked again only for the response the kill cut: recorded ones are used.
    opens = lines(d, "opens")
    assert len(opens) == (5 if boundary.startswith("model") else 4), (boundary, opens)
    told = boundary in ("in_charge", "after_charge", "in_lookup", "after_lookup")
    if told:
        tool = boundary.split("_", 1)[1]
        call_id = {"charge": "c1", "lookup": "c3"}[tool]
        outputs = json.loads(result.output["text"].removeprefix("Done: "))
        index = TOOLS.index(tool)
        assert "outcome" in outputs[index]["error"] and "unknown" in outputs[index]["error"], outputs
        assert call_id in outputs[index]["error"]
        others = json.loads(baseline["text"].removeprefix("Done: "))
        assert [o for i, o in enumerate(outputs) if i != index] == [
            o for i, o in enumerate(others) if i != index
        ]
    else:
        assert result.output == baseline, (boundary, result.output)


async def baseline_run(sup: Supervisor, tmp: Path) -> dict[str, Any]:
    d = tmp / "baseline"
    d.mkdir()
    with anyio.fail_after(60):
        result = await sup.run(AGENT, {"dir": str(d), "kill": None}, retry=True)
    assert result.outcome == "completed" and result.attempts == 1, result
    assert len(lines(d, "opens")) == 4 and len(lines(d, "charges")) == 1
    assert result.output["text"].startswith("Done: ")
    return result.output  # type: ignore[no-any-return]


async def test_sigkill_of_the_worker_at_every_boundary_resumes_from_the_last_step(tmp_path: Path) -> None:
    """For each boundary of the 3-tool turn, a turn killed there once (SIGKILL to its worker)
    resumes as attempt 2 and ends as described in ``check_resumed``."""
    async with Supervisor(workers=2, spares=0, heartbeat=0) as sup:
        baseline = await baseline_run(sup, tmp_path)
        handles = {}
        for boundary in BOUNDARIES:
            d = tmp_path / boundary
            d.mkdir()
            handles[boundary] = await sup.submit(AGENT, {"dir": str(d), "kill": boundary}, retry=True)
        for boundary, handle in handles.items():
            with anyio.fail_after(120):
                result = await handle.result()
            check_resumed(boundary, tmp_path / boundary, result, await events_of(handle), baseline)


@pytest.mark.parametrize("boundary", ["in_charge", "after_lookup"])
async def test_on_unknown_outcome_fail_ends_the_turn_failed_naming_the_call(
    tmp_path: Path, boundary: str
) -> None:
    """``on_unknown_outcome="fail"``: the resumed attempt ends ``failed`` with ``UnknownToolOutcome``
    naming the call that started and did not complete; the call never ran twice."""
    async with Supervisor(workers=1, spares=0, heartbeat=0) as sup:
        with anyio.fail_after(60):
            result = await sup.run(
                AGENT, {"dir": str(tmp_path), "kill": boundary, "on_unknown": "fail"}, retry=True
            )
    assert result.outcome == "failed" and result.attempts == 2, result
    assert result.error is not None and result.error.type == "UnknownToolOutcome", result
    name, call_id = ("charge", "c1") if "charge" in boundary else ("lookup", "c3")
    assert repr(call_id) in result.error.message and repr(name) in result.error.message
    assert len(lines(tmp_path, "charges")) == 1 and len(lines(tmp_path, "lookups")) <= 1


async def test_without_retry_a_killed_turn_still_ends_crashed(tmp_path: Path) -> None:
    """Resume is for ``retry=True`` turns only: without it the worker's death ends the turn
    ``crashed`` after one attempt, as before."""
    async with Supervisor(workers=1, spares=0, heartbeat=0) as sup:
        with anyio.fail_after(60):
            result = await sup.run(AGENT, {"dir": str(tmp_path), "kill": "in_reserve"})
    assert result.outcome == "crashed" and result.attempts == 1, result
