"""Isolated tool calls (``worker.isolated``, ``worker.run_command``): what a call in its own process
costs, beside the other ways to run a function or a command, in the same run (samples interleaved,
round-robin, so load on the shared machine falls on every row alike).

* a no-op call: in process, ``worker.isolated`` forked by this process's warm template (cgroups, and
  forced rlimit fallback) and by this process itself (``fork_caller=True``), ``multiprocessing`` fork
  (``Process.start`` + ``join``), ``subprocess.run([python, "-c", "pass"])``;
* a command: ``worker.run_command(["true"])`` (started by the spawner standing in its kept groups,
  and forking this process) vs
  ``subprocess.run(["true"])``;
* from a limit to ``ToolKilled``: a call ignoring SIGINT and SIGTERM with timeout T, grace G and
  kill_after K (overshoot past T + G + K), and a call that writes 2 GiB under ``memory_mb=256``: the
  whole call, and from the kernel's OOM kill (the last time the call noted, in a shared page, before
  it was killed mid-write) to ``ToolKilled`` in the caller.

Outside a worker calls fork the caller unless templates are turned on: this benchmark turns them on
(``lowlevel.tool_templates(True)``), as they are inside every worker.

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


def _noting_hog(path: str) -> None:
    """Write up to 2 GiB a MiB at a time, noting the time after each MiB in a shared page."""
    import mmap
    import struct

    with open(path, "r+b") as f:
        note = mmap.mmap(f.fileno(), 8)
    chunks = []
    for _ in range(2048):
        chunks.append(b"\x01" * (1 << 20))
        note[:8] = struct.pack("d", time.monotonic())


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


def _oom_to_raise(path: str) -> float:
    """From the kernel's OOM kill (the last note the call made) to ``ToolKilled`` raised here."""
    import struct

    with open(path, "wb") as f:
        f.write(b"\0" * 8)
    try:
        worker.isolated(sys.modules["benchmarks.bench_tools"]._noting_hog, memory_mb=256)(path)
    except worker.ToolKilled:
        raised = time.monotonic()
        with open(path, "rb") as f:
            return raised - float(struct.unpack("d", f.read(8))[0])
    raise RuntimeError("the call was not killed")


def _fork_caller_command() -> Any:
    lowlevel.tool_templates(False)
    try:
        return worker.run_command(["true"])
    finally:
        lowlevel.tool_templates(True)


ISO = "`worker.isolated`, warm template (cgroups)"


def in_worker(turn: Any) -> dict[str, list[float]]:
    """An agent (run in a real worker): the same no-op call forked by the worker's template and by
    the worker itself, and a command, interleaved; the samples in seconds."""
    n = int(turn.input["n"])
    from ._tool_noop import noop

    iso = worker.isolated(noop)
    iso_fork = worker.isolated(noop, fork_caller=True)
    rows: dict[str, Callable[[], Any]] = {
        "template": iso,
        "fork the worker": iso_fork,
        "command, template": lambda: worker.run_command(["true"]),
        "command, subprocess": lambda: subprocess.run(["true"], capture_output=True),
    }
    for fn in rows.values():
        fn()
    out: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(n):
        for name, fn in rows.items():
            out[name].append(_timed(fn))
    return out


def _in_a_worker(n: int) -> dict[str, list[float]]:
    import anyio

    from supervisor import Supervisor

    async def main() -> dict[str, list[float]]:
        async with Supervisor(workers=1, spares=0) as sup:
            result = await sup.run("benchmarks.bench_tools:in_worker", {"n": n})
        if result.outcome != "completed":
            raise RuntimeError(f"the in-worker run failed: {result}")
        return dict(result.output)

    return anyio.run(main)


def run(quick: bool) -> str:
    n = 30 if quick else 200
    lowlevel.tool_templates(True)
    try:
        return _run(quick, n)
    finally:
        lowlevel.tool_templates(None)


