"""Workers are isolated from the supervisor's stderr, working directory and shared temp dir.

* WORKER-OUTPUT: no agent output ever blocks the supervisor; it lands where documented, size-bounded.
* WORKER-PATH: workers import agents only from the explicit path (``--path`` / ``agent_path``; the
  embedded default mirrors the host's ``sys.path``), in safe-path mode, from a private directory:
  a module planted in the daemon's working directory never runs.
* SEC-RUNDIR: a runtime directory squatted by another user neither denies service nor redirects the
  socket: a private fallback under the home directory is used, and said.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from supervisor import Supervisor
from tests.support import daemonkit

ROOT = daemonkit.ROOT
FLOOD = "tests.agents.isolation:flood"
BOUND = 90.0  # generous: a shared 2-core machine
pytestmark = pytest.mark.anyio


def _wait_file(path: Path, text: str | None = None, timeout: float = BOUND) -> None:
    """Bounded wait for a file another process writes (the event lives in that process)."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and (text is None or path.read_text() == text)):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.02)  # allowed: bounded poll of a file written by another process


def _log_files(log: Path) -> list[Path]:
    return sorted(log.parent.glob(log.name + "*"))


@pytest.fixture
def home() -> Iterator[Path]:
    d = daemonkit.short_dir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---- WORKER-OUTPUT: worker output --------------------------------------------------------------


def test_serve_flood_with_unread_stderr_never_blocks_daemon(home: Path) -> None:
    """Promise: an agent printing 64 MiB while the daemon's stderr is a pipe nobody reads never
    blocks the daemon: status answers, the turn's deadline fires, SIGTERM ends it; the output is in
    the ``--worker-log`` file, prefixed with the worker, and bounded (4 files × the max size)."""
    log = home / "logs" / "workers.log"
    served = daemonkit.start(
        *daemonkit.FAST,
        "--worker-log",
        str(log),
        "--worker-log-max-mb",
        "1",
        "--log-level",
        "INFO",
        home=home,
        stderr_pipe=True,
    )
    try:
        assert f"workers' output: {log}" in served.ready
        marker = home / "flood.marker"
        inp = json.dumps({"mib": 64, "marker": str(marker)})
        sub = served.cli("submit", FLOOD, "--input", inp, "--timeout", "3", "--turn-id", "flood")
        assert sub.returncode == 0, sub.stderr
        _wait_file(marker)
        st = served.cli("status", "--json", timeout=BOUND)
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)["worker_output"] == str(log)
        waited = served.cli("submit", FLOOD, "--input", inp, "--turn-id", "flood", "--wait", timeout=BOUND)
        result = json.loads(waited.stdout)
        assert result["outcome"] == "killed" and result["cause"] == {"kind": "deadline"}, result
        assert served.cli("status", "--json", timeout=BOUND).returncode == 0
        # SIGTERM while another agent floods: the daemon disposes it and exits 0.
        marker2 = home / "flood2.marker"
        inp2 = json.dumps({"mib": 64, "marker": str(marker2)})
        assert served.cli("submit", FLOOD, "--input", inp2).returncode == 0
        _wait_file(marker2)
        served.signal(signal.SIGTERM)
        assert served.wait(BOUND) == 0
    finally:
        daemonkit.stop_process(served.proc)
    files = _log_files(log)
    assert 1 <= len(files) <= 4, files
    assert all(f.stat().st_size <= 2**20 for f in files), [f.stat().st_size for f in files]
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    text = "".join(f.read_text(errors="replace") for f in files)
    assert re.search(r" w\d+\[\d+\]: x{1023}\n", text), text[:300]


HOST = textwrap.dedent("""
    import json, sys, anyio
    from supervisor import Supervisor

    async def main():
        async with Supervisor(workers=1, spares=0, grace=0.5, kill_after=0.5) as sup:
            r = await sup.run("tests.agents.isolation:flood", {"mib": 64, "marker": sys.argv[1]}, timeout=3)
            print(json.dumps({"outcome": r.outcome, "cause": r.cause and r.cause.kind,
                              "dropped": (await sup.status()).get("worker_output_dropped")}), flush=True)

    anyio.run(main)
""")


