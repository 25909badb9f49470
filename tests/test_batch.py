"""The batch runner: one line per job, Ctrl-C then --resume, retries, input validation, the
Python API with its progress callback, and the same batch through a daemon (``--connect``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import supervisor
import supervisor.batch
import wire
from supervisor import Supervisor
from supervisor.batch import (
    BatchInputError,
    BatchProgress,
    BatchRun,
    OutputNotEmpty,
    prepare_batch,
    run_batch,
    turn_id_for,
)

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from supervisor.cli.main import entry; entry()", "batch"]

E = "examples.agents:"


def checkout_env() -> dict[str, str]:
    """The examples live in the checkout, not in the installed package: the CLI's workers (which
    never import from the working directory) find them through PYTHONPATH."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def write_jobs(path: Path, jobs: list[Any]) -> Path:
    with open(path, "w") as f:
        for job in jobs:
            f.write((job if isinstance(job, str) else json.dumps(job)) + "\n")
    return path


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every result line; each must be a whole JSON object (no torn line)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), "the last line is torn"
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Bounded poll of a file or a process (the event we wait for lives in another process)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)  # allowed: bounded poll of a file written by another process


def cli(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *map(str, args)], cwd=ROOT, env=checkout_env(), capture_output=True, text=True, timeout=timeout
    )


def start_cli(*args: str | Path, stderr: Path) -> subprocess.Popen[bytes]:
    with open(stderr, "wb") as err:
        return subprocess.Popen(
            [*CLI, *map(str, args)], cwd=ROOT, env=checkout_env(), stdout=subprocess.DEVNULL, stderr=err
        )


