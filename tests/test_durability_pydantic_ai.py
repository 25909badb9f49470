"""A pydantic-ai agent wrapped in ``worker.adapters.pydantic_ai.durable`` run as a ``retry=True``
turn (LOOP-RESUME): SIGKILL of its worker as a model request is made or inside a tool resumes the run
from its recorded messages; no call runs twice unless its tool is idempotent (then with the same
key), and a call whose outcome is unknown is told to the model (or fails the turn)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

pytest.importorskip("pydantic_ai", reason="needs the pydantic-ai extra")

from supervisor import Supervisor

pytestmark = pytest.mark.anyio

# Imported once, in the zygote: each kill's new worker forks with the framework and the agent loaded
# instead of importing them again (seconds each); its memory is the zygote's, never the killed one's,
# so what it resumes from is still only what was recorded.
PRELOAD = ("tests.agents.pydantic_durable",)


def write_plan(path: Path, d: Path, kill: str | None) -> None:
    """Where the agent kills its worker (it reads the file on each attempt: one turn at a time)."""
    path.write_text(json.dumps({"dir": str(d), "kill": kill}))


def lines(d: Path, name: str) -> list[str]:
    return (d / name).read_text().splitlines() if (d / name).exists() else []


@pytest.fixture
def plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "plan.json"
    monkeypatch.setenv("TP_PA_PLAN", str(path))
    return path


async def test_the_run_resumes_from_its_recorded_messages(tmp_path: Path, plan: Path) -> None:
    results = {}
    async with Supervisor(workers=1, spares=0, heartbeat=0, preload=PRELOAD) as sup:
        for kill in (None, "model2", "model3", "in_charge", "in_reserve"):
            d = tmp_path / str(kill)
            d.mkdir()
            write_plan(plan, d, kill)
            with anyio.fail_after(120):
                results[kill] = await sup.run("tests.agents.pydantic_durable:trip", "book it", retry=True)
    base = results[None]
    assert base.outcome == "completed" and base.attempts == 1, base
    assert base.output == "Done: charged 5 | reserved 12A"
    for kill in ("model2", "model3", "in_charge", "in_reserve"):
        r, d = results[kill], tmp_path / str(kill)
        assert r.outcome == "completed" and r.attempts == 2, (kill, r)
        assert len(lines(d, "charges")) == 1, kill
        reserves = lines(d, "reserves")
        if kill == "in_reserve":
            assert len(reserves) == 2 and reserves[0] == reserves[1], reserves  # same key
        else:
            assert len(reserves) == 1, kill
        if kill == "in_charge":
            assert "'c1'" in r.output and "unknown" in r.output, r.output
        else:
            assert r.output == base.output, (kill, r.output)
        # Only the request the kill cut is made again.
        assert len(lines(d, "opens")) == (4 if kill.startswith("model") else 3), (kill, lines(d, "opens"))


async def test_fail_on_an_unknown_call(tmp_path: Path, plan: Path) -> None:
    write_plan(plan, tmp_path, "in_charge")
    async with Supervisor(workers=1, spares=0, heartbeat=0, preload=PRELOAD) as sup:
        with anyio.fail_after(120):
            r = await sup.run("tests.agents.pydantic_durable:trip_strict", "book it", retry=True)
    assert r.outcome == "failed" and r.attempts == 2, r
    assert r.error is not None and r.error.type == "UnknownToolOutcome" and "'c1'" in r.error.message
    assert len(lines(tmp_path, "charges")) == 1
