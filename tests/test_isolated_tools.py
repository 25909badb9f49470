"""worker.isolated / worker.run_command: each tool call in its own process, with its own limits and
ladder. Real processes throughout; every test checks that nothing of a call outlives it (besides the
autouse no-leftover fixture, which fails a test whose descendants or adopted orphans survive).

Waits are bounded: a call's own pid file is awaited with ``_wait_for`` (bounded by ``anyio.fail_after``,
stepping with ``anyio.sleep`` only to re-read the file), never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

import worker
from worker import lowlevel, proctree
from worker.agent import (
    AgentLoop,
    Cancelled,
    Finish,
    FunctionCallOutput,
    Response,
    ScriptedModel,
    TextDelta,
    tool,
)
from worker.agent import ToolCall as ModelToolCall

pytestmark = pytest.mark.anyio

BIG = 2 << 30  # 2 GiB


@pytest.fixture(params=["caller", "template"])
def made_by(request: pytest.FixtureRequest) -> Iterator[str]:
    """Who forks the call: the caller itself (outside a worker, by default) or this process's warm
    template (as inside a worker). Every limit and stop must hold either way."""
    lowlevel.tool_templates(request.param == "template")
    try:
        yield request.param
    finally:
        lowlevel.tool_templates(None)  # closes the templates: nothing outlives the test


both = pytest.mark.usefixtures("made_by")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _pid_of(path: Path) -> int:
    return int(path.read_text())


async def _wait_for(*paths: Path, bound: float = 20.0) -> None:
    with anyio.fail_after(bound):
        while True:
            if all(p.exists() and p.read_text().strip() for p in paths):
                return
            await anyio.sleep(0.01)  # allowed: re-reads files other processes write; bounded above


# ---- tools under test (module level: plain functions, forked with the caller) ------------------


def hog() -> int:
    return len(b"\x01" * BIG)  # written, not just reserved


def spin() -> None:
    while True:
        pass


def stubborn(pidfile: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    Path(pidfile).write_text(str(os.getpid()))
    while True:
        time.sleep(1)  # allowed: the tool under test blocks for good


def cooperative(pidfile: str) -> str:
    Path(pidfile).write_text(str(os.getpid()))
    try:
        while not worker.current_call_cancelled():
            time.sleep(0.01)  # allowed: the tool's own work between its cancellation checks
    except KeyboardInterrupt:
        pass
    return "stopped early"


def c_sleep(pidfile: str) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])  # the cooperative step cannot reach it
    Path(pidfile).write_text(str(os.getpid()))
    ctypes.CDLL("libc.so.6").sleep(1000)  # allowed: the tool under test blocks in C until it is killed


def fork_bomb(pidfile: str) -> None:
    Path(pidfile).write_text(str(os.getpid()))
    while True:
        with contextlib.suppress(OSError):
            os.fork()


def flood() -> None:
    chunk = b"x" * 65536
    while True:
        os.write(1, chunk)


def daemonise(pidfile: str) -> str:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            Path(pidfile + ".tmp").write_text(str(os.getpid()))
            os.replace(pidfile + ".tmp", pidfile)  # whole or not there: the call returns once it is
            while True:
                time.sleep(1)  # allowed: the daemon the tool leaves behind idles for good
        os._exit(0)
    deadline = time.monotonic() + 10
    while not Path(pidfile).exists() and time.monotonic() < deadline:
        time.sleep(0.005)  # allowed: bounded poll inside the call for the daemon's pid file
    return "daemon started"


def add(a: int, b: int) -> int:
    return a + b


# ---- limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cgroups", [None, False], ids=["cgroups", "rlimit-fallback"])
@both
def test_a_2gib_allocation_under_256mib_is_killed_for_memory_and_the_next_call_runs(
    cgroups: bool | None,
) -> None:
    with pytest.raises(worker.ToolKilled) as info:
        worker.isolated(hog, memory_mb=256, cgroups=cgroups)()
    assert info.value.reason == "memory" and info.value.limit == 256
    assert str(info.value) == "tool killed: memory limit 256 MiB reached"
    assert isinstance(info.value, worker.ToolIsolationError)
    assert worker.isolated(add, cgroups=cgroups)(2, 3) == 5


@both
def test_a_spinning_call_is_stopped_at_its_timeout() -> None:
    t0 = time.monotonic()
    with pytest.raises(worker.ToolKilled) as info:
        worker.isolated(spin, timeout=0.5)()
    assert info.value.reason == "timeout" and info.value.limit == 0.5
    assert info.value.signal is None  # the cooperative step (KeyboardInterrupt in the call) was enough
    assert time.monotonic() - t0 < 0.5 + 5.0
    assert worker.isolated(add)(1, 1) == 2


@both
def test_a_call_ignoring_sigint_and_sigterm_is_killed_by_the_last_step(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    with pytest.raises(worker.ToolKilled) as info:
        worker.isolated(stubborn, timeout=0.3, grace=0.2, kill_after=0.3)(str(pidfile))
    took = time.monotonic() - t0
    assert info.value.reason == "timeout" and info.value.signal == signal.SIGKILL
    assert took >= 0.3 + 0.2 + 0.3 - 0.05
    assert _gone(_pid_of(pidfile))


@pytest.mark.parametrize("cgroups", [None, False], ids=["cgroups", "rlimit-fallback"])
@both
def test_cpu_seconds_are_a_limit(cgroups: bool | None) -> None:
    with pytest.raises(worker.ToolKilled) as info:
        worker.isolated(spin, cpu_s=0.3, timeout=20, cgroups=cgroups)()
    assert info.value.reason == "cpu"


@both
def test_a_fork_bomb_is_stopped_at_its_pids_limit_with_nothing_left(tmp_path: Path) -> None:
    if lowlevel.tool_limits_backend()["pids"] == "rlimit":
        pytest.skip("no pids controller here: the fallback cannot bound root's processes (docs/tools.md)")
    pidfile = tmp_path / "pid"
    with pytest.raises(worker.ToolKilled) as info:
        worker.isolated(fork_bomb, pids=32, timeout=20)(str(pidfile))
    assert info.value.reason == "pids" and info.value.limit == 32
    assert _gone(_pid_of(pidfile))
    assert worker.isolated(add)(2, 2) == 4


@both
def test_a_stdout_flood_is_stopped_at_output_mb(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(worker.ToolKilled) as info:
        worker.isolated(flood, output_mb=1, timeout=20)()
    assert info.value.reason == "output" and info.value.limit == 1
    out, _ = capfd.readouterr()
    assert len(out) <= 1024 * 1024  # relayed up to the cap, not past it


@both
def test_a_setsid_double_forked_daemon_ends_with_its_call(tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon"
    assert worker.isolated(daemonise)(str(pidfile)) == "daemon started"
    assert _gone(_pid_of(pidfile))


@pytest.mark.parametrize("cgroups", [None, False], ids=["cgroups", "rlimit-fallback"])
def test_a_daemon_left_by_a_killed_call_is_killed_too(tmp_path: Path, cgroups: bool | None) -> None:
    pidfile = tmp_path / "daemon"

    def daemon_then_spin(path: str) -> None:
        daemonise(path)
        spin()

    with pytest.raises(worker.ToolKilled):
        worker.isolated(daemon_then_spin, timeout=0.5, cgroups=cgroups)(str(pidfile))
    assert _gone(_pid_of(pidfile))


# ---- crossing, errors, env, network ----------------------------------------------------------


@both
def test_a_call_made_from_a_thread_has_its_ladder_too() -> None:
    """The call forks from whatever thread calls it; the child's signals still work (its main thread)."""
    from concurrent.futures import ThreadPoolExecutor

    def call() -> str:
        try:
            worker.isolated(spin, timeout=0.3)()
        except worker.ToolKilled as exc:
            return f"{exc.reason} {exc.signal}"
        return "not stopped"

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda _: call(), range(2))) == ["timeout None", "timeout None"]


