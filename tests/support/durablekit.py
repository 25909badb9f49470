"""Helpers for the step-record tests (``test_durability*.py``): the 3-tool turn of
``tests/agents/durable.py``, its kill boundaries, what a turn killed once at one of them and
resumed must show, and turns run through daemons they SIGKILL (restarted on their journal)."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from supervisor import Client, TurnHandle, TurnResult
from tests.support.daemonkit import FAST, Served, start, stop_process, wait_journal_released

AGENT = "tests.agents.durable:trip"
# The step-record tests' daemons: no heartbeat (a turn that kills its daemon needs none to be noticed).
ARGS = (*FAST, "--heartbeat", "0")
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
    boundary: str,
    d: Path,
    result: TurnResult,
    events: list[Any],
    baseline: dict[str, Any],
    first_attempt_events: bool = False,
) -> None:
    """What a turn killed once at ``boundary`` and resumed must show (worker or daemon alike).
    ``first_attempt_events``: the follower also saw the first attempt (the supervisor outlived it)."""
    assert result.outcome == "completed", (boundary, result)
    assert result.attempts == 2, (boundary, result)
    assert (d / "killed").exists(), boundary
    resumed = [e for e in events if isinstance(e, dict) and e.get("type") == "resumed"]
    assert resumed == [{"type": "resumed", "attempt": 2, "from_step": from_step(boundary)}], (
        boundary,
        events,
    )
    # Each attempt's events in order, the resumed event between them: the first attempt's up to the
    # kill, then only what the second attempt did anew (what it reused is not told again).
    at = events.index(resumed[0])
    k = from_step(boundary)
    if first_attempt_events:
        before = [e.get("text") for e in events[:at] if e.get("type") == "delta"]
        asked = k + (1 if boundary.startswith("model") or boundary == "end" else 0)
        assert before[: min(k, 3)] == [f"step {n}. " for n in range(1, min(k, 3) + 1)], (boundary, events)
        assert len(before) <= asked, (boundary, before)
    after = [e.get("text") for e in events[at + 1 :] if e.get("type") == "delta"]
    fresh = [f"step {n}. " for n in range(k + 1, 4)] + ([] if boundary == "end" else [result.output["text"]])
    assert after == fresh, (boundary, events)
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


async def submit_until_its_daemon_dies(served: Served, agent: str, value: Any) -> str:
    """Submit ``value`` to ``agent`` with ``retry=True`` on the daemon ``served``, which the turn
    SIGKILLs; once the daemon is dead (-9), return the turn's id."""
    async with Client.connect(served.endpoint) as client:
        handle = await client.submit(agent, value, retry=True)
    with anyio.fail_after(60):
        code = await anyio.to_thread.run_sync(served.proc.wait)
    assert code == -9, code
    return handle.turn_id


async def result_and_events(endpoint: str, turn_id: str) -> tuple[TurnResult, list[Any]]:
    """The turn's result from the daemon at ``endpoint``, and every event it kept (all attempts')."""
    async with Client.connect(endpoint) as client:
        with anyio.fail_after(60):
            handle = client.handle(turn_id)
            result = await handle.result()
            async with aclosing(handle.events()) as events:
                return result, [e async for e in events]


async def run_through_killed_daemons(
    home: Path, journal: Path, agent: str, baseline: Any, values_of: list[Callable[[int], Any]]
) -> tuple[TurnResult, list[tuple[TurnResult, list[Any]]]]:
    """A chain of daemons on one ``journal``. ``baseline`` first runs unkilled as a ``retry=True``
    turn of ``agent`` on the first daemon; then each ``values_of[k](the daemon's pid)`` is submitted
    to the daemon running then, which that turn SIGKILLs; the next daemon, started on the same
    journal, resumes it, its result and every event it kept are read there, and the next value
    goes to that daemon. Each turn is killed once and resumed by a new daemon from what the journal
    committed, as with daemons of its own, for one daemon start per turn instead of two; one worker
    each, so a framework the agent imports is imported once per daemon. Returns the baseline's
    result and each turn's result and events, in order."""
    served = start(*ARGS, "--workers", "1", "--journal", str(journal), home=home)
    out: list[tuple[TurnResult, list[Any]]] = []
    try:
        async with Client.connect(served.endpoint) as client:
            handle = await client.submit(agent, baseline, retry=True)
        plain, _ = await result_and_events(served.endpoint, handle.turn_id)
        for k, value_of in enumerate(values_of):
            try:
                turn_id = await submit_until_its_daemon_dies(served, agent, value_of(served.pid))
                stop_process(served.proc)
                wait_journal_released(journal)
                served = start(*ARGS, "--workers", "1", "--journal", str(journal), home=home)
                out.append(await result_and_events(served.endpoint, turn_id))
            except BaseException as exc:
                exc.add_note(f"in the chain's turn {k} (the {k + 1}th value)")
                raise
    finally:
        stop_process(served.proc)
    return plain, out


async def result_on_a_new_daemon(home: Path, journal: Path, turn_id: str) -> TurnResult:
    """Start a daemon on ``journal`` (its recovery resumes what it holds), wait for the turn's
    result there, and stop it."""
    served = start(*ARGS, "--journal", str(journal), home=home)
    try:
        async with Client.connect(served.endpoint) as client:
            with anyio.fail_after(60):
                return await client.handle(turn_id).result()
    finally:
        stop_process(served.proc)
