"""TOOL-SPAWNER: a command run in kept groups is born there, started by the process that stands in them
(no move into its groups, no fork of the commands template on the call's path). Real templates, cgroups
and commands; the autouse fixture fails a test that leaves any process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import psutil
import pytest

import worker
from worker import lowlevel


@pytest.fixture(autouse=True)
def templates() -> Iterator[None]:
    if lowlevel.tool_limits_backend()["containment"] != "cgroup2":
        pytest.skip("no cgroup v2 containment here: commands are not kept in groups")
    lowlevel.tool_templates(True)
    try:
        yield
    finally:
        lowlevel.tool_templates(None)  # closes the templates (their spawners go with them)


SHOW = "echo $PPID; cat /proc/self/cgroup"
CONNECT = (
    "import os, socket, sys\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2).close(); print('connected')\n"
    "except OSError as exc:\n"
    "    print('refused', os.getppid())\n"
)


def _parent_and_groups(**limits: object) -> tuple[int, str]:
    res = worker.run_command(["sh", "-c", SHOW], **limits)  # type: ignore[arg-type]
    assert res.returncode == 0 and res.killed_reason is None, res
    ppid, groups = res.stdout.decode().split("\n", 1)
    return int(ppid), groups


def _lineage(pid: int) -> list[int]:
    """``pid``'s parent, grandparent, ... up to this process (excluded)."""
    out, me = [], os.getpid()
    proc = psutil.Process(pid)
    while proc.pid != me:
        out.append(proc.pid)
        parent = proc.parent()
        assert parent is not None, f"{pid} is not below this process"
        proc = parent
    return out


def test_a_command_in_kept_groups_is_born_there_by_the_spawner_standing_in_them() -> None:
    """After the first call with these limits (its groups made for it), each command's parent is a
    process that is neither the caller nor the commands template (its parent), that stood in the
    command's very groups before the call, and that outlives the call to start later ones."""
    _parent_and_groups()  # the first call: its groups are made, then kept with a spawner asked for
    seen: dict[int, int] = {}
    for _ in range(3 * lowlevel.TOOL_SPARE_GROUPS):
        started = time.time()
        parent, groups = _parent_and_groups()
        spawner = psutil.Process(parent)
        lineage = _lineage(parent)
        assert len(lineage) == 2, f"the command's parent is not the template's child: {lineage}"
        assert spawner.create_time() < started, "the spawner was made for this call"
        assert Path(f"/proc/{parent}/cgroup").read_text() == groups, "born elsewhere than its groups"
        assert spawner.is_running() and spawner.status() != psutil.STATUS_ZOMBIE
        seen[parent] = seen.get(parent, 0) + 1
    assert len(seen) <= lowlevel.TOOL_SPARE_GROUPS and all(n >= 2 for n in seen.values()), seen


def test_a_kill_of_the_calls_groups_takes_the_spawner_and_the_next_call_gets_another() -> None:
    """The ladder's SIGKILL takes everything in the call's groups, the spawner too (it is not spared
    at the cost of a kill that is not atomic); the next calls get a new one and run as usual."""
    for _ in range(lowlevel.TOOL_SPARE_GROUPS + 1):
        _parent_and_groups()
    stubborn = ["sh", "-c", "trap '' INT TERM; echo $PPID; exec sleep 100"]  # (the ladder's last step)
    killed = worker.run_command(stubborn, timeout=0.3, grace=0.05, kill_after=0.05)
    assert killed.killed_reason == "timeout", killed
    old = int(killed.stdout)
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(old).wait(timeout=10)  # (killed: gone once its template has reaped it)
    parents = {_parent_and_groups()[0] for _ in range(2 * lowlevel.TOOL_SPARE_GROUPS + 1)}
    assert old not in parents
    assert any(len(_lineage(p)) == 2 for p in parents), parents


