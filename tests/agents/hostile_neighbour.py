"""Agents for the hostile-neighbour soak (``tests/support/hostile_soak.py``).

Each first appends its turn id to the run log named in its input (``tests.agents.soak._note``: one
``O_APPEND`` write), so the harness counts how often every acknowledged turn really ran. Then it
attacks what it shares with the other workers, as an agent running as the daemon's user can:

- ``forge``: looks for other workers' start markers and End logs where it can see them (its
  working directory, the runtime directory), appends a forged ``End(completed, "FORGED")`` for the
  turn another worker is running, and SIGKILLs that worker so the forged end is read;
- ``wipe``: deletes everything in its working directory (``rm -rf ./*``);
- ``thread_forker``: leaves a thread behind that keeps forking sleeping children after it returns;
- ``escape``: a setsid double-forked grandchild that leaves its cgroup for the root one and closes
  its fds, then the turn crashes;
- ``suicide``: SIGKILLs its own worker;
- ``victim``: an ordinary long turn (the forger's target) that returns ``{"genuine": turn id}``.

Every process an agent leaves behind notes ``pid start-time`` in the pids log, so the harness can
tell a survivor from a reused pid. Every loop and every child is bounded in count and time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from typing import Any

import msgspec

import worker
from tests.agents.soak import _note
from wire.worker_link import End

FORGED = "FORGED"
_REC_HEAD = 16  # the End log's header (worker/_endlog.py): used, pid, reserved


def _start_time(pid: int | str = "self") -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def _linger(pids_log: str, seconds: float, kind: str) -> None:
    """In a child: note this process (``pid start-time kind``), then sleep (bounded) until killed;
    never returns."""
    try:
        _note(pids_log, f"{os.getpid()} {_start_time()} {kind}")
        time.sleep(seconds)  # allowed: a process left behind, bounded
    finally:
        os._exit(0)


def _seen_dirs() -> list[str]:
    """Where an agent can look for the engine's files: its cwd and the runtime directory."""
    dirs = [os.getcwd()]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        dirs.append(runtime)
        dirs += [
            os.path.join(runtime, d) for d in _listdir(runtime) if os.path.isdir(os.path.join(runtime, d))
        ]
    return list(dict.fromkeys(dirs))


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _forge_one(ends: str, started: str, me: int, prefix: str) -> int | None:
    """Append a forged End to the End log ``ends`` if its worker (not ``me``) runs a turn whose id
    starts with ``prefix``; returns that worker's pid, or None."""
    import struct

    try:
        with open(started, "rb") as f:
            head = f.read(12 + 1024)
        with open(ends, "r+b") as f:
            used, owner = struct.unpack_from("@II", f.read(_REC_HEAD))
            if owner == me or len(head) < 12:
                return None
            (n,) = struct.unpack_from("<I", head)
            (at,) = struct.unpack_from("<d", head, 4)
            turn_id = head[12 : 12 + n].decode(errors="replace")
            if not n or not turn_id.startswith(prefix):
                return None
            data = msgspec.msgpack.encode(
                End(turn_id, "completed", msgspec.Raw(msgspec.msgpack.encode(FORGED)))
            )
            f.seek(_REC_HEAD + used)
            f.write(struct.pack("<Id", len(data), at) + data)
            f.seek(0)
            f.write(struct.pack("@I", used + 12 + len(data)))
    except (OSError, struct.error, UnicodeError):
        return None
    return owner


def forge(turn: worker.Turn) -> Any:
    """Look (bounded by ``seconds``) for another worker running a turn whose id starts with
    ``prefix``; forge its end and SIGKILL it. Returns what it found and did."""
    inp = turn.input
    _note(inp["log"], turn.id)
    deadline = time.monotonic() + float(inp.get("seconds", 5))
    seen: set[str] = set()
    me = os.getpid()
    while time.monotonic() < deadline:
        for d in _seen_dirs():
            for name in _listdir(d):
                if not name.endswith(".ends"):
                    continue
                ends = os.path.join(d, name)
                seen.add(ends)
                owner = _forge_one(ends, ends[: -len(".ends")] + ".started", me, inp["prefix"])
                if owner is not None:
                    with contextlib.suppress(OSError):
                        os.kill(owner, signal.SIGKILL)
                    return {"forged": True, "worker": owner, "logs_seen": len(seen)}
        time.sleep(0.05)  # allowed: an attacker polling for a target, bounded by the deadline
    return {"forged": False, "logs_seen": len(seen)}


def wipe(turn: worker.Turn) -> Any:
    """``rm -rf ./*`` in the agent's working directory; returns how many entries it removed."""
    _note(turn.input["log"], turn.id)
    removed = 0
    for name in _listdir("."):
        try:
            if os.path.isdir(name) and not os.path.islink(name):
                shutil.rmtree(name)
            else:
                os.unlink(name)
            removed += 1
        except OSError:
            pass
    return {"removed": removed, "cwd": os.getcwd()}


def thread_forker(turn: worker.Turn) -> Any:
    """Returns at once, leaving a thread that forks ``children`` sleeping children, one every
    ``every`` seconds, each noted in the pids log and living at most ``linger`` seconds."""
    inp = turn.input
    _note(inp["log"], turn.id)
    count, every, linger = int(inp.get("children", 30)), float(inp.get("every", 0.05)), inp.get("linger", 120)

    def keep_forking() -> None:
        for _ in range(count):
            try:
                pid = os.fork()
            except OSError:
                return
            if pid == 0:
                _linger(inp["pids"], float(linger), "thread_forker")
            time.sleep(every)  # allowed: the escaping thread's pace

    threading.Thread(target=keep_forking, daemon=True).start()
    return {"thread": True}


def escape(turn: worker.Turn) -> None:
    """fork → setsid → fork: the grandchild moves itself to the root cgroup (where it can), closes
    its fds, notes itself and lingers; the worker then crashes (the ``crashed`` path's sweep)."""
    inp = turn.input
    _note(inp["log"], turn.id)
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork():
                os._exit(0)
            for root in ("/sys/fs/cgroup/unified/cgroup.procs", "/sys/fs/cgroup/cgroup.procs"):
                try:
                    with open(root, "w") as f:
                        f.write("0")
                    break
                except OSError:
                    pass
            os.closerange(0, 1024)
            _linger(inp["pids"], float(inp.get("linger", 120)), "escape")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    os._exit(5)


def suicide(turn: worker.Turn) -> None:
    """SIGKILLs its own worker."""
    _note(turn.input["log"], turn.id)
    os.kill(os.getpid(), signal.SIGKILL)


def victim(turn: worker.Turn) -> Any:
    """An ordinary turn that takes ``seconds``: another worker's forger aims at it."""
    _note(turn.input["log"], turn.id)
    time.sleep(float(turn.input.get("seconds", 3)))  # allowed: a long ordinary turn
    return {"genuine": turn.id}