@both
def test_arguments_that_cannot_cross_are_refused_at_the_call_naming_which() -> None:
    with pytest.raises(TypeError, match=r"argument 'b' of add\(\)"):
        worker.isolated(add)(1, b=object())
    with pytest.raises(TypeError, match=r"argument 0 of add\(\)"):
        worker.isolated(add)(len, 3)


def bad() -> None:
    raise ValueError("no such file")


def exit3() -> None:
    os._exit(3)


def segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


@both
def test_the_calls_own_exception_comes_back_and_a_dead_call_is_a_crash() -> None:
    with pytest.raises(ValueError, match="no such file"):
        worker.isolated(bad)()
    with pytest.raises(worker.ToolCrashed) as info:
        worker.isolated(exit3)()
    assert info.value.exit_code == 3
    with pytest.raises(worker.ToolCrashed) as info:
        worker.isolated(segfault)()
    assert info.value.signal == signal.SIGSEGV
    with pytest.raises(worker.ToolCrashed) as info:
        worker.isolated(lambda: os._exit(4))()  # a lambda: the caller forks, whoever else could
    assert info.value.exit_code == 4


def look() -> list[Any]:
    with open("/proc/self/environ", "rb") as f:
        raw = f.read()
    return [
        os.environ.get("OPENAI_API_KEY"),
        b"sk-hidden" in raw,
        os.environ.get("TOOL_TOKEN"),
        "PATH" in os.environ,
    ]


