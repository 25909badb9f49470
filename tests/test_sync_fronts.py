"""The blocking twins as scripts use them (issue 15, items 3 and 4; design rule API-SYNC).

``SyncSupervisor`` and ``SyncClient`` work without ``with`` (opened on first use, ended by
``close()``); one never closed never keeps the interpreter from exiting; Ctrl-C while a
``SyncSupervisor`` starts raises ``KeyboardInterrupt`` promptly and leaves no process. Each case is
a user's script in a subprocess, bounded, so a hang fails instead of hanging.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.support.daemonkit import FAST, ROOT, serving

BOUND = 60.0

SUP = "SyncSupervisor(workers=1, spares=0, grace=0.5, kill_after=0.5, agent_path=[ROOT])"


def _run(
    code: str, *, env: dict[str, str] | None = None, bound: float = BOUND
) -> subprocess.CompletedProcess[str]:
    script = f"import sys\nROOT = {ROOT!r}\nsys.path.insert(0, ROOT)\n" + textwrap.dedent(code)
    try:
        return subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=bound,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the script did not exit within {bound}s: {exc.stdout!r} {exc.stderr!r}")


def _wait_file(path: Path) -> None:
    """Bounded wait for a file another process writes (the event lives in that process)."""
    deadline = time.monotonic() + BOUND
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.02)  # allowed: bounded poll of a file written by another process


def _tree(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_sync_supervisor_without_with_opens_on_first_use_and_closes() -> None:
    """``SyncSupervisor(...)`` then ``run`` works without ``with`` (no ``AttributeError``), and
    ``close()`` ends it: its workers are gone when ``close`` returns."""
    proc = _run(
        f"""
        import psutil
        from supervisor import SyncSupervisor
        sup = {SUP}
        print(sup.run("examples.agents:echo", {{"text": "hi"}}).output["text"])
        handle = sup.submit("examples.agents:streamer", {{"count": 2}})
        print(len(list(handle.events())), handle.result().outcome)
        workers = [w["pid"] for w in sup.status()["workers"]]
        sup.close()
        sup.close()  # harmless
        alive = [p for p in workers if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        print("alive", alive)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["hi", "2 completed", "alive []"], proc.stdout


@pytest.mark.parametrize("how", ["never_entered", "entered"])
def test_a_forgotten_sync_supervisor_never_keeps_the_interpreter_alive(how: str) -> None:
    """A script that never calls ``close()`` (opened on first use, or ``__enter__``-ed by hand)
    still exits, well within the bound, and leaves no worker behind."""
    enter = "sup.__enter__()" if how == "entered" else ""
    started = time.monotonic()
    proc = _run(
        f"""
        from supervisor import SyncSupervisor
        sup = {SUP}
        {enter}
        print(sup.run("examples.agents:echo", {{"text": "bye"}}).outcome, flush=True)
        """,
        bound=45,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "completed"
    assert time.monotonic() - started < 45


def test_sync_client_without_with_and_never_closed() -> None:
    """``SyncClient.connect(ep)`` works without ``with``; ``close()`` ends it; one never closed
    does not keep the script alive."""
    with serving(*FAST) as d:
        proc = _run(
            f"""
            from supervisor import SyncClient
            c = SyncClient.connect({d.endpoint!r})
            print(c.run("examples.agents:echo", {{"text": "a"}}).outcome)
            c.close()
            forgotten = SyncClient.connect({d.endpoint!r})
            print(forgotten.run("examples.agents:echo", {{"text": "b"}}).outcome, flush=True)
            """,
            env=d.env,
            bound=45,
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["completed", "completed"]


@pytest.mark.parametrize("when", ["at_once", "while_workers_import"])
def test_ctrl_c_while_a_sync_supervisor_starts(when: str) -> None:
    """SIGINT while ``SyncSupervisor`` starts (right away, or while its workers' preload is being
    imported), three times each: every run exits promptly with ``KeyboardInterrupt`` and leaves
    no process."""
    for attempt in range(3):
        with tempfile.TemporaryDirectory(prefix="tpint", dir="/tmp") as tmp:
            env = dict(os.environ, TURNPOOL_TEST_STUCK_DIR=tmp, TURNPOOL_TEST_SLOW_IMPORT_S="30")
            code = textwrap.dedent(
                f"""
                import sys
                sys.path.insert(0, {ROOT!r})
                from supervisor import SyncSupervisor
                print("starting", flush=True)
                with SyncSupervisor(workers=2, spares=0, agent_path=[{ROOT!r}],
                                    preload=("tests.agents.stuck_import_slow",)) as sup:
                    print("started", flush=True)
                """
            )
            proc = subprocess.Popen(
                [sys.executable, "-c", code],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                stdin=subprocess.DEVNULL,
            )
            try:
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == "starting"
                if when == "while_workers_import":
                    _wait_file(Path(tmp) / "import-slow")
                tree = _tree(proc.pid)
                proc.send_signal(signal.SIGINT)
                try:
                    _, err = proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    pytest.fail(
                        f"attempt {attempt}: Ctrl-C while starting did not end the script within 30 s"
                    )
                assert "KeyboardInterrupt" in err, err[-2000:]
                assert proc.returncode in (-signal.SIGINT, 1, 130), (proc.returncode, err[-2000:])
                left = [p for p in tree if _alive(p)]
                _gone, alive = psutil.wait_procs([psutil.Process(p) for p in left if _alive(p)], timeout=10)
                assert not alive, f"attempt {attempt}: left {alive}"
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