def test_embedded_flood_with_unread_stderr_never_blocks_supervisor(tmp_path: Path) -> None:
    """Promise: in a host whose stderr is a pipe nobody reads, an embedded ``Supervisor`` with the
    default ``worker_output`` ("stderr": forwarded, never filling that pipe) still ends a flooding
    turn at its deadline, logs its own escalation, and closes."""
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOST, str(marker)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], BOUND)
        assert ready, "the embedded supervisor never reported the turn's end"
        result = json.loads(proc.stdout.readline())
        assert result["outcome"] == "killed" and result["cause"] == "deadline", result
        assert result["dropped"] > 0  # the flood did not fit: dropped, not blocking
        assert proc.wait(BOUND) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()


@pytest.mark.parametrize("zygote", [True, False])
async def test_embedded_worker_output_file(tmp_path: Path, zygote: bool) -> None:
    """Promise: with ``worker_output=PATH`` each line a worker prints (stdout or stderr) lands in
    PATH as ``<time> w<n>[<pid>]: line``, the log is rotated at ``worker_output_max_mb`` (4 files at
    most) and the host's stderr gets none of it; each worker runs in a 0700 directory of its own
    (WORKER-CWD), not the host's cwd nor the engine's private directory."""
    log = tmp_path / "w.log"
    with anyio.fail_after(BOUND):
        async with Supervisor(
            workers=1,
            spares=0,
            grace=0.2,
            kill_after=0.2,
            zygote=zygote,
            worker_output=log,
            worker_output_max_mb=0.25,
        ) as sup:
            r = await sup.run("tests.agents.isolation:hello", "hi")
            assert r.outcome == "completed", r
            assert r.output == str(sup.pool.work_dir / "w1") != os.getcwd()
            assert stat.S_IMODE(os.stat(r.output).st_mode) == 0o700
            for stream in ("stdout", "stderr"):  # the pump thread writes them soon after
                line = re.compile(rf"^\S+ w1\[{r.worker_pid}\]: hello-{stream} hi$", re.M)
                while not (log.exists() and line.search(log.read_text(errors="replace"))):  # noqa: ASYNC110
                    await anyio.sleep(0.02)  # allowed: bounded poll of a file the pump thread writes
            r2 = await sup.run(FLOOD, {"mib": 4, "marker": str(tmp_path / "m")}, timeout=1)
            assert r2.cause is not None and r2.cause.kind == "deadline"
            assert (await sup.status())["worker_output"] == str(log)
    files = _log_files(log)
    assert len(files) == 4 and all(f.stat().st_size <= 2**18 for f in files), files


def test_worker_output_option_is_validated() -> None:
    """Promise: a bad ``worker_output`` / ``agent_path`` is refused at the call with a clear message."""
    with pytest.raises(TypeError, match="worker_output"):
        Supervisor(worker_output=3)
    with pytest.raises(ValueError, match="worker_output"):
        Supervisor(worker_output="/")
    with pytest.raises(TypeError, match="agent_path"):
        Supervisor(agent_path="/tmp")
    with pytest.raises(ValueError, match="not a directory"):
        Supervisor(agent_path=["/no/such/dir"])
    with pytest.raises(ValueError, match="worker_output_max_mb"):
        Supervisor(worker_output_max_mb=0)


# ---- WORKER-PATH: the import path -----------------------------------------------------------

PLANTED = ("msgspec", "worker", "anyio", "zmq", "wire", "tests")


def _plant(directory: Path) -> Path:
    """Modules that would write ``pwned-<name>`` in ``directory`` if any process imported them."""
    for name in PLANTED:
        (directory / f"{name}.py").write_text(
            f"open({str(directory / ('pwned-' + name))!r}, 'w').close()\nraise SystemExit(99)\n"
        )
    return directory


def _pwned(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("pwned-*"))


def test_serve_never_runs_code_planted_in_its_cwd(home: Path) -> None:
    """Promise: modules planted in the daemon's working directory (msgspec.py, worker.py, anyio.py…)
    never run: not in the zygote, not in a worker, not when a turn imports its agent."""
    planted = home / "cwd"
    planted.mkdir()
    _plant(planted)
    served = daemonkit.start(*daemonkit.FAST, home=home, cwd=planted)
    try:
        out = served.cli("submit", "tests.agents:signal_state", "--wait")
        assert out.returncode == 0, out.stderr + out.stdout
        assert json.loads(out.stdout)["outcome"] == "completed"
    finally:
        daemonkit.stop_process(served.proc)
    assert _pwned(planted) == []


