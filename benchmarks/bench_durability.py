"""Step records (LOOP-STEP-DURABLE, LOOP-RESUME): what recording a step costs, and how fast a crashed turn
resumes.

*Cost per recorded step*: an agent in a worker records steps as an ``AgentLoop`` does for a tool step
(a model response; the call's ``started`` record, waited for until durable; its ``completed`` record,
waited for until durable), ≈ 200 bytes each, one step after the other; the time per step, through
``turnpool serve`` with the journal on (each wait ends when the journal committed the record), with
``--no-journal`` (the daemon's memory), and embedded. *Resume*: a 20-step ``AgentLoop`` turn
(``retry=True``) SIGKILLs its worker as its 21st model call opens; the second attempt replays the 20
recorded steps and reaches that call again: from the kill to that call (the exit seen, the tree
reaped, the turn queued again, a worker, the ``Run`` with the records, the replay), and the replay
alone (the agent's start to that call), through the daemon with the journal on.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import anyio

from ._common import command, med, ms, pct, table

TARGET_STEP = 0.001  # p50 per recorded step through the daemon, journal on
TARGET_RESUME = 0.050  # a 20-step turn: before its next model call


async def _steps_daemon(journal: bool, steps: int) -> list[float]:
    from supervisor import Client
    from tests.support import daemonkit

    home = daemonkit.short_dir()
    extra = ("--journal", str(home / "j.sqlite3")) if journal else ("--no-journal",)
    with daemonkit.serving(
        "--workers", "1", "--spares", "0", "--drain", "0", "--path", str(Path.cwd()), *extra
    ) as d:
        async with Client.connect(d.endpoint, timeout=120) as client:
            await client.run("benchmarks._durable_agents:record_steps", {"steps": 20})  # warm
            r = await client.run("benchmarks._durable_agents:record_steps", {"steps": steps})
    shutil.rmtree(home, ignore_errors=True)
    assert r.outcome == "completed", r
    return list(r.output)


async def _steps_embedded(steps: int) -> list[float]:
    from supervisor import Supervisor

    async with Supervisor(workers=1, spares=0) as sup:
        await sup.run("benchmarks._durable_agents:record_steps", {"steps": 20})
        r = await sup.run("benchmarks._durable_agents:record_steps", {"steps": steps})
    assert r.outcome == "completed", r
    return list(r.output)


async def _resume(repeats: int, steps: int) -> tuple[list[float], list[float]]:
    from supervisor import Client
    from tests.support import daemonkit

    total: list[float] = []
    replay: list[float] = []
    home = daemonkit.short_dir()
    args = ("--workers", "1", "--spares", "1", "--drain", "0", "--path", str(Path.cwd()))
    with daemonkit.serving(*args, "--journal", str(home / "j.sqlite3")) as d:
        async with Client.connect(d.endpoint, timeout=120) as client:
            for _ in range(repeats):
                work = Path(tempfile.mkdtemp(prefix="tpres"))
                r = await client.run(
                    "benchmarks._durable_agents:resume_after", {"dir": str(work), "steps": steps}, retry=True
                )
                assert r.outcome == "completed" and r.attempts == 2, r
                killed = float((work / "killed_at").read_text())
                total.append(float((work / "resumed_at").read_text()) - killed)
                replay.append(float((work / "replay_s").read_text()))
                shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)
    return total, replay


async def _main(quick: bool) -> str:
    steps = 200 if quick else 1000
    repeats = 3 if quick else 9
    on = await _steps_daemon(True, steps)
    off = await _steps_daemon(False, steps)
    emb = await _steps_embedded(steps)
    total, replay = await _resume(repeats, 20)
    rows = [
        ("daemon, journal on", ms(med(on)), ms(pct(on, 99))),
        ("daemon, `--no-journal`", ms(med(off)), ms(pct(off, 99))),
        ("embedded", ms(med(emb)), ms(pct(emb, 99))),
    ]
    verdict_step = "met" if med(on) <= TARGET_STEP else "missed"
    verdict_resume = "met" if med(total) <= TARGET_RESUME else "missed"
    return (
        "## durability: step records and resume\n\n"
        f"Target: ≤ 1 ms p50 per recorded step through the daemon with the journal on — {verdict_step} "
        f"({ms(med(on))}); a 20-step turn resumed ≤ 50 ms before its next model call — {verdict_resume} "
        f"({ms(med(total))} from the kill, replay {ms(med(replay))}).\n\n"
        f"Cost per recorded step ({steps:,} steps one after the other, each a model record, a `started` "
        "record waited for until durable, a `completed` record waited for until durable):\n\n"
        + table(("where", "p50 per step", "p99"), rows)
        + "\n\n"
        f"Resume of a 20-step `AgentLoop` turn killed (SIGKILL of its worker) as its 21st model call opens, "
        f"through the daemon with the journal on, {repeats} runs: from the kill to that call in the second "
        f"attempt p50 {ms(med(total))} (max {ms(max(total))}); of it, the replay in the worker (the "
        f"agent's start to that call) p50 {ms(med(replay))}.\n\n"
        f"Rerun: {command('durability', quick)}."
    )


def run(quick: bool) -> str:
    return anyio.run(_main, quick)