def finals(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """id → its final line; fails on a second final line for an id."""
    out: dict[str, dict[str, Any]] = {}
    for rec in lines:
        if rec["final"] and rec["outcome"] != "invalid":
            assert rec["id"] not in out, f"job {rec['id']} has two final lines"
            out[rec["id"]] = rec
    return out


def test_batch_public_names_and_command() -> None:
    """The batch module's public names are pinned, and the console script has ``batch`` with the
    documented options and exit codes."""
    import supervisor.batch as batch
    from supervisor.cli import main as _cli

    assert {
        "run_batch",
        "prepare_batch",
        "BatchRun",
        "BatchProgress",
        "BatchSummary",
        "BatchInputError",
        "OutputNotEmpty",
        "open_backend",
        "turn_id_for",
    } <= set(batch.__all__)
    assert (batch.EXIT_OK, batch.EXIT_FAILED, batch.EXIT_USAGE, batch.EXIT_INTERRUPTED) == (0, 1, 2, 130)
    args = _cli.build_parser().parse_args(
        [
            "batch",
            "j.jsonl",
            "--agent",
            "a.b:c",
            "-o",
            "o.jsonl",
            "--workers",
            "3",
            "--timeout",
            "2",
            "--retries",
            "2",
            "--retry-on",
            "crashed,failed",
            "--resume",
            "--fail-fast",
            "--skip-invalid",
        ]
    )
    assert (args.workers, args.timeout, args.retries, args.retry_on) == (3, 2.0, 2, {"crashed", "failed"})
    assert args.resume and args.fail_fast and args.skip_invalid and args.connect is None
    assert (
        _cli.build_parser().parse_args(["batch", "j", "-o", "o", "--connect", "ipc:///x"]).connect
        == "ipc:///x"
    )


# ---- the 2,000-job batch ---------------------------------------------------------------------


def mixed_job(i: int) -> tuple[dict[str, Any], str]:
    """Job ``i`` of the mixed batch and the outcome it must end with."""
    jid = f"job-{i:04d}"
    if i % 1000 == 21:
        return {"id": jid, "agent": E + "stubborn", "input": {"seconds": 60}, "timeout": 0.2}, "killed"
    if i % 500 == 13:
        return {"id": jid, "agent": E + "crasher", "input": {"code": 3}}, "crashed"
    if i % 250 == 33:
        return {"id": jid, "agent": E + "slow", "input": {"seconds": 30}, "timeout": 0.2}, "aborted"
    if i % 100 == 7:
        return {"id": jid, "agent": E + "failing", "input": {"message": f"no {i}"}}, "failed"
    agent = ("noop", "echo", "echo_sync")[i % 3]
    return {"id": jid, "agent": E + agent, "input": {"i": i}}, "completed"


def test_two_thousand_mixed_jobs_one_line_each(tmp_path: Path) -> None:
    """2,000 jobs of every outcome on 2 workers: each id has exactly one (final) line with the
    outcome its agent must produce, completed outputs are the inputs, and the exit code is 1."""
    pairs = [mixed_job(i) for i in range(2000)]
    jobs = write_jobs(tmp_path / "jobs.jsonl", [job for job, _ in pairs])
    out = tmp_path / "out.jsonl"
    proc = cli(jobs, "-o", out, "--workers", "2", "--grace", "0.2", "--kill-after", "0.5", timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = read_lines(out)
    assert len(lines) == 2000
    assert Counter(rec["id"] for rec in lines) == Counter(job["id"] for job, _ in pairs)
    expected = {job["id"]: (job, outcome) for job, outcome in pairs}
    for rec in lines:
        job, outcome = expected[rec["id"]]
        assert rec["outcome"] == outcome, rec
        assert rec["final"] is True and rec["attempts"] == 1
        assert rec["turn_id"].endswith("-a1")
        if outcome == "completed":
            assert rec["output"] == (None if job["agent"].endswith("noop") else job["input"])
        elif outcome in ("killed", "aborted"):
            assert rec["cause"] == {"kind": "deadline"}
        elif outcome == "crashed":
            assert rec["exit_code"] == 3 and rec["error"]["type"] == "WorkerCrashed"
        elif outcome == "failed":
            assert rec["error"]["type"] == "ValueError"
    assert "killed" in proc.stdout and "crashed" in proc.stdout  # the summary table


# ---- Ctrl-C, then --resume ---------------------------------------------------------------------


def test_sigint_then_resume_completes_without_duplicates(tmp_path: Path) -> None:
    """SIGINT mid-batch: exit 130, running jobs recorded aborted/user/not final; --resume runs
    exactly the jobs without a final line, so every id ends with one final line, none twice,
    and the interrupted ones count their second attempt."""
    ids = [f"s{i}" for i in range(40)]
    jobs = write_jobs(tmp_path / "jobs.jsonl", [{"id": jid, "input": {"seconds": 0.2}} for jid in ids])
    out, err = tmp_path / "out.jsonl", tmp_path / "err.txt"
    runner = start_cli(
        jobs, "-o", out, "--agent", E + "slow", "--workers", "2", "--concurrency", "4", stderr=err
    )
    try:
        wait_until(lambda: count_lines(out) >= 4, 120, "the first result lines")
        runner.send_signal(signal.SIGINT)
        assert runner.wait(timeout=60) == 130, err.read_text()
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    first = read_lines(out)
    interrupted = [rec for rec in first if not rec["final"]]
    assert interrupted, "no job was running at the SIGINT"
    assert len(first) < len(ids), "the batch finished before the SIGINT"
    for rec in interrupted:
        assert rec["outcome"] == "aborted" and rec["cause"] == {"kind": "user"} and rec["attempts"] == 1
    done_before = finals(first)
    assert all(rec["outcome"] == "completed" for rec in done_before.values())

    proc = cli(jobs, "-o", out, "--agent", E + "slow", "--workers", "2", "--resume")
    assert proc.returncode == 0, proc.stderr
    lines = read_lines(out)
    final = finals(lines)
    assert sorted(final) == sorted(ids)  # no lost id, none final twice
    assert all(rec["outcome"] == "completed" for rec in final.values())
    second = lines[len(first) :]
    assert not {rec["id"] for rec in second} & set(done_before), "a finished job ran again"
    assert len(second) == len(ids) - len(done_before)
    for rec in interrupted:
        assert final[rec["id"]]["attempts"] == 2
        assert final[rec["id"]]["turn_id"] != rec["turn_id"]

    again = cli(jobs, "-o", out, "--agent", E + "slow", "--workers", "2", "--resume")
    assert again.returncode == 0, again.stderr
    assert read_lines(out) == lines  # running it twice never runs a finished job twice


def test_second_sigint_stops_at_once(tmp_path: Path) -> None:
    """Stubborn turns with a 60 s grace: the first SIGINT waits on them, the second records them
    (not final) and kills their trees at once — well before the grace — and nothing is left."""
    jobs = write_jobs(
        tmp_path / "jobs.jsonl", [{"id": f"st{i}", "input": {"seconds": 600}} for i in range(2)]
    )
    out, err = tmp_path / "out.jsonl", tmp_path / "err.txt"
    runner = start_cli(
        jobs,
        "-o",
        out,
        "--agent",
        E + "stubborn",
        "--workers",
        "2",
        "--grace",
        "60",
        "--progress-interval",
        "0.1",
        stderr=err,
    )
    try:
        wait_until(lambda: "running 2" in err.read_text(), 60, "both jobs running")
        runner.send_signal(signal.SIGINT)
        wait_until(lambda: "again to stop at once" in err.read_text(), 30, "the first SIGINT handled")
        t0 = time.monotonic()
        runner.send_signal(signal.SIGINT)
        assert runner.wait(timeout=50) == 130, err.read_text()
        assert time.monotonic() - t0 < 50  # generous: the grace alone is 60 s
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    lines = read_lines(out)
    assert sorted(rec["id"] for rec in lines) == ["st0", "st1"]
    assert all(not rec["final"] and rec["outcome"] == "aborted" for rec in lines)


@pytest.mark.anyio
async def test_interrupt_records_a_killed_turn_as_interrupted(tmp_path: Path) -> None:
    """BatchRun.interrupt(): a stubborn turn ignores the abort and is killed after its grace; the
    job is still recorded aborted/user/not final (the turn's own outcome kept in turn_outcome)
    and the jobs not yet submitted have no line."""
    jobs = [{"id": "stubborn", "agent": E + "stubborn", "input": {"seconds": 600}}]
    jobs += [{"id": f"later{i}", "agent": E + "echo", "input": i} for i in range(5)]
    out = tmp_path / "out.jsonl"
    plan = prepare_batch(jobs, out)
    with anyio.fail_after(120):
        async with Supervisor(workers=1, spares=0, grace=0.2, kill_after=0.5) as sup:
            run = BatchRun(plan, sup, concurrency=1)
            summaries: list[Any] = []

            async def go() -> None:
                summaries.append(await run.run())

            async with anyio.create_task_group() as tg:
                tg.start_soon(go)
                turn_id = turn_id_for(plan.batch, "stubborn", 1)
                while True:  # bounded poll (fail_after): the lane submits at its first step
                    try:
                        handle = sup.handle(turn_id)
                        break
                    except supervisor.UnknownTurn:
                        await anyio.lowlevel.checkpoint()
                async with contextlib.aclosing(handle.events()) as events:
                    async for _ in events:  # stubborn emits once it runs
                        break
                run.interrupt()
            result = await sup.handle(turn_id).result()
    assert result.outcome == "killed" and result.cause == {"kind": "user"}
    [rec] = read_lines(out)
    assert (rec["id"], rec["outcome"], rec["final"]) == ("stubborn", "aborted", False)
    assert rec["cause"] == {"kind": "user"}
    assert rec["turn_outcome"] == "killed" and rec["exit_code"] is not None
    [summary] = summaries
    assert summary.stopped == "interrupted" and summary.exit_code == 130 and summary.not_run == 5


# ---- retries -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_retries_recorded_in_attempts(tmp_path: Path) -> None:
    """--retries 2: an always-crashing job makes 3 attempts (the 2 earlier ones listed); with
    failed in retry_on a fail-once job completes on its 2nd; by default (crashed,killed) a
    failing job is not retried."""
    jobs = [
        {"id": "always", "agent": E + "crasher", "input": {"code": 5}},
        {"id": "once", "agent": "tests.agents.batch:fail_once", "input": {"marker": str(tmp_path / "m")}},
    ]
    out, out2 = tmp_path / "out.jsonl", tmp_path / "out2.jsonl"
    with anyio.fail_after(120):
        async with Supervisor(workers=2, spares=1) as sup:
            summary = await run_batch(jobs, out, backend=sup, retries=2, retry_on={"crashed", "failed"})
            default = await run_batch([{"id": "fails", "agent": E + "failing"}], out2, backend=sup, retries=2)
    by_id = {rec["id"]: rec for rec in read_lines(out)}
    assert len(by_id) == 2 and len(read_lines(out)) == 2
    always = by_id["always"]
    assert always["outcome"] == "crashed" and always["attempts"] == 3 and always["turn_id"].endswith("-a3")
    assert [p["outcome"] for p in always["previous_attempts"]] == ["crashed", "crashed"]
    assert [p["turn_id"][-3:] for p in always["previous_attempts"]] == ["-a1", "-a2"]
    once = by_id["once"]
    assert once["outcome"] == "completed" and once["attempts"] == 2 and once["output"]["recovered"] is True
    assert once["previous_attempts"][0]["error"] == {"type": "RuntimeError", "message": "first attempt fails"}
    assert summary.retries == 3 and summary.exit_code == 1
    [fails] = read_lines(out2)
    assert fails["outcome"] == "failed" and fails["attempts"] == 1 and "previous_attempts" not in fails
    assert default.retries == 0


# ---- bad input -----------------------------------------------------------------------------------


def test_invalid_lines_reported_by_number(tmp_path: Path) -> None:
    """Not JSON, no id, a repeated id, a bad agent, an unknown key: each reported with its line
    number, exit 2, nothing ran; with --skip-invalid the valid jobs run and the rest are
    recorded ``invalid`` with their line numbers (exit 1)."""
    jobs = write_jobs(
        tmp_path / "jobs.jsonl",
        [
            {"id": "ok", "input": 1},  # 1
            "{not json",  # 2
            "",  # 3 (blank: skipped)
            {"input": 2},  # 4
            {"id": "ok", "input": 3},  # 5
            {"id": "bad-agent", "agent": "no colon"},  # 6
            {"id": "typo", "input": 4, "timout": 3},  # 7
            {"id": "ok2", "input": 5},  # 8
        ],
    )
    out = tmp_path / "out.jsonl"
    proc = cli(jobs, "-o", out, "--agent", E + "echo", "--workers", "1")
    assert proc.returncode == 2
    for n in (2, 4, 5, 6, 7):
        assert f"jobs.jsonl:{n}:" in proc.stderr, proc.stderr
    for n in (1, 3, 8):
        assert f"jobs.jsonl:{n}:" not in proc.stderr
    assert "repeats line 1" in proc.stderr and "nothing ran" in proc.stderr
    assert not out.exists()

    proc = cli(jobs, "-o", out, "--agent", E + "echo", "--workers", "1", "--skip-invalid")
    assert proc.returncode == 1, proc.stderr
    lines = read_lines(out)
    assert sorted(rec["line"] for rec in lines if rec["outcome"] == "invalid") == [2, 4, 5, 6, 7]
    assert {rec["id"]: rec["output"] for rec in lines if rec["outcome"] == "completed"} == {"ok": 1, "ok2": 5}


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    """A missing jobs file, an unknown --retry-on outcome, and results already in the output
    without --resume are usage errors (exit 2), before any process starts."""
    out = tmp_path / "out.jsonl"
    assert cli(tmp_path / "missing.jsonl", "-o", out, "--agent", E + "echo").returncode == 2
    jobs = write_jobs(tmp_path / "jobs.jsonl", [{"id": 1, "input": None}])
    assert cli(jobs, "-o", out, "--agent", E + "echo", "--retry-on", "completed").returncode == 2
    out.write_text('{"id": 1, "outcome": "completed", "final": true}\n')
    proc = cli(jobs, "-o", out, "--agent", E + "echo")
    assert proc.returncode == 2 and "--resume" in proc.stderr


def test_prepare_batch_resume_state(tmp_path: Path) -> None:
    """prepare_batch: an interrupted line is not final (the job runs again with its next attempt),
    a torn last line is dropped on resume, and the batch key is kept for the turn ids."""
    jobs = [{"id": i, "input": i} for i in range(4)]
    out = tmp_path / "out.jsonl"
    out.write_text(
        '{"id": 0, "outcome": "completed", "final": true, "attempts": 1, "batch": "k1"}\n'
        '{"id": 1, "outcome": "aborted", "final": false, "attempts": 1, "batch": "k1"}\n'
        '{"id": 2, "outcome": "comp'
    )
    with pytest.raises(OutputNotEmpty):
        prepare_batch(jobs, out, agent=E + "echo")
    with pytest.raises(BatchInputError) as info:
        prepare_batch([*jobs, {"id": "0", "input": 1}], out, agent=E + "echo", resume=True)
    assert [bad.line for bad in info.value.invalid] == [5]  # "0" repeats 0
    plan = prepare_batch(jobs, out, agent=E + "echo", resume=True)
    assert plan.batch == "k1"
    assert [job.id for job in plan.pending] == [1, 2, 3]
    assert plan.previous.attempts == {"0": 1, "1": 1}
    assert out.read_bytes().endswith(b'"batch": "k1"}\n')  # the torn tail is gone


# ---- the Python API ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_run_batch_with_progress_callback(tmp_path: Path) -> None:
    """run_batch from Python (embedded pool opened for the batch): the callback sees a snapshot
    at the start and after each job, done counting up to the total; the summary says 0."""
    seen: list[BatchProgress] = []
    jobs = [{"id": f"p{i}", "input": {"i": i}} for i in range(30)]
    out = tmp_path / "out.jsonl"
    with anyio.fail_after(120):
        summary = await run_batch(jobs, out, workers=2, agent=E + "echo", progress=seen.append)
    assert [p.done for p in seen] == list(range(31))
    assert all(p.total == 30 for p in seen)
    assert seen[-1].counts == {"completed": 30} and seen[-1].running == 0
    assert seen[-1].last is not None and seen[-1].last["outcome"] == "completed"
    assert summary.exit_code == 0 and summary.counts == {"completed": 30} and len(summary.slowest) == 10
    assert sorted(rec["output"]["i"] for rec in read_lines(out)) == list(range(30))


@pytest.mark.anyio
async def test_resubmitted_attempt_finds_its_turn(tmp_path: Path) -> None:
    """Turn ids are deterministic per batch, job and attempt: if the runner lost a line (died
    after the turn ended), --resume resubmits the same turn id and gets the same turn's result
    instead of running the job again."""
    jobs = [{"id": f"i{i}", "input": {"i": i}} for i in range(5)]
    out = tmp_path / "out.jsonl"
    with anyio.fail_after(120):
        async with Supervisor(workers=1, spares=0) as sup:
            await run_batch(jobs, out, backend=sup, agent=E + "echo")
            lines = read_lines(out)
            lost = lines[-1]
            out.write_text("".join(json.dumps(rec) + "\n" for rec in lines[:-1]))
            summary = await run_batch(jobs, out, backend=sup, agent=E + "echo", resume=True)
            assert (await sup.status())["outcomes"] == {"completed": 5}  # five turns ran, not six
    again = read_lines(out)[-1]
    assert summary.skipped == 4 and summary.counts == {"completed": 1}
    assert again["turn_id"] == lost["turn_id"] == turn_id_for(lost["batch"], lost["id"], 1)
    same = ("worker_pid", "run_s", "output")
    assert [again[k] for k in same] == [lost[k] for k in same]


@pytest.mark.anyio
async def test_fail_fast_stops_at_the_first_failure(tmp_path: Path) -> None:
    """fail_fast: after the first job that does not complete nothing more is submitted; the
    jobs never run have no line and the exit code is 1."""
    jobs = [{"id": "bad", "agent": E + "failing"}] + [{"id": f"ok{i}", "input": i} for i in range(50)]
    out = tmp_path / "out.jsonl"
    with anyio.fail_after(120):
        summary = await run_batch(jobs, out, workers=1, agent=E + "echo", concurrency=1, fail_fast=True)
    lines = read_lines(out)
    assert lines[0]["id"] == "bad" and lines[0]["outcome"] == "failed"
    assert len(lines) < len(jobs) and summary.stopped == "fail-fast" and summary.exit_code == 1
    assert summary.not_run == len(jobs) - len(lines)


class ClientLike:
    """A backend with only the public methods a daemon ``Client`` offers (``status`` a coroutine,
    as over a socket), over an embedded supervisor: the engine must need nothing more."""

    def __init__(self, sup: Supervisor) -> None:
        self._sup = sup

    async def submit(self, agent: str, input: Any = None, **kwargs: Any) -> supervisor.TurnHandle:
        return await self._sup.submit(agent, input, **kwargs)

    async def cancel(self, turn_id: str, cause: Any = None) -> Any:
        return await self._sup.cancel(turn_id, cause)

    async def status(self) -> dict[str, Any]:
        return await self._sup.status()

    async def when_idle(self) -> None:
        await self._sup.when_idle()


@pytest.mark.anyio
async def test_cancelling_run_batch_on_a_client_like_backend(tmp_path: Path) -> None:
    """Through a backend with only the Client's methods: cancelling ``run_batch`` while two slow
    jobs run records both (aborted, cause user, not final) and cancels their turns (cause user)."""
    jobs = [{"id": f"e{i}", "agent": E + "echo", "input": i} for i in range(3)]
    jobs += [{"id": f"slow{i}", "agent": E + "slow", "input": {"seconds": 60}} for i in range(2)]
    out = tmp_path / "out.jsonl"
    echoes_done = anyio.Event()

    def progress(p: BatchProgress) -> None:
        if p.counts.get("completed") == 3:
            echoes_done.set()

    with anyio.fail_after(120):
        async with Supervisor(workers=2, spares=0) as sup:
            # Both names known first: the first submit of a name waits for its probe (ADAPT-PROBE), and
            # the lanes' submits are then accepted in the order their probes answer, so the slow jobs
            # could take both workers before the echoes this test waits for.
            await sup.run(E + "echo", 0)
            await sup.run(E + "slow", {"seconds": 0})
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: run_batch(jobs, out, backend=ClientLike(sup), progress=progress))
                await echoes_done.wait()
                batch = read_lines(out)[0]["batch"]
                slow_ids = [turn_id_for(batch, f"slow{i}", 1) for i in range(2)]
                for turn_id in slow_ids:
                    async with contextlib.aclosing(sup.handle(turn_id).events()) as events:
                        async for _ in events:  # slow emits once it runs
                            break
                tg.cancel_scope.cancel()
            results = [await sup.handle(turn_id).result() for turn_id in slow_ids]
    assert [(r.outcome, r.cause) for r in results] == [("aborted", {"kind": "user"})] * 2
    lines = read_lines(out)
    assert len(lines) == 5
    slow = [rec for rec in lines if rec["id"].startswith("slow")]
    interrupted = ("aborted", False, {"kind": "user"})
    assert [(rec["outcome"], rec["final"], rec["cause"]) for rec in slow] == [interrupted] * 2


# ---- through a daemon ------------------------------------------------------------------------------


def test_same_batch_through_connect(tmp_path: Path) -> None:
    """The mixed batch (smaller) against a real ``turnpool serve``: every job has exactly one line
    with the outcome its agent must produce; a --resume run after it runs nothing again."""
    sock_dir = Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / f"tpb-{os.getpid()}"
    sock_dir.mkdir(mode=0o700, exist_ok=True)
    endpoint = f"ipc://{sock_dir}/d.sock"
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from supervisor.cli.main import entry; entry()",
            "serve",
            "--endpoint",
            endpoint,
            "--workers",
            "2",
            "--grace",
            "0.2",
            "--kill-after",
            "0.5",
        ],
        cwd=ROOT,
        env=checkout_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: (sock_dir / "d.sock").exists(), 60, "the daemon's socket")
        pairs = [mixed_job(i) for i in range(300)]
        jobs = write_jobs(tmp_path / "jobs.jsonl", [job for job, _ in pairs])
        out = tmp_path / "out.jsonl"
        proc = cli(
            jobs, "-o", out, "--connect", endpoint, "--grace", "0.2", "--kill-after", "0.5", timeout=300
        )
        assert proc.returncode == 1, proc.stderr
        lines = read_lines(out)
        assert Counter(rec["id"] for rec in lines) == Counter(job["id"] for job, _ in pairs)
        expected = {job["id"]: outcome for job, outcome in pairs}
        assert all(rec["outcome"] == expected[rec["id"]] for rec in lines)
        again = cli(jobs, "-o", out, "--connect", endpoint, "--resume")
        assert again.returncode == 1 and read_lines(out) == lines
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        for p in sock_dir.iterdir():
            p.unlink()
        sock_dir.rmdir()