@pytest.mark.parametrize("zygote", [True, False])
async def test_embedded_never_runs_code_planted_in_cwd(tmp_path: Path, zygote: bool) -> None:
    """Promise: an embedded ``Supervisor`` started while the host's cwd holds planted modules
    (the host itself imported its own packages already) starts workers that never import them;
    ``tests.agents`` still resolves through the host's ``sys.path``."""
    planted = tmp_path / "cwd"
    planted.mkdir()
    _plant(planted)
    old = os.getcwd()
    os.chdir(planted)
    try:
        with anyio.fail_after(BOUND):
            async with Supervisor(workers=1, spares=0, zygote=zygote) as sup:
                r = await sup.run("tests.agents:signal_state")
                assert r.outcome == "completed", r
    finally:
        os.chdir(old)
    assert _pwned(planted) == []


def _agent_module(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text("async def run(turn):\n    return 'ran ' + __name__\n")
    return directory


def test_serve_path_flag_and_cwd_not_searched(home: Path) -> None:
    """Promise: ``--path DIR`` makes an agent module in DIR importable; an agent that exists only
    in the daemon's cwd ends ``failed`` with ``ModuleNotFoundError`` naming ``--path``, and the
    worker stays up (the next turn runs on the same pid)."""
    cwd = _agent_module(home / "cwd", "cwdagent")
    extra = _agent_module(home / "agents", "pathagent")
    served = daemonkit.start(*daemonkit.FAST, "--workers", "1", home=home, cwd=cwd, paths=(ROOT, str(extra)))
    try:
        ok = json.loads(served.cli("submit", "pathagent:run", "--wait").stdout)
        assert ok["outcome"] == "completed" and ok["output"] == "ran pathagent", ok
        bad = json.loads(served.cli("submit", "cwdagent:run", "--wait").stdout)
        assert bad["outcome"] == "failed", bad
        assert bad["error"]["type"] == "ModuleNotFoundError" and "--path" in bad["error"]["message"], bad
        again = json.loads(served.cli("submit", "pathagent:run", "--wait").stdout)
        assert again["outcome"] == "completed" and again["worker_pid"] == bad["worker_pid"]
    finally:
        daemonkit.stop_process(served.proc)


async def test_embedded_agent_path(tmp_path: Path) -> None:
    """Promise: ``agent_path=[DIR]`` imports agents from DIR (and installed packages) only; the
    host's own ``sys.path`` then no longer counts (``tests.agents`` is not found)."""
    extra = _agent_module(tmp_path / "agents", "pathagent2")
    with anyio.fail_after(BOUND):
        async with Supervisor(workers=1, spares=0, agent_path=[extra]) as sup:
            r = await sup.run("pathagent2:run")
            assert r.outcome == "completed" and r.output == "ran pathagent2", r
            r = await sup.run("tests.agents:signal_state")
            assert r.outcome == "failed" and r.error is not None and r.error.type == "ModuleNotFoundError"


# ---- SEC-RUNDIR: the runtime directory ------------------------------------------------------


def _as_nobody(fn: object) -> None:
    """Run ``fn()`` in a forked child under the ``nobody`` uid; skip if this machine cannot."""
    if os.getuid() != 0:
        pytest.skip("creating a file as another user needs root here")
    nobody = pwd.getpwnam("nobody")
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            fn()  # type: ignore[operator]
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("squat", ["directory", "symlink"])
def test_squatted_runtime_dir_falls_back(home: Path, squat: str) -> None:
    """Promise: another user pre-creating ``<tmp>/turnpool-<uid>`` (a directory of theirs, or a
    symlink to one) neither denies service nor redirects the socket: serve and the CLI both use the
    private fallback under ``$XDG_CACHE_HOME`` / ``~/.cache`` and say why."""
    os.chmod(home, 0o711)  # the other user may reach the temp dir below, nothing more
    tmp = home / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)  # a shared temp dir, like /tmp
    theirs = tmp / "theirs"
    squatted = tmp / f"turnpool-{os.getuid()}"

    def create() -> None:
        if squat == "directory":
            os.mkdir(squatted, 0o777)
        else:
            os.mkdir(theirs, 0o777)
            os.symlink(theirs, squatted)

    _as_nobody(create)
    env = {
        "TMPDIR": str(tmp),
        "XDG_RUNTIME_DIR": None,
        "TURNPOOL_ENDPOINT": None,
        "HOME": str(home),
        "XDG_CACHE_HOME": None,
    }
    served = daemonkit.start(*daemonkit.FAST, home=home, endpoint=None, env_extra=env)
    try:
        fallback = home / ".cache" / "turnpool-run"
        assert served.endpoint == f"ipc://{fallback}/supervisor.sock", served.ready
        assert stat.S_IMODE(fallback.stat().st_mode) == 0o700
        st = served.cli("status", "--json")
        assert st.returncode == 0, st.stderr
        assert f"using {fallback} instead" in st.stderr
    finally:
        daemonkit.stop_process(served.proc)
    assert "is not a directory owned by this user" in served.stderr()
    assert f"using {fallback} instead" in served.stderr()
    assert os.listdir(theirs if squat == "symlink" else squatted) == []  # nothing of ours went there


