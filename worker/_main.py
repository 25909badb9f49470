"""The worker process's entry point (``python -m worker ...``, started only by the supervisor).

It parses the supervisor's arguments, installs the process guards (``_guards``) before
anything forks, then runs the turn loop (``_loop.serve``) until ``Shutdown``.
"""

from __future__ import annotations

import os
import sys

import anyio

from ._guards import install_process_guards, mark_role
from ._loop import own_files, serve
from .proctree import _tree


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m worker", description="turnpool worker (started by the supervisor)"
    )
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--life-fd", type=int)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--cgroup", help="the cgroup v2 directory this worker joins before it forks anything")
    parser.add_argument("--cwd", default=None, help="directory to run in (this worker's own, WORKER-CWD)")
    parser.add_argument(
        "--marker-fd", type=int, default=-1, help="the start marker's descriptor (SEC-WORKER-FILES)"
    )
    parser.add_argument(
        "--endlog-fd", type=int, default=-1, help="the End log's descriptor (SEC-WORKER-FILES)"
    )
    args = parser.parse_args(argv)
    mark_role("worker")  # API-NO-NESTING: before any agent code can run
    # SEC-WORKER-FILES: before the guardian's fork
    start_marker, endlog = own_files(args.marker_fd, args.endlog_fd)
    if args.cwd:
        os.chdir(args.cwd)  # before any agent is imported or run
    token = os.environ.pop("TURNPOOL_SPAWN_TOKEN", "")  # a worker started by hand (tests)
    if start_marker is not None:
        token = start_marker.take_token() or token  # SEC-WORKER-FILES: not in /proc/<pid>/environ
    marker = os.environ.get(_tree.TREE_ENV)
    if marker:
        _tree.mark_tree(marker)
    install_process_guards(args.parent_pid, args.life_fd, args.cgroup)
    anyio.run(serve, args.endpoint, args.id, token, args.heartbeat, start_marker, endlog, backend="asyncio")
    sys.exit(0)
