"""The soak: many turns with random cancels, deadlines, crashes and stubborn agents.

Used two ways: ``tests/test_soak.py`` runs a reduced version in CI, and ``make soak``
(``python -m tests.support.soak``) runs the full one and writes ``benchmarks/SOAK.md`` with the
supervisor's file-descriptor and RSS curve, the outcomes by kind, the worst time from
supervisor SIGKILL to last descendant gone, and the fuzz frames tried.

The supervisor is embedded in this process, so this process's fds and RSS are the
supervisor's. Every turn is checked: exactly one result (a result hook counts deliveries per
turn id) and an outcome allowed for its kind.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import psutil

from supervisor import Supervisor

# kind -> (weight, allowed outcomes)
KINDS: dict[str, tuple[int, frozenset[str]]] = {
    "echo": (780, frozenset({"completed"})),
    "fail": (50, frozenset({"failed"})),
    "crash": (15, frozenset({"crashed"})),
    "cancel_cooperative": (50, frozenset({"aborted"})),
    "cancel_echo": (40, frozenset({"aborted", "completed"})),  # races the end: either, once
    "deadline": (30, frozenset({"aborted"})),
    "stubborn": (8, frozenset({"killed", "aborted"})),  # aborted only if cancelled before it started
    "session": (27, frozenset({"completed"})),
    # Attacks on the promises: an async agent that never awaits (only the ladder stops it once it
    # runs; aborted only if its deadline's Abort reached the worker between Started and the agent's
    # first instruction, seen once at load 140), a fork-without-exec daemon left behind by a turn
    # that completes, an output flood.
    "spin": (6, frozenset({"killed", "aborted"})),
    "forker": (12, frozenset({"completed"})),
    "flood": (6, frozenset({"completed"})),
}


# Cooperative agents get a grace that a loaded 2-core box always meets (they must end
# ``aborted``); the pool's default grace (0.05 s) is what stubborn agents get before SIGTERM.
COOPERATIVE_GRACE = 5.0


@dataclass
class Sample:
    turns: int
    seconds: float
    fds: int
    rss_mb: float
    zombies: int
    restarts: int


@dataclass
class Report:
    turns: int = 0
    seconds: float = 0.0
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    by_kind: dict[str, collections.Counter[str]] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    max_zombies: int = 0
    deliveries_max: int = 0
    restarts: int = 0
    escalations: dict[str, int] = field(default_factory=dict)


def _alive_with_start(pid: int, start: str) -> bool:
    """``pid`` is still the process that noted ``start`` (its start time), not a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == start and fields[0] != "Z"


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _zombies() -> int:
    n = 0
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                n += 1
        except psutil.Error:
            pass
    return n