@both
def test_env_none_hides_the_callers_keys_and_env_adds_exactly_what_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-hidden-from-tools")
    assert worker.isolated(look)() == [None, False, None, True]
    assert worker.isolated(look, env={"TOOL_TOKEN": "t"})() == [None, False, "t", True]
    res = worker.run_command(["env"])
    assert b"OPENAI_API_KEY" not in res.stdout and b"PATH=" in res.stdout
    assert b"sk-hidden" not in worker.run_command(["cat", "/proc/self/environ"]).stdout


def connect(port: int) -> str:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return "connected"
    except OSError as exc:
        return f"refused: {exc}"


@both
def test_network_false_cannot_reach_a_loopback_listener() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert worker.isolated(connect)(port) == "connected"  # the control: the listener is reachable
        got = worker.isolated(connect, network=False)(port)
        cmd = worker.run_command([sys.executable, "-c", CONNECT, str(port)], network=False)
    assert got.startswith("refused"), got
    assert cmd.returncode == 0 and cmd.stdout.startswith(b"refused"), cmd


CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2).close(); print('connected')\n"
    "except OSError as exc:\n"
    "    print('refused', exc)\n"
)


# ---- run_command -----------------------------------------------------------------------------


def test_run_command_and_arun_command_take_the_same_parameters() -> None:
    """One declaration of the options: both show it (names, kinds, defaults, annotations) and
    refuse the same bad argument the same way; ``arun_command`` is a coroutine function."""
    sync, async_ = inspect.signature(worker.run_command), inspect.signature(worker.arun_command)
    assert list(sync.parameters.values()) == list(async_.parameters.values())
    assert sync.parameters["timeout"].default == 30.0 and sync.return_annotation == "CommandResult"
    assert inspect.iscoroutinefunction(worker.arun_command)
    with pytest.raises(TypeError, match="no shell"):
        worker.run_command("ls -l")
    with pytest.raises(TypeError, match="no shell"):
        anyio.run(worker.arun_command, "ls -l")


@both
def test_run_command_captures_and_bounds_and_leaves_nothing(tmp_path: Path) -> None:
    res = worker.run_command(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (res.returncode, res.stdout, res.stderr, res.truncated, res.killed_reason) == (
        3,
        b"out\n",
        b"err\n",
        False,
        None,
    )
    assert worker.run_command(["cat"], stdin=b"fed").stdout == b"fed"
    assert worker.run_command(["pwd"], cwd=str(tmp_path)).stdout.decode().strip() == str(tmp_path)
    flood_res = worker.run_command(["yes"], output_mb=1)
    assert (
        flood_res.truncated and flood_res.killed_reason == "output" and len(flood_res.stdout) == 1024 * 1024
    )
    t0 = time.monotonic()
    slow = worker.run_command(
        ["sh", "-c", "trap '' INT TERM; sleep 100 & echo $! > bg; wait"],
        timeout=0.3,
        grace=0.1,
        kill_after=0.2,
        cwd=str(tmp_path),
    )
    assert slow.killed_reason == "timeout" and slow.returncode == -signal.SIGKILL
    assert time.monotonic() - t0 < 5
    assert _gone(int((tmp_path / "bg").read_text()))
    t0 = time.monotonic()
    left = worker.run_command(["sh", "-c", "sleep 100 & echo $! > bg2"], timeout=30, cwd=str(tmp_path))
    assert left.returncode == 0 and left.killed_reason is None
    assert time.monotonic() - t0 < 10  # the background child holding the pipes is killed, not waited for
    assert _gone(int((tmp_path / "bg2").read_text()))
    with pytest.raises(FileNotFoundError):
        worker.run_command(["/no/such/command"])
    with pytest.raises(TypeError):
        worker.run_command("ls -l")  # type: ignore[arg-type]


# ---- in the agent loop -----------------------------------------------------------------------


class FakeConn:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, turn_id: str, event: Any) -> None:
        self.events.append(event)


def _calls(*pairs: tuple[str, str, dict[str, Any]]) -> Response:
    return Response([*(ModelToolCall(c, n, a) for c, n, a in pairs), Finish("tool_calls")])