def test_spawners_of_a_killed_template_are_replaced_by_the_next_calls() -> None:
    """The commands template killed from outside takes its spawners (parent-death signal): the next
    call notices, a new template starts, and the kept groups' commands are born from its spawners."""
    for _ in range(lowlevel.TOOL_SPARE_GROUPS + 1):
        spawner, _ = _parent_and_groups()
    template = psutil.Process(spawner).ppid()
    assert template != os.getpid()
    os.kill(template, signal.SIGKILL)
    psutil.Process(template).wait(timeout=10)  # (our child: reaped here)
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(spawner).wait(timeout=10)
    for _ in range(2 * lowlevel.TOOL_SPARE_GROUPS + 1):
        parent, _ = _parent_and_groups()
        lineage = _lineage(parent)
        assert len(lineage) == 2 and template not in lineage and parent != spawner, lineage


def test_a_spawner_killed_after_starting_a_command_ends_the_call_and_never_starts_it_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spawner killed from outside between starting a command and answering for it: the call ends
    as ``ToolCrashed(signal=9)`` with the command stopped, as a call whose template died mid-call, and
    the command is not started a second time (by the caller or another spawner)."""
    marks = tmp_path / "marks"
    argv = ["sh", "-c", f"echo started >> {marks}; sleep 0.5"]
    for _ in range(lowlevel.TOOL_SPARE_GROUPS + 1):  # every kept set has its spawner standing
        _parent_and_groups()
    real_start = lowlevel.ToolSpawner.start
    started: list[int] = []

    def start_then_killed(
        self: lowlevel.ToolSpawner, req: dict[str, object], fds: list[int]
    ) -> tuple[int, int]:
        pid, pidfd = real_start(self, req, fds)  # the command runs in the groups...
        started.append(pid)
        os.close(pidfd)
        deadline = time.monotonic() + 10
        # (the command has begun, its line written: what a second start would repeat; the file
        # exists from the shell's open, before the line is in it)
        while not (marks.exists() and marks.read_text()):
            assert time.monotonic() < deadline, "the command never began"
            time.sleep(0.005)  # allowed: bounded poll of a file written by another process
        assert self.pid is not None
        os.kill(self.pid, signal.SIGKILL)  # ...and its spawner dies before its answer is read
        raise lowlevel.ToolSpawnerDied("the command's spawner died")

    monkeypatch.setattr(lowlevel.ToolSpawner, "start", start_then_killed)
    with pytest.raises(worker.ToolCrashed) as err:
        worker.run_command(argv)
    monkeypatch.undo()
    assert err.value.signal == signal.SIGKILL, err.value
    assert len(started) == 1, started
    with contextlib.suppress(psutil.NoSuchProcess):  # stopped with its groups (reaped by the template)
        assert psutil.Process(started[0]).status() == psutil.STATUS_ZOMBIE
    assert marks.read_text() == "started\n", marks.read_text()  # begun once, never started again
    res = worker.run_command(["true"])  # and the next call gets a new spawner
    assert res.returncode == 0, res


def test_a_commands_exit_status_is_its_own_even_when_its_spawner_dies_before_reaping_it() -> None:
    """The status of a command comes from the kernel (its pidfd), not from a message of its spawner: a
    command that kills its spawner once it has been handed over (stdin is written only then), and then
    exits with 3, is reported with 3, and the next call gets a new spawner."""
    if not lowlevel.TOOL_STATUS_FROM_PIDFD:
        pytest.skip("before Linux 6.15 a pidfd keeps no exit status: the spawner reports it")
    for _ in range(lowlevel.TOOL_SPARE_GROUPS + 1):  # every kept set has its spawner standing
        _parent_and_groups()
    parricide = ["sh", "-c", "read go; kill -9 $PPID; exit 3"]
    for _ in range(lowlevel.TOOL_SPARE_GROUPS + 1):
        res = worker.run_command(parricide, stdin=b"go\n")
        assert res.returncode == 3 and res.killed_reason is None, res
        parent, _ = _parent_and_groups()
        assert len(_lineage(parent)) == 2, "the next command was not born from a (new) spawner"


def test_the_spawner_does_not_count_in_the_calls_pids_limit() -> None:
    """``pids=N`` lets a command's tree have N processes, and not N + 1, through the spawner as
    without it (the spawner's own pid is added to its groups' limit)."""
    three = ["sh", "-c", "sleep 0.2 & sleep 0.2 & wait"]  # sh and two children
    for _ in range(2 * lowlevel.TOOL_SPARE_GROUPS + 1):
        res = worker.run_command(three, pids=3)
        assert res.returncode == 0 and res.killed_reason is None, res
    four = ["sh", "-c", "sleep 0.2 & sleep 0.2 & sleep 0.2 & wait"]
    for _ in range(2 * lowlevel.TOOL_SPARE_GROUPS + 1):
        res = worker.run_command(four, pids=3)
        assert res.returncode != 0 and b"fork" in res.stderr, res


def _v1_memory_dir(cgroup_text: str) -> Path | None:
    """The v1 memory group named in a ``/proc/<pid>/cgroup`` text, under this machine's mount."""
    mount = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        parts = post.split()
        if len(parts) >= 3 and parts[0] == "cgroup" and "memory" in parts[2].split(","):
            mount = pre.split(" ")[4]
    for line in cgroup_text.splitlines():
        _, names, path = line.split(":", 2)
        if mount is not None and "memory" in names.split(","):
            return Path(mount) / path.lstrip("/")
    return None