async def soak(
    turns: int = 2500,
    *,
    submitters: int = 8,
    workers: int = 4,
    seed: int = 7,
    samples: int = 20,
    keep_results: int = 500,
    progress: bool = False,
) -> Report:
    """Run ``turns`` turns across ``submitters`` concurrent tasks; return what was seen."""
    rng = random.Random(seed)
    names = list(KINDS)
    weights = [KINDS[k][0] for k in names]
    plan = rng.choices(names, weights, k=turns)
    report = Report(turns=turns)
    deliveries: collections.Counter[str] = collections.Counter()
    done = 0
    every = max(1, turns // samples)
    t0 = time.monotonic()

    scratch = tempfile.mkdtemp(prefix="tpsoak")
    runs_log, pids_log = os.path.join(scratch, "runs"), os.path.join(scratch, "pids")

    def counted(kind: str) -> dict[str, str]:
        return {"kind": kind, "log": runs_log, "pids": pids_log}

    async with Supervisor(
        workers=workers, spares=1, grace=0.05, kill_after=0.3, keep_results=keep_results, worker_output=None
    ) as sup:
        sup.add_hooks(on_result=lambda turn, result: deliveries.update([turn.id]))

        def sample() -> None:
            z = _zombies()
            report.max_zombies = max(report.max_zombies, z)
            report.samples.append(
                Sample(
                    done,
                    time.monotonic() - t0,
                    _fds(),
                    psutil.Process().memory_info().rss / 2**20,
                    z,
                    sup.worker_restarts,
                )
            )
            if progress:
                s = report.samples[-1]
                print(
                    f"  {s.turns:>7} turns  {s.seconds:7.1f}s  fds {s.fds:4}  rss {s.rss_mb:6.1f} MiB"
                    f"  zombies {s.zombies}  restarts {s.restarts}",
                    file=sys.stderr,
                    flush=True,
                )

        sample()

        async def one(kind: str, r: random.Random, session: str) -> None:
            nonlocal done
            if kind == "echo":
                h = await sup.submit("examples.agents:echo", {"n": r.random()})
            elif kind == "fail":
                h = await sup.submit("examples.agents:failing")
            elif kind == "crash":
                h = await sup.submit("examples.agents:crasher", {"code": 3})
            elif kind == "cancel_cooperative":
                h = await sup.submit("examples.agents:slow", {"seconds": 30}, grace=COOPERATIVE_GRACE)
                if r.random() < 0.5:
                    async for _ in h.events():
                        break
                await h.cancel()
            elif kind == "cancel_echo":
                h = await sup.submit("examples.agents:echo", 1)
                await h.cancel()
            elif kind == "deadline":
                h = await sup.submit(
                    "examples.agents:slow",
                    {"seconds": 30},
                    timeout=r.choice([0.01, 0.05, 0.1]),
                    grace=COOPERATIVE_GRACE,
                )
            elif kind == "stubborn":
                h = await sup.submit("examples.agents:stubborn")
                async for _ in h.events():
                    break
                await h.cancel()
            elif kind == "spin":
                h = await sup.submit("tests.agents.soak:counted", counted("spin"), timeout=0.05)
            elif kind in ("forker", "flood"):
                h = await sup.submit("tests.agents.soak:counted", counted(kind))
            else:  # a session's turns run one at a time, in order
                h = await sup.submit("examples.agents:echo", kind, session=session)
            with anyio.fail_after(120):
                result = await h.result()
            # Popped once checked, so the harness's own memory stays flat: a second delivery for
            # this id would re-create the entry and be found at the end.
            delivered = deliveries.pop(h.turn_id, 0)
            report.deliveries_max = max(report.deliveries_max, delivered)
            if delivered != 1:
                report.wrong.append(f"{h.turn_id} {kind}: {delivered} results delivered")
            allowed = KINDS[kind][1]
            report.outcomes[result.outcome] += 1
            report.by_kind.setdefault(kind, collections.Counter())[result.outcome] += 1
            if result.outcome not in allowed:
                report.wrong.append(f"{h.turn_id} {kind}: {result.outcome} {result.error} {result.exit_code}")
            if kind == "deadline" and result.cause != {"kind": "deadline"}:
                report.wrong.append(f"{h.turn_id} deadline: cause {result.cause}")
            done += 1
            if done % every == 0:
                sample()

        async def submitter(index: int) -> None:
            r = random.Random(seed * 1000 + index)
            for i in range(index, turns, submitters):
                await one(plan[i], r, f"s{index}")

        async with anyio.create_task_group() as tg:
            for index in range(submitters):
                tg.start_soon(submitter, index)
        await sup.when_idle()
        report.seconds = time.monotonic() - t0
        if deliveries:
            report.wrong.append(f"results delivered again after being checked: {dict(deliveries)}")
            report.deliveries_max = max(report.deliveries_max, 2)
        status = await sup.status()
        report.restarts = status["worker_restarts"]
        # After the run, the harness's own small logs: blocking reads hold nothing up (ASYNC240).
        runs_text = Path(runs_log).read_text() if os.path.exists(runs_log) else ""  # noqa: ASYNC240
        runs = collections.Counter(runs_text.split())
        report.wrong += [f"{tid} ran {n} times" for tid, n in runs.items() if n > 1]
        if os.path.exists(pids_log):  # noqa: ASYNC240
            for line in Path(pids_log).read_text().splitlines():  # noqa: ASYNC240
                pid, start = line.split()
                if _alive_with_start(int(pid), start):
                    report.wrong.append(f"pid {pid}: a forker's background process outlived its turn")
                    os.kill(int(pid), signal.SIGKILL)
        shutil.rmtree(scratch, ignore_errors=True)
        report.escalations = dict(status["escalations"])
        sample()
    return report


def _table(report: Report) -> str:
    lines = [
        "| turns done | seconds | supervisor fds | supervisor RSS (MiB) | zombies | worker restarts |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines.extend(
        f"| {s.turns} | {s.seconds:.1f} | {s.fds} | {s.rss_mb:.1f} | {s.zombies} | {s.restarts} |"
        for s in report.samples
    )
    return "\n".join(lines)


def _outcomes(report: Report) -> str:
    kinds = sorted(report.by_kind)
    cols = ["completed", "failed", "aborted", "killed", "crashed"]
    lines = ["| kind | turns | " + " | ".join(cols) + " |", "| --- | ---: |" + " ---: |" * len(cols)]
    for k in kinds:
        c = report.by_kind[k]
        lines.append(f"| {k} | {sum(c.values())} | " + " | ".join(str(c.get(o, 0)) for o in cols) + " |")
    total = report.outcomes
    lines.append(
        f"| **all** | {sum(total.values())} | " + " | ".join(str(total.get(o, 0)) for o in cols) + " |"
    )
    return "\n".join(lines)


def _fuzz_counts(examples: int) -> str:
    """Run the hostile-input tests with more examples and collect the frames they report."""
    env = dict(os.environ, TURNPOOL_FUZZ_EXAMPLES=str(examples))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/test_hostile.py"],
        env=env,
        capture_output=True,
        text=True,
    )
    lines = [ln.strip().lstrip(".") for ln in proc.stdout.splitlines() if "frames" in ln and "tried" in ln]
    verdict = "passed" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
    return (
        "\n".join(f"- {ln}" for ln in lines)
        + f"\n- tests/test_hostile.py with {examples} examples per fuzzer: {verdict}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.soak")
    parser.add_argument("--turns", type=int, default=30_000)
    parser.add_argument("--submitters", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kill-rounds", type=int, default=10, help="supervisor SIGKILL measurements")
    parser.add_argument("--fuzz-examples", type=int, default=1000)
    parser.add_argument("--report", default="benchmarks/SOAK.md")
    parser.add_argument("--daemon-turns", type=int, default=30_000, help="turns through the SIGKILLed daemon")
    parser.add_argument("--daemon-kills", type=int, default=20)
    args = parser.parse_args()

    from worker import proctree

    proctree.set_child_subreaper()  # orphans of killed daemons come to us, where the soak can see them
    from tests.support.soak_daemon import daemon_soak, markdown

    print(f"daemon soak: {args.daemon_turns} turns, {args.daemon_kills} SIGKILLs ...", file=sys.stderr)
    dreport = anyio.run(lambda: daemon_soak(args.daemon_turns, kills=args.daemon_kills, progress=True))

    print(f"soak: {args.turns} turns ...", file=sys.stderr)
    report = anyio.run(
        lambda: soak(args.turns, submitters=args.submitters, workers=args.workers, samples=30, progress=True)
    )
    print(f"supervisor SIGKILL x{args.kill_rounds} ...", file=sys.stderr)
    from tests.test_supervisor_death import kill_host_and_measure

    kills = anyio.run(kill_host_and_measure, args.kill_rounds)
    print("fuzz ...", file=sys.stderr)
    fuzz = _fuzz_counts(args.fuzz_examples)

    first, last = report.samples[0], report.samples[-1]
    quarter = report.samples[len(report.samples) // 4]
    ok = not report.wrong and report.deliveries_max == 1 and dreport.ok
    text = f"""# Soak and reliability figures

Machine: {os.cpu_count()} cores (shared), Python {sys.version.split()[0]}.
Command: `make soak` (`.venv/bin/python -m tests.support.soak --turns {args.turns}`), run at
{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}. The CI version is `tests/test_soak.py` (2 500 turns).

## Soak

{args.turns} turns from {args.submitters} concurrent submitters on {args.workers} workers (+1 spare),
grace 0.05 s, kill_after 0.3 s, keep_results 500, in {report.seconds:.1f} s. Every turn got exactly one result
(max deliveries per turn id: {report.deliveries_max}); outcomes outside the allowed set: {len(report.wrong)}.
{"All checks passed." if ok else "FAILURES: " + "; ".join(report.wrong[:10])}

Outcomes by kind:

{_outcomes(report)}

Worker restarts: {report.restarts}; escalations: {report.escalations};
most zombies seen at a sample: {report.max_zombies}.

Supervisor fds: {first.fds} at start, {quarter.fds} at 25 %, {last.fds} at the end.
Supervisor RSS: {first.rss_mb:.1f} MiB at start, {quarter.rss_mb:.1f} MiB at 25 %,
{last.rss_mb:.1f} MiB at the end.

The curve:

{_table(report)}

## Supervisor SIGKILL → last descendant gone

An embedded supervisor in its own process, running a forker (2 grandchildren + a setsid double-forked
daemon, SIGTERM ignored), a stubborn CPU loop, a SIGTERM ignorer and a GIL-holding C call (plus one
spare), SIGKILLed {args.kill_rounds} times; time until every worker, guardian and descendant had exited
(pidfd events): median {sorted(kills)[len(kills) // 2] * 1000:.1f} ms, worst {max(kills) * 1000:.1f} ms.
(`tests/test_supervisor_death.py` does one round in CI with a 10 s bound.)

{
        markdown(
            dreport,
            f"make soak (python -m tests.support.soak --daemon-turns {args.daemon_turns} "
            f"--daemon-kills {args.daemon_kills})",
        )
    }
## Hostile input (fuzz frames tried)

{fuzz}
"""
    # The hostile-neighbour soak (make soak-hostile) appends its own sections: keep them.
    old = Path(args.report).read_text() if os.path.exists(args.report) else ""
    kept = old.find("\n## Hostile-neighbour soak")
    Path(args.report).write_text(text + (old[kept:] if kept >= 0 else ""))
    print(f"wrote {args.report}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
