"""TOOL-LADDER: a function's call returns once nothing of it can run again. A call whose process finds
itself alone (one thread, no child, alone in its group), with collections off and every signal blocked,
marks its outcome final and the caller returns without waiting for the kernel to tear the process down;
anything of the call that could still run (a thread, a child, a daemon) makes the caller wait for the
process and sweep its tree, as before.

Calls are made by a warm template (as inside a worker), with cgroups and in the rlimit fallback. Each
test waits (bounded) for the call's process to be gone before it ends; then what the call could have
done after returning is looked for (a file its thread, finaliser or signal handler would write).
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import worker
from tests.test_isolated_tools import cooperative
from worker import lowlevel

_HELD: list[Any] = []  # what a call's process keeps until its exit (module state: never finalised)


@pytest.fixture(params=[None, False], ids=["cgroups", "rlimit-fallback"])
def cgroups(request: pytest.FixtureRequest) -> Iterator[bool | None]:
    """Calls made by this process's warm template, with cgroups where there are, and without."""
    lowlevel.tool_templates(True)
    try:
        yield request.param
    finally:
        lowlevel.tool_templates(None)  # closes the templates: nothing outlives the test


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _until_gone(pid: int, bound: float = 20.0) -> None:
    deadline = time.monotonic() + bound
    while not _gone(pid):
        assert time.monotonic() < deadline, f"the call's process {pid} is still there"
        time.sleep(0.005)  # allowed: bounded poll of another process's state


# ---- tools under test (module level: found by name in the template) ---------------------------


def hold_memory(mib: int) -> int:
    """Write ``mib`` MiB, kept by the module until the process exits: its exit tears them down."""
    _HELD.append(b"\x01" * (mib << 20))
    return os.getpid()


def thread_writes_later(path: str, delay: float) -> int:
    def later() -> None:
        time.sleep(delay)  # allowed: the tool's thread outlives its function on purpose
        Path(path).write_text("written by the call's thread")

    threading.Thread(target=later, daemon=True).start()
    return os.getpid()


def child_left_running(pidfile: str) -> int:
    child = os.fork()
    if child == 0:
        time.sleep(60)  # allowed: the child the tool leaves behind idles until killed
        os._exit(0)
    Path(pidfile).write_text(str(child))
    return os.getpid()


class _Finalised:
    def __init__(self, path: str) -> None:
        self.path = path
        self.me: Any = None

    def __del__(self) -> None:
        Path(self.path).write_text("finalised")


def leave_finalisers(held: str, garbage: str) -> int:
    """One object with ``__del__`` held by module state, one left as cyclic garbage (a collection
    would finalise it), and plenty of garbage to collect."""
    _HELD.append(_Finalised(held))
    cycle = _Finalised(garbage)
    cycle.me = cycle
    del cycle
    for _ in range(2000):
        loop: list[Any] = []
        loop.append(loop)
    return os.getpid()


def stops_when_asked(pidfile: str) -> str:
    """Hold 256 MiB (a slow exit), then work until the ladder's interruption, and return."""
    Path(pidfile).write_text(str(os.getpid()))
    _HELD.append(b"\x01" * (256 << 20))
    return cooperative(pidfile)


def alarm_after_return(path: str, delay: float) -> int:
    def handler(signum: int, frame: Any) -> None:
        Path(path).write_text("alarm")

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, delay)
    return os.getpid()


def forges_a_final_outcome(path: str, pidfile: str) -> int:
    """A hostile tool: leaves a child, writes an outcome marked final (its own pid) on every pipe it
    inherited (the result pipe among them) and goes on: it would write ``path`` later."""
    import stat

    import msgspec

    child = os.fork()
    if child == 0:
        time.sleep(60)  # allowed: the child the tool leaves behind idles until killed
        os._exit(0)
    Path(pidfile).write_text(str(child))
    payload = msgspec.msgpack.encode(["ok", os.getpid()])
    forged = b"\xc1" + len(payload).to_bytes(4, "little") + payload
    for fd in range(3, 256):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, forged)
        except OSError:
            pass
    time.sleep(0.3)  # allowed: what the tool would do once its caller has gone on
    Path(path).write_text("ran on after its outcome")
    return 0


# ---- tests -------------------------------------------------------------------------------------