def test_unusual_lines_are_refused_before_anything_runs(tmp_path: Path) -> None:
    """BATCH-CHECK: a line nested 100,000 deep, a lone-surrogate id, a session LINK-TURN-ID refuses, an input
    of 40 MB (above the message limit) and an integer too large to encode are each reported by
    line number, exit 2, one line each, nothing ran (was: a traceback, after other jobs had
    started and were interrupted); with --skip-invalid the others run and these are recorded."""
    deep = '{"id": "deep", "input": ' + "[" * 100_000 + "]" * 100_000 + "}"
    jobs = write_jobs(
        tmp_path / "jobs.jsonl",
        [
            {"id": "ok", "input": 1},  # 1
            deep,  # 2
            '{"id": "x\\ud800", "input": 2}',  # 3
            {"id": "s", "input": 3, "session": "a\u0000b"},  # 4
            {"id": "big", "input": "x" * (40 * 2**20)},  # 5
            {"id": "huge-int", "input": 2**70},  # 6
            '{"id": "sur-input", "input": "\\udc80"}',  # 7
            {"id": "ok2", "input": 4},  # 8
        ],
    )
    out = tmp_path / "out.jsonl"
    proc = cli(jobs, "-o", out, "--agent", E + "echo", "--workers", "1")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for n in (2, 3, 4, 5, 6, 7):
        assert len([line for line in proc.stderr.splitlines() if f"jobs.jsonl:{n}:" in line]) == 1, (
            proc.stderr
        )
    assert "nests too deeply" in proc.stderr and "lone surrogate" in proc.stderr and "limit" in proc.stderr
    assert not out.exists()
    proc = cli(jobs, "-o", out, "--agent", E + "echo", "--workers", "1", "--skip-invalid")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = read_lines(out)
    assert sorted(rec["line"] for rec in lines if rec["outcome"] == "invalid") == [2, 3, 4, 5, 6, 7]
    assert {rec["id"]: rec["output"] for rec in lines if rec["outcome"] == "completed"} == {"ok": 1, "ok2": 4}