@both
async def test_the_model_is_told_of_a_memory_kill_and_the_turn_completes() -> None:
    conn = FakeConn()
    turn = worker.Turn("t1", None, None, None, conn)  # type: ignore[arg-type]
    hog_tool = tool(worker.isolated(hog, memory_mb=256), name="hog")
    model = ScriptedModel([_calls(("c1", "hog", {})), Response([TextDelta("sorry"), Finish("stop")])])
    loop = AgentLoop(model, tools=[hog_tool], turn=turn)
    with anyio.fail_after(30):
        await loop.run("allocate")
    error = {"error": "tool killed: memory limit 256 MiB reached"}
    assert FunctionCallOutput("c1", "hog", error) in loop.history
    assert {
        "type": "tool_call_update",
        "id": "c1",
        "call_id": "c1",
        "name": "hog",
        "status": "failed",
        "reason": "memory",
        "text": error["error"],
    } in conn.events
    assert conn.events[-1] == {"type": "delta", "text": "sorry"}


async def test_max_tool_errors_still_bounds_a_turn_whose_tools_keep_getting_killed() -> None:
    spin_tool = tool(worker.isolated(spin, timeout=0.2), name="spin")
    model = ScriptedModel(
        [_calls(("c1", "spin", {})), _calls(("c2", "spin", {})), Response([Finish("stop")])]
    )
    loop = AgentLoop(model, tools=[spin_tool], max_tool_errors=1)
    with anyio.fail_after(30), pytest.raises(Exception, match=r"timeout of 0\.2 s"):
        await loop.run("spin")
    assert (
        FunctionCallOutput("c1", "spin", {"error": "tool killed: timeout of 0.2 s reached"}) in loop.history
    )


@both
async def test_cancelling_a_turn_stops_three_isolated_calls_within_grace_and_kill_after(
    tmp_path: Path,
) -> None:
    grace, kill_after = 0.5, 0.5
    files = {name: tmp_path / name for name in ("coop", "stubborn", "csleep")}
    opts = {"grace": grace, "kill_after": kill_after, "timeout": 60}
    tools = [
        tool(worker.isolated(cooperative, **opts), name="coop"),
        tool(worker.isolated(stubborn, **opts), name="stubborn"),
        tool(worker.isolated(c_sleep, **opts), name="csleep"),
    ]
    model = ScriptedModel(
        [_calls(*((n, n, {"pidfile": str(p)}) for n, p in files.items())), Response([Finish()])]
    )
    conn = FakeConn()
    turn = worker.Turn("t1", None, None, None, conn)  # type: ignore[arg-type]
    loop = AgentLoop(model, tools=tools, turn=turn)
    scope = anyio.CancelScope()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:

            async def cancel_when_running() -> None:
                await _wait_for(*files.values())
                stamp.append(time.monotonic())
                scope.cancel()

            stamp: list[float] = []
            tg.start_soon(cancel_when_running)
            with scope, pytest.raises(Cancelled):
                await loop.run("go")
    took = time.monotonic() - stamp[0]
    assert took < grace + kill_after + 1.0, took  # slack for a loaded 2-core machine
    for path in files.values():
        assert _gone(_pid_of(path)), path
    stopped = {e["id"]: e["reason"] for e in conn.events if e.get("type") == "tool_call_update"}
    assert stopped == {"coop": "cancelled", "stubborn": "cancelled", "csleep": "cancelled"}


@both
async def test_async_isolated_function_and_cancel_outside_any_loop() -> None:
    async def slow(x: int) -> int:
        await anyio.sleep(0.05)  # allowed: the call's own work, in its own process
        return x * 2

    assert await worker.isolated(slow)(21) == 42
    t0 = time.monotonic()
    with anyio.move_on_after(0.3) as scope:
        await worker.isolated(spin, grace=0.2, kill_after=0.2).acall()  # a sync tool, awaited
    assert scope.cancelled_caught and time.monotonic() - t0 < 0.3 + 0.2 + 0.2 + 2.0


# ---- in a real worker, under the supervisor --------------------------------------------------


async def test_in_a_worker_a_killed_tool_is_told_to_the_model_and_a_cancel_stops_three_calls(
    tmp_path: Path,
) -> None:
    """Through the pool: the memory kill is told to the model and the turn completes; then, on the
    same worker, a turn cancelled while three isolated calls run (cooperative, SIGTERM-ignoring, C
    sleep) ends ``aborted`` within grace + kill_after, every call's process gone; a next turn runs."""
    from supervisor import Supervisor

    grace, kill_after = 3.0, 2.0
    async with Supervisor(workers=1, spares=0, grace=grace, kill_after=kill_after) as sup:
        h1 = await sup.submit("tests.agents.tools:memory", {})
        with anyio.fail_after(60):
            first = await h1.result()
            events = [e async for e in h1.events()]
        assert first.outcome == "completed", first
        failed = [e for e in events if e.get("type") == "tool_call_update"]
        assert failed and failed[0]["status"] == "failed" and failed[0]["reason"] == "memory", events
        assert first.output["text"] == "it was too big"
        assert any("tool killed: memory limit 256 MiB reached" in m for m in first.output["history"])

        handle = await sup.submit("tests.agents.tools:three", {"dir": str(tmp_path)})
        files = [tmp_path / n for n in ("coop", "stubborn", "csleep")]
        await _wait_for(*files, bound=60)
        t0 = time.monotonic()
        await handle.cancel()
        with anyio.fail_after(60):
            result = await handle.result()
        took = time.monotonic() - t0
        assert result.outcome == "aborted", result  # the calls' ladders fit inside the turn's grace
        assert took < grace + kill_after, took
        for path in files:
            assert _gone(_pid_of(path)), path
        with anyio.fail_after(60):
            again = await sup.run("tests.agents.tools:memory", {})
        assert again.outcome == "completed" and again.worker_pid == first.worker_pid


