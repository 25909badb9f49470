"""LOOP-STEP-INSPECT for every recorder of steps: a LangGraph graph (``TurnCheckpointer``) and a pydantic-ai
agent (``durable``) run as ``retry=True`` turns through ``turnpool serve`` with its journal, the
daemon SIGKILLed inside the ``charge`` tool. ``turnpool result ID --steps`` and ``turnpool history
--steps`` then show the model's step with its call ``started`` (its outcome unknown); the daemon
restarted resumes the turn, and ``GET /v1/turns/{id}/steps`` shows every step and each call
``completed`` (the charge with the unknown-outcome answer the model was told)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from tests.support import httpkit
from tests.support.daemonkit import FAST, Served, short_dir, start, stop_process
from tests.support.durablekit import submit_until_its_daemon_dies

pytestmark = pytest.mark.anyio

ARGS = (*FAST, "--heartbeat", "0")


async def crash_then_inspect(
    home: Path, agent: str, prompt: Any, plan: Any = None, env: dict[str, str | None] | None = None
) -> tuple[Any, Any, dict[str, Any], Any]:
    """Submit ``agent`` to a daemon it kills (``plan(pid)`` first, if given), read its steps with the
    CLI from the journal, restart the daemon with HTTP and read them there once the turn ended:
    ``(result --steps, history --steps, the turn's HTTP result, GET .../steps)``."""
    journal = home / "journal.sqlite3"
    first: Served = start(*ARGS, "--journal", str(journal), home=home, env_extra=env)
    try:
        if plan is not None:
            plan(first.pid)
        turn_id = await submit_until_its_daemon_dies(first, agent, prompt(first.pid))
        shown = first.cli("result", turn_id, "--steps", "--journal", str(journal))
        listed = first.cli("history", "--steps", "--json", "--journal", str(journal))
    finally:
        stop_process(first.proc)
    second = start(*ARGS, "--journal", str(journal), "--http", "127.0.0.1:0", home=home, env_extra=env)
    try:
        async with httpkit.client(second) as http:
            with anyio.fail_after(60):
                done = await httpkit.result(http, turn_id)
            got = await http.get(f"/v1/turns/{turn_id}/steps")
            doc = (await http.get("/v1/openapi.json")).json()
    finally:
        stop_process(second.proc)
    assert shown.returncode == 0, shown.stderr
    assert listed.returncode == 0, listed.stderr
    assert got.status_code == 200, got.text
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    # The OpenAPI document describes every field a step and a call show.
    schemas = doc["components"]["schemas"]
    for step in got.json()["steps"]:
        assert set(step) <= set(schemas["TurnStep"]["properties"]), step
        for call in step["calls"]:
            assert set(call) <= set(schemas["StepCall"]["properties"]), call
    return json.loads(shown.stdout), rows, done, got.json()


def calls_of(steps: list[dict[str, Any]]) -> list[list[tuple[str, str]]]:
    return [[(c["name"], c["state"]) for c in s["calls"]] for s in steps]


async def test_a_langgraph_turn_shows_its_steps_and_calls(tmp_path: Path) -> None:
    pytest.importorskip("langgraph", reason="needs the langgraph extra")
    home = short_dir()

    def prompt(pid: int) -> Any:
        messages = [{"role": "user", "content": "charge me"}]
        return {"input": {"messages": messages, "dir": str(tmp_path), "kill": "in_charge", "pid": pid}}

    try:
        shown, rows, done, got = await crash_then_inspect(
            home, "tests.agents.langgraph_durable:durable_trip", prompt
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    # Before the restart: the planner's step, its charge started (the tool node began), no outcome.
    assert shown["result"] is None, shown
    steps = shown["steps"]
    assert calls_of(steps) == [[("charge", "started")]], steps
    assert steps[0]["node"] == "planner" and steps[0]["text"] == "Charging.", steps
    assert steps[0]["calls"][0]["call_id"] == "call_c1"
    assert steps[0]["calls"][0]["arguments"]["amount"] == 5, steps
    assert [r["steps"] for r in rows] == ["1 steps; calls: 1 started"], rows
    # Resumed and ended: the charge answered as unknown (never run again), then the final answer.
    assert done["outcome"] == "completed" and done["attempts"] == 2, done
    steps = got["steps"]
    assert calls_of(steps) == [[("charge", "completed")], []], steps
    told = steps[0]["calls"][0]
    assert "unknown" in str(told["output"]) and told["error"], told
    assert steps[1]["text"].startswith("Done:") and "unknown" in steps[1]["text"], steps
    assert len((tmp_path / "charges").read_text().splitlines()) == 1


async def test_a_pydantic_ai_turn_shows_its_steps_and_calls(tmp_path: Path) -> None:
    pytest.importorskip("pydantic_ai", reason="needs the pydantic-ai extra")
    home = short_dir()
    plan_path = tmp_path / "plan.json"

    def plan(pid: int) -> None:
        plan_path.write_text(json.dumps({"dir": str(tmp_path), "kill": "in_charge", "pid": pid}))

    try:
        shown, rows, done, got = await crash_then_inspect(
            home,
            "tests.agents.pydantic_durable:trip",
            lambda pid: "book it",
            plan,
            {"TP_PA_PLAN": str(plan_path)},
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert shown["result"] is None, shown
    steps = shown["steps"]
    assert calls_of(steps) == [[("charge", "started")]], steps
    assert steps[0]["calls"][0]["call_id"] == "c1" and steps[0]["calls"][0]["arguments"] == {"amount": 5}
    assert [r["steps"] for r in rows] == ["1 steps; calls: 1 started"], rows
    assert done["outcome"] == "completed" and done["attempts"] == 2, done
    steps = got["steps"]
    assert calls_of(steps) == [[("charge", "completed")], [("reserve", "completed")], []], steps
    assert "unknown" in steps[0]["calls"][0]["output"], steps
    assert steps[1]["calls"][0]["output"] == "reserved 12A", steps
    assert steps[2]["text"].startswith("Done: ") and steps[2]["calls"] == [], steps
    assert len((tmp_path / "charges").read_text().splitlines()) == 1
