"""A batch killed outright (SIGKILL of the batch process, mid-run) and resumed still runs each job
once: result lines are written whole (several per ``write(2)`` since BATCH-LINES; only a write the
kernel cut at the SIGKILL can leave a torn last line, which ``--resume`` truncates) and a job with a
whole final line never runs again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from supervisor.cli.main import entry; entry()", "batch"]
AGENT = "tests.agents.speed:note_run"


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _lines(path: Path, *, torn_ok: bool = False) -> list[dict[str, Any]]:
    """The whole result lines of ``path``. Only right after a SIGKILL may the last one be torn
    (``torn_ok``): Linux stops a write to a regular file between pages when its writer gets a fatal
    signal, so a batch of lines that crossed a page boundary can be cut (seen once in CI); it is
    left out here, as ``--resume`` truncates it."""
    data = path.read_bytes() if path.exists() else b""
    if torn_ok:
        data = data[: data.rfind(b"\n") + 1]
    assert not data or data.endswith(b"\n"), "the last result line is torn"
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def test_sigkilled_batch_resumed_runs_each_finished_job_once(tmp_path: Path) -> None:
    """SIGKILL the batch process while results stream in: whole lines, but for a last one the kernel
    cut (``_lines``), which ``--resume`` truncates; it runs exactly the jobs without a whole final
    line - never one whose line was written whole - and leaves the file whole, so every job ends
    with one final ``completed`` line, and only the few that were in flight at the kill can have
    run to completion twice (their line had not been written: the batch promises at least once
    for those, and at most one final line for every job)."""
    n = 3000
    runs = tmp_path / "runs.log"
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        "".join(
            json.dumps({"id": f"j{i}", "input": {"id": f"j{i}", "log": str(runs)}}) + "\n" for i in range(n)
        )
    )
    out = tmp_path / "out.jsonl"
    args = [*CLI, str(jobs), "-o", str(out), "--agent", AGENT, "--workers", "2", "--concurrency", "64"]
    with open(tmp_path / "err.txt", "wb") as err:
        runner = subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 120
        while _count_lines(out) < n // 3:
            assert runner.poll() is None, (tmp_path / "err.txt").read_text()
            assert time.monotonic() < deadline, "no result lines within 120 s"
            time.sleep(0.005)  # allowed: bounded poll of a file another process writes
        runner.send_signal(signal.SIGKILL)
        assert runner.wait(timeout=60) == -signal.SIGKILL
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    first = _lines(out, torn_ok=True)
    assert n // 3 <= len(first) < n, "the batch finished before the kill"
    done_before = {rec["id"] for rec in first if rec["final"]}
    assert len(done_before) == len(first)  # a killed runner records nothing as interrupted

    proc = subprocess.run(
        [*args, "--resume"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    lines = _lines(out)
    finals = Counter(rec["id"] for rec in lines if rec["final"])
    assert sorted(finals) == sorted(f"j{i}" for i in range(n))
    assert set(finals.values()) == {1}, "a job has two final lines"
    assert all(rec["outcome"] == "completed" for rec in lines)
    assert not {rec["id"] for rec in lines[len(first) :]} & done_before, "a finished job ran again"
    ran = Counter(runs.read_text().split())
    assert set(ran) == set(finals)
    twice = {job for job, count in ran.items() if count > 1}
    assert not twice & done_before, "a job whose line was written ran again"
    assert all(count <= 2 for count in ran.values())
    assert len(twice) <= 64 + 2 * 64, twice  # at most what was in flight (window + prefetch) at the kill
