"""Agents for ``tests/test_worker_own.py``: agents that go after what other workers and the engine
keep (SEC-WORKER-FILES, WORKER-CWD, WORKER-REBIND), as an agent running as the daemon's user could."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import struct
from typing import Any

import anyio

import wire
import worker
from wire import worker_link


async def wait_long(turn: worker.Turn) -> Any:
    """Says it is up, then waits 30 s (a long turn of another user's)."""
    await turn.emit({"type": "up"})
    await anyio.sleep(30)  # allowed: the agent's or tool's own work under test, not a wait
    return "real"


def _endpoint_dirs(pid: int) -> set[str]:
    """Directories named on ``pid``'s command line (``--endpoint ipc://…``, ``--cwd …``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return set()
    found = set()
    for flag, value in itertools.pairwise(argv):
        if flag == "--endpoint" and value.startswith("ipc://"):
            found.add(os.path.dirname(value[len("ipc://") :]))
        elif flag == "--cwd":
            found.add(value)
    return found


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return int(data[data.rfind(b")") + 2 :].split()[1])


def _candidates(victim: int, victim_id: str) -> tuple[list[str], list[str]]:
    """Every way to the victim's start marker and End log an agent of the same user has without
    reading another process's memory: files in its cwd and in the directories its own worker's,
    the victim's and the supervisor's command lines name (and their parents), and open
    descriptors of the victim and of the supervisor under ``/proc/<pid>/fd``."""
    supervisor = _parent(victim)
    dirs = {os.getcwd()}
    for pid in (os.getpid(), victim, supervisor):
        dirs |= _endpoint_dirs(pid)
    dirs |= {os.path.dirname(d) for d in dirs}
    markers: list[str] = []
    logs: list[str] = []
    for d in sorted(dirs):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            if name.startswith(victim_id + ".") or name.startswith(victim_id + "-"):
                path = os.path.join(d, name)
                (logs if "end" in name else markers).append(path)
    for pid in (victim, supervisor):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if f"{victim_id}-started" in target or f"{victim_id}.started" in target:
                markers.append(f"/proc/{pid}/fd/{fd}")
            elif f"{victim_id}-ends" in target or f"{victim_id}.ends" in target:
                logs.append(f"/proc/{pid}/fd/{fd}")
    return markers, logs


def forge(turn: worker.Turn) -> Any:
    """The attack: find another worker's start marker and End log, append a forged
    ``End(completed, "FORGED")`` for the turn it runs, then SIGKILL that worker so the
    supervisor reads the log. Returns where it forged (empty: found nothing to forge)."""
    victim, victim_id = int(turn.input["victim_pid"]), str(turn.input["victim_id"])
    markers, logs = _candidates(victim, victim_id)
    noted = None
    for path in markers:
        try:
            with open(path, "rb") as f:
                head = f.read(12 + 1024)
        except OSError:
            continue
        (n,) = struct.unpack("<I", head[:4])
        if n:
            noted = head[12 : 12 + n].decode(), struct.unpack("<d", head[4:12])[0]
            break
    forged = []
    if noted is not None:
        turn_id, started_at = noted
        record = wire.encode(worker_link.End(turn_id, "completed", wire.encode_payload("FORGED")))
        for path in logs:
            try:
                with open(path, "r+b") as f:
                    used, _pid = struct.unpack("@II", f.read(8))
                    f.seek(16 + used)
                    f.write(struct.pack("<Id", len(record), started_at) + record)
                    f.seek(0)
                    f.write(struct.pack("@I", used + 12 + len(record)))
            except OSError:
                continue
            forged.append(path)
    os.kill(victim, signal.SIGKILL)
    return {"forged": forged, "marker_found": noted is not None}


def wipe_cwd(turn: worker.Turn) -> Any:
    """``rm -rf ./*``: removes everything it can see in its working directory; returns the names."""
    removed = []
    for name in sorted(os.listdir(".")):
        try:
            if os.path.isdir(name) and not os.path.islink(name):
                shutil.rmtree(name)
            else:
                os.unlink(name)
            removed.append(name)
        except OSError:
            pass
    return {"cwd": os.getcwd(), "removed": removed}


def leave_files(turn: worker.Turn) -> Any:
    """Writes a file and a directory in its working directory; returns where it ran."""
    with open("note.txt", "w") as f:
        f.write("mine")
    os.mkdir("sub")
    return os.getcwd()
