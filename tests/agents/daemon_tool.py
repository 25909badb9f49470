"""A tool's hostile side effect for the framework tests: ``leave_daemon(pidfile)`` starts a classic
setsid daemon (``fork → setsid → fork`` in a process of its own, which then exits) and returns its
pid, also written to ``pidfile``. The daemon sleeps until killed; orphaned, it is re-parented to
the worker (the child subreaper), where the end-of-turn sweep finds it.

Run as a script (``python daemon_tool.py PIDFILE``) it is that process; stdlib only."""

from __future__ import annotations

import os
import subprocess
import sys
import time


def leave_daemon(pidfile: str) -> int:
    """Start the daemon (through a process of its own: a framework runs tools in threads, where a
    bare fork is unsafe) and return its pid once ``pidfile`` holds it."""
    subprocess.run([sys.executable, "-P", __file__, pidfile], check=True, timeout=60)
    with open(pidfile) as f:
        return int(f.read())


def _daemon(pidfile: str) -> None:
    if os.fork() != 0:
        os._exit(0)  # the first child: the daemon's parent goes, the daemon is orphaned
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    tmp = pidfile + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, pidfile)  # appears whole
    os.closerange(0, 3)
    while True:
        time.sleep(3600)  # allowed: the daemon's own life, the case under test


if __name__ == "__main__":
    pid = os.fork()
    if pid == 0:
        _daemon(sys.argv[1])
    os.waitpid(pid, 0)
    while not os.path.exists(sys.argv[1]):  # the daemon writes it at once
        time.sleep(0.001)  # allowed: a bounded wait for the daemon's own write (run() times out)
