"""JOURNAL-ONE-DAEMON: one live daemon per journal, whatever the network namespace, link or mount that reaches
it.

A second ``turnpool serve`` is started on the journal of a live daemon that has a turn running and
one queued: from another network namespace (``unshare --net``: a second container sharing the
volume), through a hard link, through a symlink from another namespace, and through a bind mount in
another mount and network namespace. Each is refused with one line; the live daemon's turns are
unharmed (nothing ran twice, nothing ended). After a SIGKILL of the live daemon a new one, from
another namespace, starts at once and recovers the journal. The agents count their own runs
(``tests/agents/journal.py``), so "ran twice" is counted, not inferred.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from supervisor import Client, DaemonAlreadyRunning
from supervisor.journal import Journal, JournalError, read_history
from supervisor.journal import lock as journal_lock
from tests.support import daemonkit
from tests.support.daemonkit import FAST, Served, short_dir, start, stop_process

pytestmark = pytest.mark.anyio

AGENT = "tests.agents.journal:count"
NETNS = ("unshare", "--net", "--")


def _unshare_works() -> str | None:
    """Why this machine cannot make a network and mount namespace here, or ``None`` when it can."""
    try:
        done = subprocess.run(
            ["unshare", "--net", "--mount", "--", "true"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare cannot run: {exc}"
    return None if done.returncode == 0 else f"unshare --net --mount is not permitted: {done.stderr.strip()}"


def _serve(prefix: tuple[str, ...], home: Path, name: str, journal: Path) -> subprocess.Popen[bytes]:
    """``turnpool serve`` on ``journal`` run under ``prefix`` (a namespace), on its own endpoint."""
    argv = daemonkit.turnpool_argv(
        "serve",
        "--path",
        daemonkit.ROOT,
        *FAST,
        "--journal",
        str(journal),
        "--endpoint",
        f"ipc://{home}/{name}",
    )
    with open(home / f"{name}.err", "wb") as err:
        return subprocess.Popen(
            [*prefix, *argv],
            env=daemonkit.env_for(home, None),
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )


def _refused(prefix: tuple[str, ...], home: Path, name: str, journal: Path) -> str:
    """Start a second daemon; it must exit 1 without ever being ready. Its one line of stderr."""
    proc = _serve(prefix, home, name, journal)
    try:
        line = daemonkit._read_line(proc, daemonkit.READY_TIMEOUT)  # "" at its exit (or the bound)
        assert not line.startswith(daemonkit.READY_PREFIX), f"a second daemon served the live journal: {line}"
        assert proc.wait(timeout=60) == 1
    finally:
        stop_process(proc)
    lines = (home / f"{name}.err").read_text().strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _runs(log: Path) -> collections.Counter[str]:
    return collections.Counter(log.read_text().split()) if log.exists() else collections.Counter()


async def test_a_second_daemon_is_refused_across_namespaces_links_and_mounts() -> None:
    """JOURNAL-ONE-DAEMON: with a daemon live on a journal (one turn running, one queued), a second daemon on
    that journal from another network namespace, through a hard link, through a symlink from another
    namespace, and through a bind mount in another mount+network namespace is refused with one line ("locked
    by another live daemon"); the running turn keeps running, nothing ran twice. After a SIGKILL of the live
    daemon (its writer dies with it), a daemon in another namespace starts and recovers: the running turn ends
    ``crashed``, every acknowledged turn ends once, none ran twice. Before the fix the namespaced daemon
    started, recovered the live journal and ran the queued turn."""
    why = _unshare_works()
    if why is not None:
        pytest.skip(why)
    home = short_dir()
    jdir, bound = home / "j", home / "bound"
    jdir.mkdir(mode=0o700)
    bound.mkdir(mode=0o700)
    journal, log = jdir / "journal.sqlite3", home / "runs.log"
    first = start(*FAST, "--workers", "1", "--journal", str(journal), home=home)
    later: Served | None = None
    try:
        async with Client.connect(first.endpoint) as client:
            running = await client.submit(AGENT, {"log": str(log), "ms": 600_000})
            with anyio.fail_after(60):
                while running.turn_id not in _runs(log):  # noqa: ASYNC110 - a file: no event to wait on
                    await anyio.sleep(0.02)  # allowed: polling the agent's own log until it runs, bounded
            queued = await client.submit(AGENT, {"log": str(log)})
            (jdir / "link.sqlite3").hardlink_to(journal)
            (jdir / "sym.sqlite3").symlink_to(journal)
            bind = (
                "unshare",
                "--net",
                "--mount",
                "--",
                "sh",
                "-c",
                'mount --bind "$0" "$1" && shift && exec "$@"',
            )
            attempts: list[tuple[tuple[str, ...], str, Path]] = [
                (NETNS, "netns.sock", journal),
                ((), "link.sock", jdir / "link.sqlite3"),
                (NETNS, "sym.sock", jdir / "sym.sqlite3"),
                ((*bind, str(jdir), str(bound)), "bind.sock", bound / "journal.sqlite3"),
            ]
            for prefix, name, path in attempts:
                line = _refused(prefix, home, name, path)
                assert "locked by another live daemon" in line and str(path) in line, (name, line)
            status = await client.status()
            assert status["running"] == 1 and status["queue"] == 1, status
            assert _runs(log) == {running.turn_id: 1}
        writers = [
            p for p in psutil.Process(first.pid).children() if "journal/writer.py" in " ".join(p.cmdline())
        ]
        assert len(writers) == 1, writers
    finally:
        first.proc.kill()
        first.proc.wait(timeout=30)
        stop_process(first.proc)
    # The kernel releases the lock once the daemon and its writer (killed by its parent-death signal)
    # are gone: wait for that event, bounded, then start the next daemon from another namespace.
    _, alive = psutil.wait_procs(writers, timeout=30)
    assert alive == []
    proc = _serve(NETNS, home, "after.sock", journal)
    line = daemonkit._read_line(proc, daemonkit.READY_TIMEOUT)
    try:
        assert line.startswith(daemonkit.READY_PREFIX), (line, (home / "after.sock.err").read_text())
        later = Served(proc, f"ipc://{home}/after.sock", daemonkit.env_for(home, None), home, line)
        async with Client.connect(later.endpoint) as client:
            with anyio.fail_after(60):
                ended = await client.handle(running.turn_id).result()
                other = await client.handle(queued.turn_id).result()
        assert ended.outcome == "crashed" and ended.error is not None and ended.error.type == "SupervisorLost"
        assert other.outcome in ("completed", "crashed"), other
        stop_process(proc)
        runs = _runs(log)
        assert max(runs.values()) == 1, runs  # nothing ran twice
        assert runs[running.turn_id] == 1 and runs[queued.turn_id] == (other.outcome == "completed")
        states = {r["turn_id"]: r["state"] for r in read_history(journal, limit=10)}
        assert states == {running.turn_id: "ended", queued.turn_id: "ended"}, states
    finally:
        stop_process(proc)
        shutil.rmtree(home, ignore_errors=True)


def test_the_lock_survives_the_daemons_own_sqlite_connections_closing(tmp_path: Path) -> None:
    """JOURNAL-ONE-DAEMON: a classic POSIX lock is dropped when its process closes *any* descriptor of the
    file, as SQLite does all the time; the journal's OFD lock is not. With a journal open here, SQLite
    connections to it opened and closed in this process, and the file reached through a hard link, a lock
    attempt from another process (another network namespace when permitted) is still refused."""
    import sqlite3

    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    try:
        for _ in range(3):
            con = sqlite3.connect(path)
            con.execute("SELECT COUNT(*) FROM turns").fetchone()
            con.close()
        (tmp_path / "link.sqlite3").hardlink_to(path)
        probe = (
            "import sys; from supervisor.journal import lock as j; from pathlib import Path\n"
            "try:\n    j.lock_file(Path(sys.argv[1]))\n"
            "except j.JournalLocked as e:\n    print(e); sys.exit(3)\n"
        )
        prefix = NETNS if _unshare_works() is None else ()
        done = subprocess.run(
            [*prefix, sys.executable, "-c", probe, str(tmp_path / "link.sqlite3")],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=daemonkit.ROOT,
        )
        assert done.returncode == 3, (done.stdout, done.stderr)
        assert "locked by another live daemon" in done.stdout
    finally:
        journal.close()
    os.close(journal_lock.lock_file(path))  # free again once the journal is closed


def test_a_lock_refusal_is_both_a_journal_error_and_daemon_already_running(tmp_path: Path) -> None:
    """The error a second daemon's caller catches: ``DaemonAlreadyRunning`` (and ``JournalError``)."""
    path = tmp_path / "j.sqlite3"
    journal = Journal.open(path)
    try:
        with pytest.raises(DaemonAlreadyRunning, match="locked by another live daemon"):
            Journal.open(path)
        with pytest.raises(JournalError, match="locked by another live daemon"):
            Journal.open(tmp_path / "j.sqlite3")
    finally:
        journal.close()


def test_a_filesystem_that_cannot_lock_is_refused_in_one_line(tmp_path: Path, monkeypatch: Any) -> None:
    """JOURNAL-ONE-DAEMON: where the filesystem cannot take the lock (``ENOLCK``: NFS without its lock
    service; ``EINVAL``: no OFD locks), the journal is refused with one line saying why, and nothing is left
    open or running."""
    real = fcntl.fcntl

    def no_locks(fd: int, cmd: int, arg: Any = 0) -> Any:
        if cmd == fcntl.F_OFD_SETLK:
            raise OSError(errno.ENOLCK, "No locks available")
        return real(fd, cmd, arg)

    monkeypatch.setattr(journal_lock.fcntl, "fcntl", no_locks)
    with pytest.raises(JournalError) as raised:
        Journal.open(tmp_path / "j.sqlite3")
    message = str(raised.value)
    assert "cannot lock files" in message and "\n" not in message
    assert not isinstance(raised.value, DaemonAlreadyRunning)
    monkeypatch.undo()
    Journal.open(tmp_path / "j.sqlite3").close()  # the abstract socket was released too


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_journal_path_that_is_not_a_file_is_refused_at_once(kind: str) -> None:
    """A FIFO or a directory given as ``serve --journal`` is refused at start with one line saying what
    is wrong, exit 1 (it was "disk I/O error"); the FIFO is opened without blocking."""
    home = short_dir()
    try:
        path = home / "journal"
        if kind == "fifo":
            os.mkfifo(path, 0o600)
        else:
            path.mkdir(mode=0o700)
        done = subprocess.run(
            daemonkit.turnpool_argv(
                "serve", *FAST, "--journal", str(path), "--endpoint", f"ipc://{home}/s.sock"
            ),
            env=daemonkit.env_for(home, None),
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert f"journal {path} is not a regular file" in lines[0], lines[0]
    finally:
        shutil.rmtree(home, ignore_errors=True)