async def test_status_says_what_enforces_tool_limits() -> None:
    """``status()`` names, per limit, what enforces it here, so an operator sees the fallback."""
    from supervisor import Supervisor

    async with Supervisor(workers=1, spares=0) as sup:
        got = (await sup.status())["tool_limits"]
    assert got == lowlevel.tool_limits_backend()
    assert set(got) == {"containment", "memory", "pids", "cpu"}
    assert all(v in ("cgroup2", "cgroup1", "rlimit", "tree") for v in got.values())


async def test_the_turns_abort_reaches_a_sync_call_in_a_sync_agent_first(tmp_path: Path) -> None:
    """A ``def`` agent blocked in an isolated call that ignores SIGTERM: the abort runs the call's
    ladder at once (not only the worker's, after the grace), so the turn ends ``aborted``."""
    from supervisor import Supervisor

    grace = 4.0
    async with Supervisor(workers=1, spares=0, grace=grace, kill_after=2.0) as sup:
        handle = await sup.submit("tests.agents.tools:sync_stubborn", {"dir": str(tmp_path)})
        await _wait_for(tmp_path / "stubborn", bound=60)
        await handle.cancel()
        with anyio.fail_after(60):
            result = await handle.result()
    assert result.outcome == "aborted", result
    assert _gone(_pid_of(tmp_path / "stubborn"))


def test_call_groups_left_by_a_killed_caller_are_swept() -> None:
    """A caller killed with SIGKILL leaves its calls' v1 groups behind (its v2 group goes with its
    worker's cgroup): they are removed at the next first use, owners matched by pid and start time."""
    import subprocess

    if lowlevel.tool_limits_backend()["pids"] != "cgroup1":
        pytest.skip("no cgroup v1 controller here")
    # allowed: the call kills its caller, then idles until the kernel ends it with its parent
    code = (
        "import os, worker\n"
        "from worker import lowlevel\n"
        "worker.isolated(lambda: os.kill(os.getppid(), 9) or __import__('time').sleep(60), timeout=120)()\n"
    )
    before = {p.pid for p in psutil.Process().children()}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc
    # The call dies of its parent-death signal; we are a subreaper: reap it, as a worker would.
    for orphan in psutil.Process().children():
        if orphan.pid not in before:
            orphan.wait(timeout=20)
    left_before = _v1_call_groups()
    assert left_before, "the killed caller left no group: nothing to sweep"
    swept = lowlevel.tool_groups_sweep()
    assert set(left_before) <= set(swept)
    assert not (set(_v1_call_groups()) & set(left_before))


def _v1_call_groups() -> list[str]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.startswith("cgroup ") and ",pids" in post:
            base = pre.split(" ")[4]
            own = next(
                (
                    ln.split(":", 2)[2]
                    for ln in Path("/proc/self/cgroup").read_text().splitlines()
                    if ":pids:" in ln
                ),
                "/",
            )
            folder = os.path.join(base, own.lstrip("/"))
            for name in os.listdir(folder):
                if name.startswith("turnpool-") and "-call" in name:
                    pid = int(name.split("-")[1])
                    if not psutil.pid_exists(pid):
                        found.append(os.path.join(folder, name))
    return found


@worker.isolated
def bare_form(x: int) -> int:
    return x + 1


@worker.isolated(timeout=5, memory_mb=128)
def called_form(x: int) -> list[int]:
    return [x, os.getpid()]


class Calculator:
    @worker.isolated(timeout=5)
    def double(self, x: int) -> int:
        return 2 * x


@both
def test_the_decorator_forms_and_methods() -> None:
    assert bare_form(1) == 2
    x, pid = called_form(7)
    assert x == 7 and pid != os.getpid()  # another process did it
    assert Calculator().double(21) == 42
    with pytest.raises(ValueError, match="memory_mb"):
        worker.isolated(add, memory_mb=-1)
    with pytest.raises(TypeError, match="env"):
        worker.isolated(add, env={"A": 1})  # type: ignore[dict-item]