def test_a_clean_call_returns_before_its_process_has_finished_exiting(cgroups: bool | None) -> None:
    """The fast path is taken: a call whose process holds 256 MiB (tens of ms to tear down) returns
    while that process is still there (its pidfd not readable: the old code returned only once it
    was). Back to back, the kept groups are used in turn: a set whose last call's process still exits
    waits for it before its next call."""
    iso = worker.isolated(hold_memory, memory_mb=1024, cgroups=cgroups)
    pids, exiting = [], []
    for _ in range(5):
        pid = iso(256)
        pids.append(pid)
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            exiting.append(False)  # gone and reaped already
            continue
        try:
            exiting.append(not select.select([pidfd], [], [], 0)[0])
        finally:
            os.close(pidfd)
    for pid in pids:
        _until_gone(pid)
    assert sum(exiting) >= 3, exiting  # (a loose bound: the caller may be descheduled for as long)


@pytest.mark.parametrize("what", ["thread", "child"])
def test_a_call_that_leaves_a_thread_or_a_child_returns_only_once_its_process_is_gone(
    tmp_path: Path, cgroups: bool | None, what: str
) -> None:
    """Something of the call could still run: the caller waits for the call's process (a thread dies
    with it; a child is killed with the call's tree), so nothing of the call acts after it returned."""
    path = tmp_path / "late"
    pidfile = tmp_path / "child"
    if what == "thread":
        pid = worker.isolated(thread_writes_later, cgroups=cgroups)(str(path), 0.5)
    else:
        pid = worker.isolated(child_left_running, cgroups=cgroups)(str(pidfile))
        assert _gone(int(pidfile.read_text()))
    assert _gone(pid)
    assert not path.exists()


def test_no_finaliser_of_the_call_runs_after_it_returned(tmp_path: Path, cgroups: bool | None) -> None:
    """Collections are off before the checks: an object with ``__del__`` held by module state is never
    finalised, and cyclic garbage is finalised before the call returns or never."""
    iso = worker.isolated(leave_finalisers, cgroups=cgroups)
    for i in range(10):
        held, garbage = tmp_path / f"held{i}", tmp_path / f"garbage{i}"
        pid = iso(str(held), str(garbage))
        at_return = garbage.exists()
        _until_gone(pid)
        assert not held.exists()
        assert garbage.exists() == at_return


def test_no_signal_handler_of_the_call_runs_after_it_returned(tmp_path: Path, cgroups: bool | None) -> None:
    """Every signal is blocked before the checks (those already come are handled there): a handler
    armed to fire just after the function returns runs before the call returns, or never."""
    iso = worker.isolated(alarm_after_return, cgroups=cgroups)
    for i in range(24):
        path = tmp_path / f"alarm{i}"
        pid = iso(str(path), (0.0002, 0.0005, 0.001, 0.002)[i % 4])
        at_return = path.exists()
        _until_gone(pid)
        assert path.exists() == at_return, i


def test_a_stopped_call_returns_only_once_its_process_is_gone(tmp_path: Path, cgroups: bool | None) -> None:
    """A call stopped by its ladder raises only once its process is gone, even when the process then
    returned by itself, alone, and marked its outcome final (it was stopped: the old way holds)."""
    for i in range(3):
        pidfile = tmp_path / f"pid{i}"
        with pytest.raises(worker.ToolKilled) as info:
            worker.isolated(stops_when_asked, timeout=1.0, memory_mb=1024, cgroups=cgroups)(str(pidfile))
        assert info.value.reason == "timeout"
        assert _gone(int(pidfile.read_text()))


def test_a_forged_final_outcome_stops_the_process_that_wrote_it(tmp_path: Path, cgroups: bool | None) -> None:
    """A function that writes an outcome marked final on its inherited result pipe and goes on is not
    taken at its word: the caller kills the process as it returns, and what it left (a child, in its
    groups) goes down the sweep of the call's leftovers. Nothing of it writes after the call returned."""
    later, pidfile = tmp_path / "later", tmp_path / "child"
    pid = worker.isolated(forges_a_final_outcome, cgroups=cgroups)(str(later), str(pidfile))
    _until_gone(pid)
    assert not later.exists(), "the forger ran on after its call returned"
    _until_gone(int(pidfile.read_text()))  # (its groups, or its tree, swept: the child went with them)
