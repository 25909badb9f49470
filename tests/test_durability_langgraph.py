"""A LangGraph graph compiled with ``worker.adapters.langgraph.TurnCheckpointer`` run as a
``retry=True`` turn (LOOP-RESUME): SIGKILL of its worker inside the model node or the tool node
resumes it from its last recorded checkpoint, a completed node never runs again, and a tool node
that started without completing is told to the model (or fails the turn)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

pytest.importorskip("langgraph", reason="needs the langgraph extra")

from supervisor import Supervisor

pytestmark = pytest.mark.anyio

# Imported once, in the zygote: each kill's new worker forks with the framework and the agent loaded
# instead of importing them again (seconds each); its memory is the zygote's, never the killed one's,
# so what it resumes from is still only what was recorded.
PRELOAD = ("tests.agents.langgraph_durable",)

AGENT = "tests.agents.langgraph_durable:durable_trip"


def lines(d: Path, name: str) -> list[str]:
    return (d / name).read_text().splitlines() if (d / name).exists() else []


def final_text(output: dict) -> str:  # type: ignore[type-arg]
    return str(output["messages"][-1]["content"])


async def test_graph_resumes_from_its_last_checkpoint_at_each_kill(tmp_path: Path) -> None:
    async with Supervisor(workers=2, spares=0, heartbeat=0, preload=PRELOAD) as sup:
        runs = {}
        for kill in (None, "model1", "model2", "in_charge"):
            d = tmp_path / str(kill)
            d.mkdir()
            prompt = {
                "input": {"messages": [{"role": "user", "content": "charge me"}], "dir": str(d), "kill": kill}
            }
            runs[kill] = await sup.submit(AGENT, prompt, retry=True)
        results = {}
        for kill, handle in runs.items():
            with anyio.fail_after(120):
                results[kill] = await handle.result()
    base = results[None]
    assert base.outcome == "completed" and base.attempts == 1, base
    assert final_text(base.output) == "Done: " + '{"charged": 5}'
    for kill in ("model1", "model2", "in_charge"):
        r, d = results[kill], tmp_path / str(kill)
        assert r.outcome == "completed" and r.attempts == 2, (kill, r)
        assert len(lines(d, "charges")) == 1, kill  # never twice
        if kill == "in_charge":
            text = final_text(r.output)
            assert "outcome of tool call 'call_c1'" in text and "unknown" in text, text
            assert len(lines(d, "opens")) == 2  # the planner's first answer was not asked again
        else:
            assert final_text(r.output) == final_text(base.output), kill
            # Only the planner call the kill cut is made again.
            assert len(lines(d, "opens")) == 3, (kill, lines(d, "opens"))


async def test_fail_on_an_unknown_tool_node(tmp_path: Path) -> None:
    prompt = {
        "input": {
            "messages": [{"role": "user", "content": "charge me"}],
            "dir": str(tmp_path),
            "kill": "in_charge",
        }
    }
    async with Supervisor(workers=1, spares=0, heartbeat=0, preload=PRELOAD) as sup:
        with anyio.fail_after(120):
            r = await sup.run("tests.agents.langgraph_durable:durable_trip_strict", prompt, retry=True)
    assert r.outcome == "failed" and r.attempts == 2, r
    assert r.error is not None and r.error.type == "UnknownToolOutcome" and "'call_c1'" in r.error.message
    assert len(lines(tmp_path, "charges")) == 1