def test_serve_refuses_a_worker_log_it_cannot_write(home: Path) -> None:
    """Promise: a ``--worker-log`` that cannot be written stops ``serve`` at start with exit 1 and a
    message naming the file, before any worker exists (output is never silently lost)."""
    served = daemonkit.start(
        *daemonkit.FAST, "--worker-log", "/proc/no/such/workers.log", home=home, check_ready=False
    )
    try:
        assert served.wait(BOUND) == 1
    finally:
        daemonkit.stop_process(served.proc)
    assert "cannot write the workers' output log /proc/no/such/workers.log" in served.stderr()


@pytest.fixture
def small_disk(home: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for the test (root with CAP_SYS_ADMIN only), unmounted after."""
    mnt = home / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _scrape(url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_serve_counts_worker_output_lost_to_a_full_disk(home: Path, small_disk: Path) -> None:
    """Promise: output a ``--worker-log`` on a full disk cannot take is counted, never silently
    lost: an agent printing 3 MiB (3072 lines) onto a 1 MiB filesystem leaves the difference in
    ``status()["worker_output_dropped"]`` (bytes), ``["worker_output_dropped_lines"]`` and the
    ``turnpool_worker_output_dropped_{bytes,lines}_total`` metrics; the daemon keeps serving."""
    log = small_disk / "workers.log"
    served = daemonkit.start(
        *daemonkit.FAST,
        "--worker-log",
        str(log),
        "--worker-log-max-mb",
        "16",
        "--metrics-port",
        "0",
        home=home,
    )
    try:
        sub = served.cli("submit", "tests.agents.isolation:dump", "--input", '{"mib": 3}', "--wait")
        assert sub.returncode == 0 and json.loads(sub.stdout)["outcome"] == "completed", sub
        # The pump thread writes after the turn ended: a bounded wait for it to reach the count.
        deadline = time.monotonic() + BOUND
        while True:
            status = json.loads(served.cli("status", "--json").stdout)
            if status["worker_output_dropped"] >= 2 * 2**20 or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # allowed: bounded poll of a count the daemon's pump thread raises
        written = log.stat().st_size
        assert written <= 2**20
        dropped = status["worker_output_dropped"]
        # Each 1 KiB line gets a prefix in the log: all but what fitted on the disk was lost.
        assert dropped >= 3 * 2**20 - written, (dropped, written)
        lines = status["worker_output_dropped_lines"]
        assert 3072 - written // 1024 - 1 <= lines <= 3072, (lines, written)
        metrics = _scrape(served.metrics_url)
        assert metrics["turnpool_worker_output_dropped_bytes_total"] == dropped
        assert metrics["turnpool_worker_output_dropped_lines_total"] == lines
        again = served.cli("submit", "tests.agents.isolation:hello", "--input", '"x"', "--wait")
        assert json.loads(again.stdout)["outcome"] == "completed", again
    finally:
        served.signal(signal.SIGTERM)
        served.wait(BOUND)
        daemonkit.stop_process(served.proc)