def _run(quick: bool, n: int) -> str:
    # By its module's name, not ``__main__`` (run as ``-m benchmarks.bench_tools``): a function of
    # ``__main__`` cannot be found by a template, and would fork this process.
    from benchmarks import bench_tools as here

    from ._tool_noop import noop  # (a module of its own: its template holds what a tool's would)

    iso = worker.isolated(noop)
    iso_rl = worker.isolated(noop, cgroups=False)
    iso_fork = worker.isolated(noop, fork_caller=True)
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("in process", _noop),
        (ISO, iso),
        ("`worker.isolated`, warm template (rlimit fallback)", iso_rl),
        ("`worker.isolated`, forking this process (`fork_caller=True`, cgroups)", iso_fork),
        ("bare `os.fork` + `_exit` + `waitpid` (the floor)", _bare_fork),
        ("`multiprocessing` fork Process", _mp_fork),
        ('`subprocess.run([python, "-c", "pass"])`', lambda: subprocess.run([sys.executable, "-c", "pass"])),
        ('`worker.run_command(["true"])`, warm template', lambda: worker.run_command(["true"])),
        ('`worker.run_command(["true"])`, forking this process', _fork_caller_command),
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
    base_iso = med(samples[ISO])
    for name, _ in calls:
        s = samples[name]
        rows.append([name, len(s), ms(med(s)), ms(pct(s, 99)), ratio(med(s) / base_iso)])

    log("after an idle moment")
    spaced: list[tuple[str, Callable[[], Any]]] = [
        (ISO, iso),
        ("`worker.isolated`, warm template (rlimit fallback)", iso_rl),
        ('`worker.run_command(["true"])`, warm template', lambda: worker.run_command(["true"])),
        ('`subprocess.run(["true"])`', lambda: subprocess.run(["true"], capture_output=True)),
    ]
    idle: dict[str, list[float]] = {name: [] for name, _ in spaced}
    for _ in range(10 if quick else 40):
        for name, fn in spaced:
            time.sleep(0.1)  # allowed: the idle moment under test (no cgroup migration just before)
            idle[name].append(_timed(fn))
    idle_rows = [
        [name + ", 100 ms after the last call", len(v), ms(med(v)), ms(pct(v, 99))]
        for name, v in idle.items()
    ]

    log("in a worker")
    inside = _in_a_worker(n)
    worker_rows = [
        [f"in a worker: {name}", len(v), ms(med(v)), ms(pct(v, 99)), ratio(med(v) / med(inside["template"]))]
        for name, v in inside.items()
    ]

    log("limit → ToolKilled")
    t, g, k = 0.1, 0.05, 0.05
    for _ in range(3):  # this module imported in the template, its embryos forked after: not under 0.1 s
        worker.isolated(here._noop)()  # (the ladder's groups are these: a timeout is not a group's)
    m = 5 if quick else 20
    ladder = [
        _killed_after(worker.isolated(here._stubborn, timeout=t, grace=g, kill_after=k)) - (t + g + k)
        for _ in range(m)
    ]
    hog = [_killed_after(worker.isolated(here._hog, memory_mb=256)) for _ in range(max(3, m // 4))]
    hog_rl = [
        _killed_after(worker.isolated(here._hog, memory_mb=256, cgroups=False)) for _ in range(max(3, m // 4))
    ]
    import tempfile

    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        oom = [here._oom_to_raise(os.path.join(tmp, "note")) for _ in range(max(3, m // 4))]
    kills = [
        [
            f"timeout ladder to SIGKILL: overshoot past T+G+K ({t}+{g}+{k} s)",
            len(ladder),
            ms(med(ladder)),
            ms(max(ladder)),
        ],
        ["2 GiB written under memory_mb=256 (cgroup): whole call", len(hog), ms(med(hog)), ms(max(hog))],
        [
            "2 GiB written under memory_mb=256 (cgroup): from the OOM kill to `ToolKilled`",
            len(oom),
            ms(med(oom)),
            ms(max(oom)),
        ],
        [
            "2 GiB under memory_mb=256 (rlimit fallback): whole call",
            len(hog_rl),
            ms(med(hog_rl)),
            ms(max(hog_rl)),
        ],
    ]
    iso_p50 = med(samples[ISO])
    fresh = med(samples['`subprocess.run([python, "-c", "pass"])`'])
    cmd = med(samples['`worker.run_command(["true"])`, warm template']) / med(
        samples['`subprocess.run(["true"])`']
    )
    backend = lowlevel.tool_limits_backend()
    return (
        "## Isolated tool calls: a call in its own process\n\n"
        f"Targets: isolated no-op p50 ≤ 2 ms and ≤ 1/10 of a fresh interpreter — {ms(iso_p50)}, "
        f'{ratio(fresh / iso_p50)} faster than a fresh interpreter; `run_command(["true"])` ≤ 1.5× '
        f'`subprocess.run(["true"])` — {ratio(cmd)}.\n\n'
        f"Limits here: {backend}. Each isolated call is forked by this process's warm template (or by "
        "this process, where said), joins its own cgroups, sets its limits and signals, and returns once "
        "nothing of it can run again (a function's call whose process ends alone: without waiting for "
        "the kernel to tear that process down; else once its process is reaped, what it left killed); "
        "the last column is the median against the isolated call.\n\n"
        + table(["call", "n", "p50", "p99", "vs isolated"], rows)
        + "\n\nA call after an idle moment (as a model's tool calls come): moving a process into a cgroup "
        "waits for an RCU grace period when no move happened just before (the kernel's "
        "cgroup_threadgroup_rwsem); a kept group's embryo (a function's) or spawner (a command's, which "
        "stays there) has made that move ahead of the call:\n\n"
        + table(["call", "n", "p50", "p99"], idle_rows)
        + "\n\nThe same inside a real worker (its imports, threads and event loop: what a tool call forks "
        "when it forks the worker); the last column against the template's call:\n\n"
        + table(["call", "n", "p50", "p99", "vs template"], worker_rows)
        + "\n\n"
        + table(["from a limit to `ToolKilled`", "n", "median", "max"], kills)
        + f"\n\nRerun: {command('tools', quick)}\n"
    )


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