# ---- the warm template (TOOL-WARM) ---------------------------------------------------------------


def parent() -> int:
    return os.getppid()


class Asker:
    @worker.isolated
    def parent(self) -> int:
        return os.getppid()


def test_calls_are_forked_by_a_warm_template_and_what_it_cannot_find_by_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module-level function is found by name in the template, which forks the call; a lambda, a
    method, ``fork_caller=True`` and a module that starts a thread when imported fork the caller. A
    module imported after the template started is imported there on first use; a template that died
    is replaced by the next call; commands have a template of their own."""
    lowlevel.tool_templates(True)
    try:
        me = os.getpid()
        tpl = worker.isolated(parent)()
        assert tpl != me and worker.isolated(parent)() == tpl
        assert worker.isolated(lambda: os.getppid())() == me
        assert worker.isolated(parent, fork_caller=True)() == me
        assert Asker().parent() == me
        cmd_parent = int(worker.run_command(["sh", "-c", "echo $PPID"]).stdout)
        assert cmd_parent not in (me, tpl)

        (tmp_path / "late_tools_t29.py").write_text("import os\n\ndef parent():\n    return os.getppid()\n")
        (tmp_path / "threaded_tools_t29.py").write_text(
            "import os, threading\n"
            "done = threading.Event()\n"
            "threading.Thread(target=done.wait, args=(30,), daemon=True).start()\n\n"
            "def parent():\n    return os.getppid()\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        import late_tools_t29  # type: ignore[import-not-found]
        import threaded_tools_t29  # type: ignore[import-not-found]

        try:
            assert worker.isolated(late_tools_t29.parent)() == tpl  # imported in the template
            assert worker.isolated(threaded_tools_t29.parent)() == me  # it would start a thread there
        finally:
            threaded_tools_t29.done.set()
        fresh = worker.isolated(parent)()
        assert fresh not in (me, tpl)  # the template that imported a thread-starting module retired

        os.kill(fresh, signal.SIGKILL)
        # (dead before the call: a template killed while it hands a call over takes the call with it)
        psutil.Process(fresh).wait(timeout=10)  # (our child: reaped here)
        again = worker.isolated(parent)()  # the dead template is noticed, another started
        assert again not in (me, tpl, fresh)
    finally:
        lowlevel.tool_templates(None)
    assert _gone(tpl) and _gone(fresh)


def test_a_function_its_embryo_cannot_find_by_name_is_forked_by_the_caller() -> None:
    """TOOL-EMBRYO-DIRECT: once its template has imported a module, a call of that module goes straight
    to an embryo, which finds the function by name; one that a fresh import does not have (made at run
    time) is told back by the embryo before anything of it runs, and the caller forks it, once."""
    lowlevel.tool_templates(True)

    def added_later(path: str) -> int:
        with open(path, "a") as f:
            f.write("ran\n")
        return os.getppid()

    added_later.__qualname__ = added_later.__name__
    globals()["added_later"] = added_later
    try:
        me = os.getpid()
        tpl = worker.isolated(parent)()
        assert tpl != me and worker.isolated(parent)() == tpl  # (the second from an embryo)
        with tempfile.TemporaryDirectory() as tmp:
            ran = os.path.join(tmp, "ran")
            late = worker.isolated(added_later)
            assert late(ran) == me
            assert late(ran) == me
            assert Path(ran).read_text() == "ran\n" * 2  # never twice for one call
    finally:
        del globals()["added_later"]
        lowlevel.tool_templates(None)


def measure(data: str) -> list[int]:
    return [os.getpid(), len(data)]


def test_arguments_too_large_for_a_message_cross_to_the_template_and_to_an_embryo() -> None:
    """Arguments over a message's size go in a memfd: to the template (a first call) and to the embryo
    waiting for a later one (TOOL-EMBRYO-DIRECT) alike."""
    lowlevel.tool_templates(True)
    try:
        iso = worker.isolated(measure)
        big = "x" * 300_000
        pids = set()
        for text in (big, big, "y", big):
            pid, n = iso(text)
            assert n == len(text)
            pids.add(pid)
        assert len(pids) == 4 and os.getpid() not in pids
    finally:
        lowlevel.tool_templates(None)


async def test_a_call_in_an_embryo_whose_template_is_killed_is_a_crash_with_nothing_left(
    tmp_path: Path,
) -> None:
    """TOOL-EMBRYO-DIRECT: a call handed straight to its embryo still ends as ``ToolCrashed(signal=9)`` when
    its template is killed mid-call (the embryo dies with it: its exit status is nobody's to tell), and the
    next call gets a new template."""
    from tests.agents import tools

    lowlevel.tool_templates(True)
    try:
        if lowlevel.tool_limits_backend()["containment"] != "cgroup2":
            pytest.skip("no cgroup v2 containment here: no kept groups")
        stuck = worker.isolated(tools.sleeper, timeout=None)
        whose = worker.isolated(tools.parent)
        first = whose()
        assert whose() == first  # (its module imported there: the next calls go to embryos)
        embryo = _embryo_waiting(stuck.limits)
        pidfile = tmp_path / "call"
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    with pytest.raises(worker.ToolCrashed) as crashed:
                        await stuck.acall(str(pidfile))
                    assert crashed.value.signal == signal.SIGKILL

                tg.start_soon(call)
                await _wait_for(pidfile)
                assert _pid_of(pidfile) == embryo
                os.kill(first, signal.SIGKILL)
        assert _gone(_pid_of(pidfile))
        assert whose() not in (first, os.getpid())
    finally:
        lowlevel.tool_templates(None)


def test_a_templates_calls_die_with_their_caller(tmp_path: Path) -> None:
    """A caller killed with SIGKILL while a call runs in its template: the template sees its control
    socket close with its caller gone, kills the call's tree and exits."""
    import subprocess

    pidfile = tmp_path / "call"
    code = (
        "import worker\n"
        "from worker import lowlevel\n"
        "from tests.agents import tools\n"
        "lowlevel.tool_templates(True)\n"
        f"worker.isolated(tools.sleeper, timeout=None)({str(pidfile)!r})\n"
    )
    before = {p.pid for p in psutil.Process().children()}
    caller = subprocess.Popen([sys.executable, "-c", code], cwd=str(Path(__file__).parent.parent))
    try:
        anyio.run(lambda: _wait_for(pidfile, bound=60.0))
        call = _pid_of(pidfile)
        template = psutil.Process(call).ppid()
        assert template != caller.pid
    finally:
        caller.kill()
        caller.wait()
    # We are the subreaper of what the caller left: its template exits once it has killed the call.
    for orphan in psutil.Process().children():
        if orphan.pid not in before:
            orphan.wait(timeout=20)
    assert _gone(call) and _gone(template)


async def test_in_a_worker_the_template_serves_every_turn_and_is_not_a_leftover() -> None:
    """Inside a worker calls come from its template (started on the first call, not the worker's
    own fork); the end-of-turn sweep leaves it, so the next turn's call comes from the same one."""
    from supervisor import Supervisor

    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(60):
            first = await sup.run("tests.agents.tools:whose_calls", {})
            second = await sup.run("tests.agents.tools:whose_calls", {})
    assert first.outcome == second.outcome == "completed", (first, second)
    assert first.worker_pid == second.worker_pid == first.output["worker"]
    assert first.output["parent"] != first.output["worker"]
    assert second.output["parent"] == first.output["parent"]


def _call_groups_of(pid: int) -> list[str]:
    own = proctree.cgroup_of()
    assert own is not None
    return [name for name in os.listdir(own) if name.startswith(f"turnpool-{pid}-") and "-call" in name]


def _ahead_of_the_machines_load() -> None:
    """In a caller about to exec: run it (and the template, spawner and embryos it starts) at niceness
    -10 where allowed. At exit a caller waits at most 1 s for its kept groups' last process to die before
    removing them; at load 250-450 on this shared 2-core machine, a SIGKILLed process at niceness 0 waited
    longer than that for a CPU (2 of 15 exits left a group there, 0 of 15 at -10)."""
    with contextlib.suppress(OSError):
        os.nice(-10)


def test_kept_call_groups_go_at_exit_and_a_killed_callers_are_swept() -> None:
    """TOOL-REUSE-GROUPS: a caller's groups kept for reuse are removed when it exits; those of a caller killed
    with SIGKILL are swept (its v2 groups too) by the next sweep."""
    import functools
    import subprocess

    if lowlevel.tool_limits_backend()["containment"] != "cgroup2":
        pytest.skip("no cgroup v2 containment here")
    run = functools.partial(
        subprocess.run, capture_output=True, timeout=60, preexec_fn=_ahead_of_the_machines_load
    )
    code = "import os, sys, worker\nworker.run_command(['true'])\nprint(os.getpid(), flush=True)\n"
    done = run([sys.executable, "-c", code], check=True)
    assert _call_groups_of(int(done.stdout)) == []
    warm = (  # with templates: the kept groups hold an embryo (TOOL-EMBRYO), killed and removed at exit;
        # a function's last call may still be exiting there (TOOL-LADDER): waited for, then removed
        "import os, worker\nfrom worker import lowlevel\nlowlevel.tool_templates(True)\n"
        "worker.run_command(['true'])\nworker.run_command(['true'])\n"
        "for _ in range(3):\n    assert worker.isolated(os.getpid)() != os.getpid()\n"
        "print(os.getpid(), flush=True)\n"
    )
    done = run([sys.executable, "-c", warm], check=True)
    assert _call_groups_of(int(done.stdout)) == []
    killed = run([sys.executable, "-c", code + "os.kill(os.getpid(), 9)\n"])
    assert killed.returncode == -signal.SIGKILL
    pid = int(killed.stdout)
    assert _call_groups_of(pid), "the killed caller kept no group: nothing to sweep"
    lowlevel.tool_groups_sweep()
    assert _call_groups_of(pid) == []


def started_at() -> list[int]:
    """This process's pid and start time (clock ticks since boot)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return [os.getpid(), int(fields[19])]


def _waiting(template: psutil.Process) -> set[int]:
    """The template's children that are waiting for a call: sleeping, not exiting or a zombie."""
    found = set()
    for child in template.children():
        try:
            if child.status() == psutil.STATUS_SLEEPING:
                found.add(child.pid)
        except psutil.Error:
            pass
    return found


def test_a_calls_process_waits_in_its_kept_groups_before_the_call() -> None:
    """TOOL-EMBRYO: once a call's groups are kept, the template puts the next call's process in them
    ahead of time (moving a process into a cgroup can wait ~10 ms for the kernel; a fork is most of a
    short call's cost): the next call with the same limits is made by a process that started before the
    call did."""
    if lowlevel.tool_limits_backend()["containment"] != "cgroup2":
        pytest.skip("no cgroup v2 containment here: no kept groups")
    lowlevel.tool_templates(True)
    try:
        iso = worker.isolated(started_at)
        template = psutil.Process(worker.isolated(parent)())
        deadline = time.monotonic() + 20
        # The groups kept for these limits: SPARE_GROUPS sets used in turn, an embryo waiting in each. (The
        # call just made returned with its result: its process may still be exiting, or a zombie the template
        # has yet to reap.)
        # (Another embryo may wait too: the one made after the last hand-over.)
        embryos = _waiting(template)
        while len(embryos) < lowlevel.TOOL_SPARE_GROUPS and time.monotonic() < deadline:
            time.sleep(0.01)  # allowed: bounded poll of another process's children
            embryos = _waiting(template)
        assert len(embryos) >= lowlevel.TOOL_SPARE_GROUPS, embryos
        before = time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK")
        pid, start = iso()
        assert pid in embryos and start <= before
    finally:
        lowlevel.tool_templates(None)


def faults_so_far() -> list[int]:
    """This process's pid and the page faults it took so far (read first thing in the call)."""
    import resource

    return [os.getpid(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt]


def _minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[7])


def _embryo_waiting(limits: Any) -> int:
    """The process waiting in the kept groups the next function call with ``limits`` takes, once it
    waits for its call (in a socket's receive)."""
    contain = lowlevel.tool_next_call_groups(limits, "fn")
    assert contain is not None
    deadline = time.monotonic() + 20
    while True:
        procs = [int(p) for p in Path(contain, "cgroup.procs").read_text().split()]
        if len(procs) == 1 and "wait_for_more_packets" in Path(f"/proc/{procs[0]}/wchan").read_text():
            return procs[0]
        assert time.monotonic() < deadline, procs
        time.sleep(0.005)  # allowed: bounded poll of another process's state


def test_an_embryo_takes_the_copy_on_write_faults_of_a_calls_path_before_the_call() -> None:
    """TOOL-EMBRYO-DIRECT: the process waiting for a call has run the call's path on a dummy, so the
    pages a call writes (interpreter state, type caches, the allocator's) are its own before the call:
    from waiting to the function's first line, a call takes few page faults (~15 here; ~50 before the
    rehearsal, each ~4 us of the call's time on this machine)."""
    if lowlevel.tool_limits_backend()["containment"] != "cgroup2":
        pytest.skip("no cgroup v2 containment here: no kept groups")
    lowlevel.tool_templates(True)
    try:
        iso = worker.isolated(faults_so_far)
        for _ in range(3):
            iso()  # the template has found it; its kept groups have an embryo each
        seen = []
        for _ in range(7):
            embryo = _embryo_waiting(iso.limits)
            waiting = _minor_faults(embryo)
            pid, at_start = iso()
            assert pid == embryo
            seen.append(at_start - waiting)
        seen.sort()
        assert seen[len(seen) // 2] < 30, seen
    finally:
        lowlevel.tool_templates(None)