# Any character, surrogates and controls included, with the awkward ones drawn often.
_any_text = st.lists(  # (``st.text`` never draws a surrogate)
    st.sampled_from("a/%\x00\n\x85\u2028\ud800\udc80é日") | st.characters(exclude_categories=[]), max_size=12
).map("".join)
_job_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _any_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_any_text, inner, max_size=3),
    max_leaves=8,
)
_job = st.fixed_dictionaries(
    {},
    optional={
        "id": _job_value,
        "input": _job_value,
        "agent": st.sampled_from([E + "echo", "no colon"]) | _any_text,
        "timeout": _job_value,
        "session": _job_value,
    },
)
_extra = st.dictionaries(_any_text, _job_value, max_size=2)  # unknown keys too
_line = st.binary(max_size=40) | st.tuples(_job, _extra).map(lambda t: json.dumps({**t[1], **t[0]}).encode())


@settings(max_examples=150, deadline=None, database=None)
@given(lines=st.lists(_line, max_size=8))
def test_fuzzed_job_lines_are_each_a_job_or_an_invalid_line(lines: list[bytes]) -> None:
    """BATCH-CHECK under hypothesis: any bytes, any JSON job of any shape: ``load_jobs`` never raises;
    every non-blank line is exactly one valid job or one invalid line; a valid job's input
    encodes, its turn id passes LINK-TURN-ID, and its id and every invalid line's id can be written to
    the results file (so nothing accepted fails later, and nothing refused stops the run)."""
    import tempfile

    from supervisor.lowlevel import check_optional_str

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.jsonl"
        path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n")
        jobs, invalid = supervisor.batch.load_jobs(path, E + "echo")
    numbered = [n for n, line in enumerate(lines, 1) if line.replace(b"\n", b" ").strip()]
    assert sorted([j.line for j in jobs] + [bad.line for bad in invalid]) == numbered
    for job in jobs:
        wire.encode_payload(job.input)
        check_optional_str("turn_id", turn_id_for("b", job.key, 1))
        json.dumps({"id": job.id, "session": job.session}).encode()
        if job.session is not None:
            check_optional_str("session", job.session)
    for bad in invalid:
        msgspec.json.encode({"id": bad.id, "message": bad.message})
