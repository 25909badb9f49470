"""Agents that leave processes behind (``tests.agents.tree:NAME``), for tests/test_tree_cleanup.py.

They fork *without exec*: a forked child keeps the worker's memory image as it was (its
environment block included), so a marker set with ``putenv`` in the worker never shows in the
child's ``/proc/PID/environ``. Each forked child does only async-signal-safe things (setsid,
fork, write, pause), since the worker has threads.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import anyio

import worker


def _daemonize(pid_file: str) -> dict[str, int]:
    """``fork → setsid → fork`` (the classic daemon) plus one plain forked child; both live until
    killed. Their pids go to ``pid_file`` (one line: "<daemon> <child>") and are returned."""
    r, w = os.pipe()
    plain = os.fork()
    if plain == 0:  # a plain child, in the worker's session
        os.close(r)
        os.close(w)
        while True:
            signal.pause()
    mid = os.fork()
    if mid == 0:
        try:
            os.close(r)
            os.setsid()
            daemon = os.fork()
            if daemon == 0:
                os.close(w)
                while True:
                    signal.pause()
            os.write(w, f"{daemon}\n".encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(mid, 0)
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(r, 64)
        if not chunk:
            break
        data += chunk
    os.close(r)
    daemon_pid = int(data)
    tmp = pid_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{daemon_pid} {plain}\n")
    os.rename(tmp, pid_file)  # appears whole: the test waits for the file
    return {"daemon": daemon_pid, "child": plain, "worker": os.getpid()}


async def daemonize(turn: worker.Turn) -> dict[str, int]:
    """Leaves a setsid daemon and a plain child running, then returns (outcome ``completed``)."""
    return _daemonize(turn.input["pid_file"])


async def daemonize_then_fail(turn: worker.Turn) -> None:
    """Leaves the same processes, then raises (outcome ``failed``)."""
    _daemonize(turn.input["pid_file"])
    raise RuntimeError("failed on purpose")


async def daemonize_then_crash(turn: worker.Turn) -> None:
    """Leaves the same processes, then kills its own worker (outcome ``crashed``)."""
    _daemonize(turn.input["pid_file"])
    os._exit(3)


async def daemonize_then_hang(turn: worker.Turn) -> None:
    """Leaves the same processes, then ignores cancellation without awaiting (outcome ``killed``)."""
    _daemonize(turn.input["pid_file"])
    await turn.emit({"type": "started", "pid": os.getpid()})
    while True:
        time.sleep(0.01)  # noqa: ASYNC251  # allowed: the agent must never await (the fault under test)


async def fork_many(turn: worker.Turn) -> dict[str, Any]:
    """Forks ``n`` children that only pause (sharing the worker's pages copy-on-write), stays
    up ``hold`` seconds so the memory watch samples the tree, then returns."""
    n = int(turn.input.get("n", 100))
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            while True:
                signal.pause()
        pids.append(pid)
    await turn.emit({"type": "forked", "pids": pids})
    # allowed: the agent's behaviour (the memory watch samples the tree meanwhile)
    await anyio.sleep(float(turn.input.get("hold", 1.0)))  # allowed: the agent holds its turn open
    return {"pids": pids}


async def next_turn_children(turn: worker.Turn) -> dict[str, Any]:
    """Reports the worker's pid and the processes in its tree besides its guardian."""
    import psutil

    me = psutil.Process()
    return {"worker": os.getpid(), "children": [p.pid for p in me.children(recursive=True)]}


def _unified(path: str) -> str:
    with open(path) as f:
        return next(line.strip() for line in f if line.startswith("0::"))


async def where_am_i(turn: worker.Turn) -> dict[str, Any]:
    """WORKER-JOIN-CGROUP: the cgroup v2 line of this worker, of each of its threads and of a child it
    runs."""
    threads = {tid: _unified(f"/proc/self/task/{tid}/cgroup") for tid in os.listdir("/proc/self/task")}
    child = (await anyio.run_process(["cat", "/proc/self/cgroup"])).stdout.decode()
    return {
        "self": _unified("/proc/self/cgroup"),
        "threads": threads,
        "child": next(line.strip() for line in child.splitlines() if line.startswith("0::")),
    }


async def announce_then_spin(turn: worker.Turn) -> None:
    """Says it runs, then spins without awaiting: only the kill ends it."""
    await turn.emit({"pid": os.getpid()})
    while True:
        pass


def _fork_forever(pid_file: str, forked: threading.Event) -> None:
    """Forks a child that pauses, notes its pid in ``pid_file`` (one per line), and again, for ever."""
    fd = os.open(pid_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    while True:
        pid = os.fork()
        if pid == 0:
            while True:
                signal.pause()
        os.write(fd, f"{pid}\n".encode())
        forked.set()
        time.sleep(0.002)  # allowed: the attacker's pace (a fork every few ms, as in the report)


async def thread_forker(turn: worker.Turn) -> dict[str, int]:
    """Leaves a thread that keeps forking children after the turn returned (outcome ``completed``)."""
    forked = threading.Event()
    threading.Thread(target=_fork_forever, args=(turn.input["pid_file"], forked), daemon=True).start()
    forked.wait()
    return {"worker": os.getpid()}


def thread_forker_sync(turn: worker.Turn) -> dict[str, int]:
    """The same from a plain ``def`` agent (it runs in a pool thread itself)."""
    forked = threading.Event()
    threading.Thread(target=_fork_forever, args=(turn.input["pid_file"], forked), daemon=True).start()
    forked.wait()
    return {"worker": os.getpid()}


async def thread_forker_raw(turn: worker.Turn) -> dict[str, int]:
    """The same from a thread started with ``_thread`` (not in ``threading``'s table of threads)."""
    import _thread

    forked = threading.Event()
    _thread.start_new_thread(_fork_forever, (turn.input["pid_file"], forked))
    forked.wait()
    return {"worker": os.getpid()}


async def used_to_thread(turn: worker.Turn) -> int:
    """Runs a call in asyncio's default thread pool, whose idle thread stays after the turn."""
    import asyncio

    await asyncio.to_thread(time.sleep, 0)  # allowed: a thread-pool call, no wait (its thread is tested)
    return os.getpid()


def _root_cgroup_procs() -> str:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            if post.split(" ", 1)[0] == "cgroup2":
                return os.path.join(pre.split(" ")[4], "cgroup.procs")
    raise RuntimeError("no cgroup v2 hierarchy")


async def escape_then_crash(turn: worker.Turn) -> None:
    """``fork → setsid → fork``, without exec; the grandchild moves itself to the root cgroup (as
    root), notes its pid in ``pid_file``, closes every descriptor it has (the tree marker's
    memfd among them) and pauses; then the agent kills its own worker (outcome ``crashed``)."""
    _escape(turn.input["pid_file"])
    os._exit(3)


def _escape(pid_file: str) -> None:
    procs = _root_cgroup_procs()
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:
        try:
            os.close(r)
            os.setsid()
            if os.fork() == 0:
                try:
                    fd = os.open(procs, os.O_WRONLY)
                    os.write(fd, b"0")
                    os.close(fd)
                    fd = os.open(pid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    os.write(fd, f"{os.getpid()}\n".encode())
                    os.close(fd)
                    os.closerange(0, w)
                    os.closerange(w + 1, 1 << 16)
                    os.write(w, b"x")
                    os.close(w)
                    while True:
                        signal.pause()
                finally:
                    os._exit(1)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(mid, 0)
    ok = os.read(r, 1)
    os.close(r)
    if ok != b"x":
        raise RuntimeError("the escapee did not get ready")


async def daemonize_then_wait(turn: worker.Turn) -> None:
    """Leaves the same processes, says so, then waits (idle) until cancelled or killed."""
    _daemonize(turn.input["pid_file"])
    await turn.emit({"type": "started", "pid": os.getpid()})
    await anyio.sleep_forever()


def _on_sigterm(then: Any) -> None:
    """Replace the worker's SIGTERM handler with one that calls ``then()``, then dies of the signal."""

    def handler(signum: int, frame: Any) -> None:
        # The ladder signals the worker and then its process group: a second SIGTERM would run this
        # again inside the first one's fork (and deadlock in the fork's own handlers).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        then()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)


async def escape_at_sigterm(turn: worker.Turn) -> None:
    """At its worker's SIGTERM (the ladder's SIGTERM step, which found nothing to list in the tree)
    the agent's own handler makes the grandchild of ``escape_then_crash`` (setsid, the root cgroup, every
    descriptor closed), then the worker dies of the signal."""
    _on_sigterm(lambda: _escape(turn.input["pid_file"]))
    await turn.emit({"type": "armed"})
    while True:
        time.sleep(0.01)  # noqa: ASYNC251 - blocking on purpose: only the ladder's SIGTERM ends it


def _short_lived_child(pid_file: str) -> None:
    child = os.fork()
    if child == 0:
        os._exit(0)
    fd = os.open(pid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, f"{child}\n".encode())
    os.close(fd)
    while True:  # dead, not reaped: a zombie of the worker's, ours once the worker is gone
        try:
            if os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return
        except ChildProcessError:
            return
        time.sleep(0.001)


async def zombie_at_sigterm(turn: worker.Turn) -> None:
    """At its worker's SIGTERM the agent's own handler forks a child that exits at once, and the
    worker dies of the signal without reaping it: the zombie comes to the supervisor."""
    _on_sigterm(lambda: _short_lived_child(turn.input["pid_file"]))
    await turn.emit({"type": "armed"})
    while True:
        time.sleep(0.01)  # noqa: ASYNC251 - blocking on purpose: only the ladder's SIGTERM ends it
