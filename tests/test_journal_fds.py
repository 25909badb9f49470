"""WORKER-FD-RETRY for the journal: a writer that cannot be restarted for want of file descriptors is counted,
and its rows are written once descriptors are free again (JOURNAL-UNAVAILABLE's retry), in a process of its
own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.daemonkit import ROOT

SCRIPT = textwrap.dedent(
    """
    import json, os, resource, sys, threading, time
    import psutil
    from supervisor.journal import Journal

    PROBE = "INSERT OR REPLACE INTO health (id, at) VALUES (1, ?)"
    journal = Journal.open(sys.argv[1], retry_interval=0.05)
    first = threading.Event()
    journal.write(PROBE, [(1.0,)], first.set)
    assert first.wait(30), "the first row was never committed"
    writer = psutil.Process().children()[0]
    writer.kill()
    writer.wait(10)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = len(os.listdir("/proc/self/fd"))  # one of them is listdir's own, closed again
    resource.setrlimit(resource.RLIMIT_NOFILE, (used, hard))  # a new writer needs a socket pair: EMFILE
    second = threading.Event()
    journal.write(PROBE, [(2.0,)], second.set)
    deadline = time.monotonic() + 30
    while journal.fd_shortage == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # allowed: bounded poll of a counter the journal's thread sets
    counted, written_short = journal.fd_shortage, second.is_set()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    written = second.wait(30)
    journal.close(10)
    print(json.dumps({"counted": counted, "written_short": written_short, "written": written}))
    """
)


def test_a_journal_writer_that_finds_no_descriptor_is_counted_and_retried(tmp_path: Path) -> None:
    """The writer dies; restarting it meets EMFILE: the failure is counted (``fd_shortage``, shown as
    ``status()["daemon"]["fds"]`` shortages ``journal`` by a daemon), nothing is written meanwhile,
    and once descriptors are free the row is committed."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "journal.db")],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    seen = json.loads(done.stdout.decode().splitlines()[-1])
    assert seen == {"counted": seen["counted"], "written_short": False, "written": True}, seen
    assert seen["counted"] >= 1, seen
