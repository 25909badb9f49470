"""Step records and resume (LOOP-STEP-DURABLE, LOOP-RESUME, LOOP-UNKNOWN-CALL): a 3-tool ``AgentLoop`` turn
submitted with ``retry=True`` is SIGKILLed at every boundary — its worker here, its daemon in
``test_durability_daemon.py`` — and resumed from its last recorded step: a completed call never runs again,
the idempotent call runs again with the same key, a call that started and did not complete is told to the
model (or fails the turn), recorded model responses are not asked for again, and the final output is the
uninterrupted run's."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import pytest

from supervisor import Supervisor
from tests.support.durablekit import AGENT, BOUNDARIES, check_resumed, events_of, lines

pytestmark = pytest.mark.anyio


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
            events = await events_of(handle)
            check_resumed(boundary, tmp_path / boundary, result, events, baseline, first_attempt_events=True)


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


async def test_a_record_too_large_is_refused_the_model_still_gets_it_and_resume_stops_there(
    tmp_path: Path,
) -> None:
    """LOOP-STEP-SIZE: a tool returning 5 MiB: its record is refused with a clear event in the turn, the
    model still gets the output in this attempt; the steps show the call ``not_recorded``; a crash
    after it ends the resumed attempt ``failed`` (it cannot be resumed past that call), never blind."""
    async with Supervisor(workers=1, spares=0, heartbeat=0) as sup:
        with anyio.fail_after(60):
            handle = await sup.submit("tests.agents.durable:big_output", {"dir": str(tmp_path)}, retry=True)
            result = await handle.result()
        assert result.outcome == "completed" and result.output == {"text": f"got {5 * 1024 * 1024} chars"}
        refused = [e for e in await events_of(handle) if e.get("type") == "step_not_recorded"]
        assert len(refused) == 1 and "over the limit" in refused[0]["error"], refused
        steps = sup.steps.view(handle.turn_id)
        assert steps is not None and steps[0]["calls"][0]["state"] == "not_recorded", steps
        with anyio.fail_after(60):
            again = await sup.run(
                "tests.agents.durable:big_output", {"dir": str(tmp_path), "kill": "end"}, retry=True
            )
    assert again.outcome == "failed" and again.attempts == 2, again
    assert again.error is not None and again.error.type == "StepRecordError", again
    assert "cannot be resumed past tool call 'd1'" in again.error.message


async def test_a_turn_whose_agent_records_nothing_sends_no_step_and_carries_none(tmp_path: Path) -> None:
    """A turn that records no steps pays nothing: no record is kept for it, and its retried
    attempt's ``Run`` carries none."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(60):
            result = await sup.run("examples.agents:echo", {"x": 1}, retry=True)
        assert result.outcome == "completed"
        assert sup.steps.records(result.turn_id) is None and sup.steps.recorded == 0


async def test_a_resumed_turn_cancelled_before_its_next_attempt_says_it_started(tmp_path: Path) -> None:
    """A ``retry=True`` turn whose first attempt ran (and died) and that is cancelled while queued
    for its next one ends ``aborted`` with ``started`` true: a result never says a turn that ran did
    not (its caller would repeat its side effects)."""
    async with Supervisor(workers=1, spares=0, heartbeat=0) as sup:
        handle = await sup.submit(AGENT, {"dir": str(tmp_path), "kill": "in_reserve"}, retry=True)
        # Cancelled as soon as its worker died (its resumed event is out): queued again, or just
        # started again: either way it ran once already.
        with anyio.fail_after(60):
            async with aclosing(handle.events()) as events:
                async for event in events:
                    if event.get("type") == "resumed":
                        await handle.cancel()
                        break
            result = await handle.result()
    assert result.attempts == 2 and result.started, result
    assert len(lines(tmp_path, "reserves")) in (1, 2)


async def test_step_records_a_worker_sends_past_the_limits_are_refused_at_the_supervisor() -> None:
    """LOOP-STEP-SIZE at the supervisor's boundary: a worker that sends step records itself, out of order, too
    large or past the turn's total, gets each refused with the reason (the supervisor keeps none of
    them), and the turn goes on."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(60):
            result = await sup.run("tests.agents.durable:raw_steps")
        assert result.outcome == "completed", result
        errors = result.output["errors"]
        assert "out of order" in errors[0]
        assert "over the limit" in errors[1]
        assert "would hold over" in errors[2]
        records = sup.steps.records(result.turn_id)
        assert records is not None and 6 <= len(records) <= 7  # only what fit