def test_the_spawners_own_memory_is_added_to_the_calls_memory_limit() -> None:
    """The pages the spawner wrote after its move are charged to the call's memory group (v1: where first
    touched): the group's limit is the call's ``memory_mb`` plus what the spawner held when it was ready
    (a fraction of a MiB), so the call's own budget stays what it asked for."""
    _parent_and_groups(memory_mb=64)
    parent, groups = _parent_and_groups(memory_mb=64)
    where = _v1_memory_dir(groups)
    if where is None or lowlevel.tool_limits_backend()["memory"] != "cgroup1":
        pytest.skip("no v1 memory group here")
    limit = int((where / "memory.limit_in_bytes").read_text())
    assert 64 << 20 < limit < (64 << 20) + (4 << 20), limit
    assert len(_lineage(parent)) == 2


def test_a_command_through_the_spawner_keeps_every_call_option(tmp_path: Path) -> None:
    """Through the spawner as through the template: scrubbed environment, added variables, stdin,
    directory, output cap, a command that cannot start, and a command that needs a fork (no network)."""
    os.environ["OPENAI_API_KEY"] = "sk-secret"
    try:
        for _ in range(lowlevel.TOOL_SPARE_GROUPS + 1):
            env = worker.run_command(["env"], env={"EXTRA": "1"}).stdout.decode()
            assert "OPENAI_API_KEY" not in env and "EXTRA=1" in env
            assert worker.run_command(["cat"], stdin=b"fed").stdout == b"fed"
            assert worker.run_command(["pwd"], cwd=str(tmp_path)).stdout.decode().strip() == str(tmp_path)
            with pytest.raises(FileNotFoundError):
                worker.run_command(["/no/such/command"])
            flood = worker.run_command(["yes"], output_mb=1)
            assert flood.killed_reason == "output" and len(flood.stdout) == 1024 * 1024
        with socket.socket() as listener:  # a command that needs a fork (its own network namespace)
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            port = str(listener.getsockname()[1])
            for _ in range(lowlevel.TOOL_SPARE_GROUPS + 1):
                res = worker.run_command([sys.executable, "-c", CONNECT, port], network=False)
                assert res.returncode == 0 and res.stdout.startswith(b"refused"), res
                assert len(_lineage(int(res.stdout.split()[-1]))) == 2, "not forked by a spawner"
    finally:
        del os.environ["OPENAI_API_KEY"]


@pytest.mark.anyio
async def test_in_a_worker_the_spawners_serve_every_turn_and_are_not_leftovers() -> None:
    """Inside a worker a command's spawner is the commands template's child (not the worker's): the
    end-of-turn sweep leaves it, and the next turn's commands are born from the same spawners."""
    from supervisor import Supervisor

    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(60):
            first = await sup.run("tests.agents.tools:command_parents", {})
            second = await sup.run("tests.agents.tools:command_parents", {})
    assert first.outcome == second.outcome == "completed", (first, second)
    me = first.output["worker"]
    spawners = {p for p, grand in first.output["parents"][1:] if grand != me}
    assert spawners, f"no command of the first turn was born from a spawner: {first.output}"
    assert spawners & {p for p, _ in second.output["parents"]}, (first.output, second.output)
