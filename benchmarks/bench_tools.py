"""Isolated tool calls (``worker.isolated``, ``worker.run_command``): what a call in its own process
costs, beside the other ways to run a function or a command, in the same run (samples interleaved,
round-robin, so load on the shared machine falls on every row alike).

* a no-op call: in process, ``worker.isolated`` (cgroups, and forced rlimit fallback),
  ``multiprocessing`` fork (``Process.start`` + ``join``), ``subprocess.run([python, "-c", "pass"])``;
* a command: ``worker.run_command(["true"])`` vs ``subprocess.run(["true"])``;
* from a limit to ``ToolKilled``: a call ignoring SIGINT and SIGTERM with timeout T, grace G and
  kill_after K (overshoot past T + G + K), and a call that writes 2 GiB under ``memory_mb=256``.

Run alone: ``.venv/bin/python -m benchmarks.bench_tools [--quick]``.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import worker
from worker import lowlevel

from ._common import command, log, med, ms, pct, ratio, table


def _noop() -> None:
    return None


def _stubborn() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    while True:
        time.sleep(1)


def _hog() -> int:
    return len(b"\x01" * (2 << 30))


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _bare_fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _mp_fork() -> None:
    p = multiprocessing.get_context("fork").Process(target=_noop)
    p.start()
    p.join()


def _killed_after(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    try:
        fn()
    except worker.ToolKilled:
        return time.perf_counter() - t0
    raise RuntimeError("the call was not killed")


def run(quick: bool) -> str:
    n = 30 if quick else 200
    iso = worker.isolated(_noop)
    iso_rl = worker.isolated(_noop, cgroups=False)
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("in process", _noop),
        ("`worker.isolated` (cgroups)", iso),
        ("`worker.isolated` (rlimit fallback)", iso_rl),
        ("bare `os.fork` + `_exit` + `waitpid` (the floor)", _bare_fork),
        ("`multiprocessing` fork Process", _mp_fork),
        ('`subprocess.run([python, "-c", "pass"])`', lambda: subprocess.run([sys.executable, "-c", "pass"])),
        ('`worker.run_command(["true"])`', lambda: worker.run_command(["true"])),
        ('`subprocess.run(["true"])`', lambda: subprocess.run(["true"], capture_output=True)),
    ]
    samples: dict[str, list[float]] = {name: [] for name, _ in calls}
    for _, fn in calls:
        fn()  # warm: first-use costs (cgroup look-up, imports) out of the figures
    log(f"no-op and command rows, {n} rounds")
    fresh_every = 5  # a fresh interpreter is ~100x slower: sample it every 5th round
    for i in range(n):
        for name, fn in calls:
            if name.startswith("`subprocess.run([python") and i % fresh_every:
                continue
            samples[name].append(_timed(fn))
    rows = []
    base_iso = med(samples["`worker.isolated` (cgroups)"])
    for name, _ in calls:
        s = samples[name]
        rows.append([name, len(s), ms(med(s)), ms(pct(s, 99)), ratio(med(s) / base_iso)])

    log("limit → ToolKilled")
    t, g, k = 0.1, 0.05, 0.05
    m = 5 if quick else 20
    ladder = [
        _killed_after(worker.isolated(_stubborn, timeout=t, grace=g, kill_after=k)) - (t + g + k)
        for _ in range(m)
    ]
    hog = [_killed_after(worker.isolated(_hog, memory_mb=256)) for _ in range(max(3, m // 4))]
    hog_rl = [
        _killed_after(worker.isolated(_hog, memory_mb=256, cgroups=False)) for _ in range(max(3, m // 4))
    ]
    kills = [
        [
            f"timeout ladder to SIGKILL: overshoot past T+G+K ({t}+{g}+{k} s)",
            len(ladder),
            ms(med(ladder)),
            ms(max(ladder)),
        ],
        ["2 GiB written under memory_mb=256 (cgroup): whole call", len(hog), ms(med(hog)), ms(max(hog))],
        [
            "2 GiB under memory_mb=256 (rlimit fallback): whole call",
            len(hog_rl),
            ms(med(hog_rl)),
            ms(max(hog_rl)),
        ],
    ]
    iso_p50 = med(samples["`worker.isolated` (cgroups)"])
    fresh = med(samples['`subprocess.run([python, "-c", "pass"])`'])
    cmd = med(samples['`worker.run_command(["true"])`']) / med(samples['`subprocess.run(["true"])`'])
    backend = lowlevel.tool_limits_backend()
    return (
        "## Isolated tool calls: a call in its own process\n\n"
        f"Targets: isolated no-op p50 ≤ 2 ms and ≤ 1/10 of a fresh interpreter — {ms(iso_p50)}, "
        f'{ratio(fresh / iso_p50)} faster than a fresh interpreter; `run_command(["true"])` ≤ 1.5× '
        f'`subprocess.run(["true"])` — {ratio(cmd)}.\n\n'
        f"Limits here: {backend}. Each isolated call forks the caller (this benchmark's process), joins "
        "its own cgroups, sets its limits and signals, and is reaped with its groups removed before "
        "the call returns; the last column is the median against the isolated call.\n\n"
        + table(["call", "n", "p50", "p99", "vs isolated"], rows)
        + "\n\n"
        + table(["from a limit to `ToolKilled`", "n", "median", "max"], kills)
        + f"\n\nRerun: {command('tools', quick)}\n"
    )


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
