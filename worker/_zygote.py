"""The zygote: a preloaded process that forks workers on request.

A fresh ``python -m worker`` costs ≈ 50 ms of interpreter start and imports (far more on a
loaded machine); a fork of a process that already imported the worker stack (and any agent
modules named with ``--preload``) is ready in a few milliseconds. The supervisor starts one
zygote and asks it for workers over a pipe.

Rules it keeps (see PITFALLS):

* it never creates a ZeroMQ context and starts no thread, so forking it is safe; each worker
  makes its own context after the fork;
* each worker is double-forked: the intermediate child exits at once, so the worker is
  re-parented to the supervisor (a child subreaper), which reaps it by pid like any worker;
  only then does the worker arm its parent-death signal (tied to its parent *thread*), so
  the signal follows the supervisor, not the short-lived intermediate;
* the worker calls ``setsid`` (it leads its own session and group, like a spawned worker) and
  exports the tree marker in its environment for its descendants;
* the zygote dies with the supervisor: parent-death ``SIGKILL`` plus EOF on its request pipe.

Protocol, one line each way: the supervisor writes ``"<id> <token> <marker> <heartbeat>\\n"``;
the intermediate child answers ``"<id> <pid>\\n"`` on the response pipe. The zygote writes
``"ready 0\\n"`` once its imports are done.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time

TREE_ENV = "TURNPOOL_TREE"


def _preload(modules: list[str]) -> None:
    # The worker stack itself: everything a worker imports before its first turn.
    import anyio
    import anyio._backends._asyncio  # noqa: F401 - anyio.run imports it lazily; pay it here once
    import msgspec  # noqa: F401
    import zmq  # noqa: F401
    import zmq.asyncio  # noqa: F401

    import wire  # noqa: F401

    from . import _main  # noqa: F401

    del anyio
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a bad preload must not stop the pool; the turn will report it
            print(f"turnpool zygote: could not preload {name!r}: {type(exc).__name__}: {exc}", file=sys.stderr)


def _become_worker(
    parent_pid: int, life_fd: int, endpoint: str, worker_id: str, token: str, marker: str, heartbeat: float
) -> None:
    """In the grandchild: wait to be re-parented to the supervisor, then run the worker."""
    from . import _main

    os.setsid()
    os.environ[TREE_ENV] = marker
    deadline = time.monotonic() + 5.0
    while os.getppid() != parent_pid:
        # The intermediate child exits right after the fork; until then it is our parent.
        if time.monotonic() > deadline or os.getppid() == 1:
            os._exit(70)  # the supervisor is gone (or we were not re-parented to it)
        time.sleep(0.0001)
    try:
        _main.install_process_guards(parent_pid, life_fd)
        import anyio

        anyio.run(_main.serve, endpoint, worker_id, token, heartbeat, backend="asyncio")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve(parent_pid: int, life_fd: int, endpoint: str, req_fd: int, resp_fd: int) -> None:
    reader = os.fdopen(req_fd, "rb", buffering=0)
    buf = b""
    os.write(resp_fd, b"ready 0\n")
    while True:
        try:
            chunk = reader.read(4096)
        except InterruptedError:
            continue
        if not chunk:
            return  # EOF: the supervisor closed the pipe (or died)
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                worker_id, token, marker, heartbeat = line.decode().split(" ")
                hb = float(heartbeat)
            except ValueError:
                continue
            _fork_worker(parent_pid, life_fd, endpoint, resp_fd, worker_id, token, marker, hb, req_fd)


def _fork_worker(
    parent_pid: int, life_fd: int, endpoint: str, resp_fd: int, worker_id: str, token: str, marker: str,
    heartbeat: float, req_fd: int,
) -> None:
    try:
        mid = os.fork()
    except OSError as exc:
        os.write(resp_fd, f"{worker_id} -{exc.errno or 1}\n".encode())
        return
    if mid == 0:
        # Intermediate child: fork the worker, report its pid, exit so it is re-parented.
        try:
            os.close(req_fd)
            pid = os.fork()
            if pid == 0:
                os.close(resp_fd)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _become_worker(parent_pid, life_fd, endpoint, worker_id, token, marker, heartbeat)
                os._exit(1)  # not reached
            os.write(resp_fd, f"{worker_id} {pid}\n".encode())
        except BaseException:  # noqa: BLE001
            os.write(resp_fd, f"{worker_id} -1\n".encode())
        finally:
            os._exit(0)
    while True:
        try:
            os.waitpid(mid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            break


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker._zygote", description="turnpool zygote (started by the supervisor)")
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--life-fd", type=int, required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--req-fd", type=int, required=True)
    parser.add_argument("--resp-fd", type=int, required=True)
    parser.add_argument("--preload", default="")
    args = parser.parse_args(argv)
    from . import _tree

    _tree.set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != args.parent_pid:
        os._exit(0)
    _preload([m for m in args.preload.split(",") if m])
    serve(args.parent_pid, args.life_fd, args.endpoint, args.req_fd, args.resp_fd)
    os._exit(0)


if __name__ == "__main__":
    main()
