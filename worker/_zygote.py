"""The zygote: a preloaded process that forks workers on request.

A fresh ``python -m worker`` costs ≈ 50 ms of interpreter start and imports (far more on a
loaded machine); a fork of a process that already imported the worker stack (and any agent
modules named with ``--preload``) is ready in a few milliseconds. The supervisor starts one
zygote and asks it for workers over a pipe.

Rules it keeps (see PITFALLS):

* it never creates a ZeroMQ context and starts no thread, so forking it is safe; each worker
  makes its own context after the fork;
* each worker is double-forked: an intermediate child forks it and exits, so the worker is
  re-parented to the supervisor (a child subreaper), which reaps it by pid like any worker;
  only then does the worker arm its parent-death signal (tied to its parent *thread*), so
  the signal follows the supervisor, not the short-lived intermediate. WORKER-FORK-BATCH: the
  requests read in one go (a pool starting, up to ``FORK_BATCH``) share one intermediate;
* TREE-WATCHER: it forks one watcher (``_watcher``) after its imports; each worker registers with it
  instead of forking a guardian of its own;
* the worker calls ``setsid`` (it leads its own session and group, like a spawned worker), sets
  its tree markers (environment for exec'd descendants, an inherited memfd for fork-only ones:
  see ``_tree``) and, with ``--cgroup-pool``, joins ``<pool>/<worker id>`` before it forks
  anything but its guardian;
* the zygote dies with the supervisor: parent-death ``SIGKILL`` plus EOF on its request pipe.

To take the forks off the critical path, the zygote keeps one *embryo* ready: a grandchild
already re-parented to the supervisor, waiting on a private pipe for its assignment. A request
is then one pipe write away from a worker; the next embryo is prepared once requests pause.
An embryo whose zygote dies sees EOF on that pipe and exits.

Protocol: the supervisor sends ``"<id> <token> <marker> <heartbeat>"`` as one message on a unix
seqpacket socket, with four or five fds attached (``SCM_RIGHTS``): the worker's output, which it makes
its fd 1 and fd 2, so no worker shares the zygote's (or the supervisor's) output; its start marker and
End log, which it maps and closes (SEC-WORKER-FILES); its own working directory, which it enters
(WORKER-CWD); and, where the supervisor made one, its tree's proof page, which it maps before it
forks anything (LADDER-PROOF). The answer on the response pipe is ``"<id> <pid>\\n"``. ``"embryo <pid>\\n"``
announces an embryo (a child of the supervisor it must reap if it is never assigned); ``"ready 0\\n"`` says
the imports are done.

ADAPT-PROBE: ``"probe <deadline> <agent>"`` with one fd attached (a pipe's write end) forks a probe
(``_probe``), a direct child of the zygote in a group of its own, that classifies the agent and
answers on that pipe; the zygote reaps it, and kills its group once it has exited or once the
deadline (``time.monotonic``, system-wide) has passed. A request read past its deadline is dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import signal
import socket
import sys
import time

_CGROUP_POOL: str | None = None  # --cgroup-pool: workers join <pool>/<worker id>
_WATCHER_FD = -1  # TREE-WATCHER: the registration socket of the pool's watcher (inherited by workers)


def _reap(pid: int) -> None:
    """Wait for the intermediate child ``pid`` (it exits at once, having forked the worker)."""
    while True:
        try:
            os.waitpid(pid, 0)
            return
        except InterruptedError:
            continue
        except ChildProcessError:
            return


def _preload(modules: list[str]) -> None:
    # The worker stack itself: everything a worker imports before its first turn.
    import anyio._backends._asyncio
    import anyio.lowlevel  # noqa: F401 - anyio.run imports it lazily; pay it here once
    import msgspec  # noqa: F401
    import zmq
    import zmq.asyncio  # noqa: F401

    import wire  # noqa: F401

    from . import _load_all  # (the guards and the turn loop come with the settle run below)

    _load_all()  # WORKER-LAZY: every public name of ``worker``, so that no worker imports one after its fork
    import ctypes.util  # noqa: F401 - and what the process-tree code imports only where it needs it

    import psutil  # noqa: F401

    # WORKER-SETTLE: run the worker's own paths (an event loop, timers, the warm-up turn) here, so that
    # their code is specialised once instead of in every worker; this starts no thread, so the
    # zygote stays safe to fork.
    from ._settle import warm

    warm()
    from .proctree import _proof, _tree  # noqa: F401 - _proof: LADDER-PROOF, carried by each worker

    _tree._prctl(0, 0)  # loads libc once (PR_GET_... no-op: option 0 is invalid and harmless)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a bad preload must not stop the pool; the turn reports it
            print(
                f"turnpool zygote: could not preload {name!r}: {type(exc).__name__}: {exc}", file=sys.stderr
            )


def _take_output(out_fd: int) -> None:
    """Make ``out_fd`` (the worker's own pipe or log, from the supervisor) our stdout and stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    if out_fd > 2:
        os.close(out_fd)


def _become_worker(
    parent_pid: int,
    life_fd: int,
    endpoint: str,
    worker_id: str,
    token: str,
    marker: str,
    heartbeat: float,
    fds: list[int],
    reparented: bool = False,
    release_fd: int = -1,
) -> None:
    """In the grandchild: wait to be re-parented to the supervisor, then run the worker. ``fds``:
    its output, start marker, End log and working directory, from the request; ``release_fd``: the
    pipe that reads EOF once the intermediate child that forked us has exited (WORKER-FORK-BATCH)."""
    from . import _guards, _loop
    from .proctree import _tree

    out_fd, marker_fd, endlog_fd, cwd_fd = fds[:4]
    _take_output(out_fd)
    _guards.mark_role("worker")  # API-NO-NESTING
    own = _loop.own_files(marker_fd, endlog_fd)  # SEC-WORKER-FILES: before the guardian's fork
    if own[0] is not None:
        own[0].take_token()  # (ours came with the request: erase the copy the supervisor left there)
    os.fchdir(cwd_fd)  # WORKER-CWD: its own directory, before any agent code
    os.close(cwd_fd)
    _loop.OWN_DIR = os.getcwd()  # WORKER-CWD: an idle worker's quick exit removes it when it is empty
    if not reparented:
        os.setsid()
    # putenv alone would not do: a child forked without exec keeps the environment block this
    # process image was exec'd with (the zygote's). The memfd marker is inherited by any fork.
    _tree.mark_tree(marker)
    if len(fds) > 4:
        from .proctree import _proof

        _proof.carry(fds[4])  # LADDER-PROOF: every fork of this worker maps it from now on
    if release_fd >= 0:
        from ._guardian import wait_eof

        wait_eof(release_fd)  # the intermediate that forked us has exited (WORKER-FORK-BATCH)
        os.close(release_fd)
    _await_reparent(parent_pid)
    try:
        cgroup = os.path.join(_CGROUP_POOL, worker_id) if _CGROUP_POOL else None
        _guards.install_process_guards(parent_pid, life_fd, cgroup, watcher_fd=_WATCHER_FD)
        import anyio

        # WORKER-QUICK-EXIT: a forked worker ends with os._exit whatever happens: nothing of the
        # graceful teardown is kept past it.
        anyio.run(_loop.serve, endpoint, worker_id, token, heartbeat, *own, True, backend="asyncio")
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


def _await_reparent(parent_pid: int) -> None:
    """Return once our parent is the supervisor; exit if we were re-parented anywhere else (the
    supervisor is gone) or nothing happened for 5 s. The intermediate child exits right after its
    forks; until then it is our parent (a worker of a batch has seen its release pipe's EOF, which
    comes a moment before the intermediate's exit re-parents us)."""
    deadline = time.monotonic() + 5.0
    first = os.getppid()
    while (ppid := os.getppid()) != parent_pid:
        if ppid != first or ppid == 1 or time.monotonic() > deadline:
            os._exit(70)
        time.sleep(0.0001)


REQUEST_FDS = 5  # output, start marker, End log, working directory, and the tree's proof page if made
EMBRYO_IDLE = 0.01  # prepare the next embryo once requests have paused this long (s)


def _embryo(parent_pid: int, life_fd: int, endpoint: str, assign: socket.socket) -> None:
    """In a grandchild made ahead of time: wait for re-parenting, then for an assignment."""
    from .proctree import _tree

    os.setsid()
    _await_reparent(parent_pid)
    # Until assigned it has no tree to clean: it simply dies with the supervisor.
    _tree.set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(70)
    data, fds, _, _ = socket.recv_fds(assign, 4096, REQUEST_FDS)
    if not data or len(fds) not in (REQUEST_FDS - 1, REQUEST_FDS):
        os._exit(0)  # the zygote is gone: never assigned
    assign.close()
    worker_id, token, marker, heartbeat = data.decode().strip().split(" ")
    _tree.set_parent_death_signal(0)
    _become_worker(
        parent_pid, life_fd, endpoint, worker_id, token, marker, float(heartbeat), fds, reparented=True
    )


def _prepare_embryo(
    parent_pid: int, life_fd: int, endpoint: str, req_fd: int, resp_fd: int
) -> tuple[int, socket.socket] | None:
    """Fork an embryo; returns (its pid, our end of its assignment socket)."""
    er, ew = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pr, pw = os.pipe()
    try:
        mid = os.fork()
    except OSError:
        for fd in (pr, pw):
            os.close(fd)
        er.close()
        ew.close()
        return None
    if mid == 0:
        try:
            ew.close()
            os.close(pr)
            os.close(req_fd)
            pid = os.fork()
            if pid == 0:
                os.close(pw)
                os.close(resp_fd)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _embryo(parent_pid, life_fd, endpoint, er)
                os._exit(1)  # not reached
            os.write(resp_fd, f"embryo {pid}\n".encode())
            os.write(pw, f"{pid}\n".encode())
        finally:
            os._exit(0)
    er.close()
    os.close(pw)
    _reap(mid)
    data = os.read(pr, 64)
    os.close(pr)
    try:
        return int(data.strip()), ew
    except ValueError:
        ew.close()
        return None


PROBE_TICK = 0.05  # how often pending probes are looked at (s)


def _tend_probes(probes: dict[int, float]) -> None:
    """Reap the probes that exited and kill the group of each (what its import started) and of
    each probe past its deadline."""
    now = time.monotonic()
    for pid, deadline in list(probes.items()):
        try:
            # WNOWAIT: a zombie still holds its pid, hence its group id, until it is reaped below.
            exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            del probes[pid]
            continue
        if not exited and now <= deadline:
            continue
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        _reap(pid)
        del probes[pid]


def _fork_probe(
    line: bytes,
    fds: list[int],
    probes: dict[int, float],
    embryo: tuple[int, socket.socket] | None,
    own: tuple[int, int],
) -> None:
    """ADAPT-PROBE: fork a probe answering on ``fds[0]`` (the caller closes it)."""
    _, deadline_text, spec = line.decode().split(" ")
    deadline = float(deadline_text)
    if time.monotonic() > deadline:
        return  # nobody waits for the answer any more
    pid = os.fork()
    if pid == 0:
        try:
            # The supervisor, the embryo and the watcher must see EOF when the zygote goes, not
            # when we do.
            for fd in (*own, _WATCHER_FD):
                if fd >= 0:
                    os.close(fd)
            if embryo is not None:
                embryo[1].close()
            from . import _probe as probe

            probe.run(spec, fds[0])
        finally:
            os._exit(1)
    probes[pid] = deadline


FORK_BATCH = 16  # WORKER-FORK-BATCH: at most this many workers forked by one intermediate child


def _readable(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])


def serve(parent_pid: int, life_fd: int, endpoint: str, req_fd: int, resp_fd: int) -> None:
    import select

    req = socket.socket(fileno=req_fd)
    os.write(resp_fd, b"ready 0\n")
    embryo: tuple[int, socket.socket] | None = None
    probes: dict[int, float] = {}  # ADAPT-PROBE: pid -> deadline
    batch: list[_Request] = []  # WORKER-FORK-BATCH: requests read, their workers not forked yet
    while True:
        if probes:
            _tend_probes(probes)
        if batch and (len(batch) >= FORK_BATCH or not _readable(req_fd)):
            _fork_workers(parent_pid, life_fd, endpoint, resp_fd, req_fd, batch)
            batch = []
            continue
        if embryo is None and not batch:
            # Requests come in bursts (pool start, a kill): make the next embryo once they pause.
            ready, _, _ = select.select([req_fd], [], [], EMBRYO_IDLE)
            if not ready:
                embryo = _prepare_embryo(parent_pid, life_fd, endpoint, req_fd, resp_fd)
                continue
        elif probes and not batch:
            ready, _, _ = select.select([req_fd], [], [], PROBE_TICK)
            if not ready:
                continue
        line, fds, _, _ = socket.recv_fds(req, 4096, REQUEST_FDS)
        if batch and (not line or line.startswith(b"probe ")):
            # What was asked before goes first; a probe (agent code) never holds another worker's files.
            _fork_workers(parent_pid, life_fd, endpoint, resp_fd, req_fd, batch)
            batch = []
        if not line:
            if _WATCHER_FD >= 0 and os.getppid() == parent_pid:
                from . import _watcher

                _watcher.goodbye(_WATCHER_FD)  # TREE-WATCHER: a close, not a death
            return  # EOF: the supervisor closed the socket (or died); an embryo sees EOF too
        if line.startswith(b"probe "):
            try:
                if len(fds) == 1:
                    _fork_probe(line, fds, probes, embryo, (req_fd, resp_fd))
            except (ValueError, OSError):
                pass  # a malformed request, or no fork: the supervisor reads EOF (no answer)
            finally:
                for fd in fds:
                    os.close(fd)
            continue
        try:
            worker_id, token, marker, heartbeat = line.decode().split(" ")
            request = _Request(worker_id, token, marker, float(heartbeat), fds)
            if len(fds) not in (REQUEST_FDS - 1, REQUEST_FDS):
                raise ValueError("a request carries the worker's output, marker, End log, cwd (and proof)")
        except ValueError:
            for fd in fds:
                os.close(fd)
            continue
        if embryo is not None:
            pid, ew = embryo
            embryo = None
            try:
                socket.send_fds(ew, [line], fds)
                os.write(resp_fd, f"{worker_id} {pid}\n".encode())
                request.close()  # the worker has its own copies now
                continue
            except OSError:
                pass  # the embryo died: fork one the direct way
            finally:
                ew.close()
        batch.append(request)


class _Request:
    """One worker asked for: its id, token, tree marker, heartbeat and its descriptors."""

    __slots__ = ("fds", "heartbeat", "marker", "token", "worker_id")

    def __init__(self, worker_id: str, token: str, marker: str, heartbeat: float, fds: list[int]) -> None:
        self.worker_id, self.token, self.marker, self.heartbeat, self.fds = (
            worker_id,
            token,
            marker,
            heartbeat,
            fds,
        )

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def _fork_workers(
    parent_pid: int, life_fd: int, endpoint: str, resp_fd: int, req_fd: int, batch: list[_Request]
) -> None:
    """WORKER-FORK-BATCH: one intermediate child forks every worker of ``batch``, reports their pids
    and exits, so that they are all re-parented to the supervisor at once: a fork per worker and one
    intermediate's fork and exit per batch, not two forks and an exit per worker. Each worker holds
    only its own request's descriptors, and waits for the intermediate's exit on a pipe only it
    held (``release``) instead of polling for its re-parenting. Closes the batch's descriptors."""
    try:
        try:
            mid = os.fork()
        except OSError as exc:
            os.write(resp_fd, "".join(f"{r.worker_id} -{exc.errno or 1}\n" for r in batch).encode())
            return
        if mid == 0:
            reported = 0
            try:
                os.close(req_fd)
                release_r, release_w = os.pipe()
                for i, request in enumerate(batch):
                    try:
                        pid = os.fork()
                    except OSError as exc:
                        pid = -(exc.errno or 1)
                    if pid == 0:
                        os.close(release_w)
                        os.close(resp_fd)
                        for other in batch:
                            if other is not request:
                                other.close()
                        signal.signal(signal.SIGTERM, signal.SIG_DFL)
                        _become_worker(
                            parent_pid,
                            life_fd,
                            endpoint,
                            request.worker_id,
                            request.token,
                            request.marker,
                            request.heartbeat,
                            request.fds,
                            release_fd=release_r,
                        )
                        os._exit(1)  # not reached
                    os.write(resp_fd, f"{request.worker_id} {pid}\n".encode())
                    reported = i + 1
            except BaseException:  # noqa: BLE001
                os.write(resp_fd, "".join(f"{r.worker_id} -1\n" for r in batch[reported:]).encode())
            finally:
                os._exit(0)  # the release pipe's write end goes with us: the workers go on
        _reap(mid)
    finally:
        for request in batch:
            request.close()  # the workers have their own copies now


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m worker._zygote", description="turnpool zygote (started by the supervisor)"
    )
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--life-fd", type=int, required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--req-fd", type=int, required=True)
    parser.add_argument("--resp-fd", type=int, required=True)
    parser.add_argument("--preload", default="")
    parser.add_argument(
        "--cgroup-pool", default="", help="cgroup v2 pool directory; each worker joins <pool>/<worker id>"
    )
    parser.add_argument("--cwd", default=None, help="directory to run in (the pool's work directory)")
    args = parser.parse_args(argv)
    from ._guards import mark_role

    mark_role("zygote")  # API-NO-NESTING: before any preload runs; the workers it forks inherit it
    global _CGROUP_POOL
    _CGROUP_POOL = args.cgroup_pool or None
    from .proctree import _tree

    if args.cwd:
        os.chdir(args.cwd)  # before any preload: the forked workers inherit it

    _tree.set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != args.parent_pid:
        os._exit(0)
    _preload([m for m in args.preload.split(",") if m])
    if len(os.listdir("/proc/self/task")) != 1:
        # Something started a thread: forking now would be unsafe. Refuse; the supervisor falls
        # back to fresh interpreters when the zygote is gone.
        print("turnpool zygote: a thread is running after preload; not forking", file=sys.stderr)
        os._exit(3)
    global _WATCHER_FD
    try:
        # TREE-WATCHER: one watcher for every worker forked from here, forked once, after the imports.
        from . import _watcher

        watcher_pid, _WATCHER_FD = _watcher.start(args.life_fd)
        os.write(args.resp_fd, f"watcher {watcher_pid}\n".encode())
    except OSError as exc:
        print(f"turnpool zygote: no watcher ({exc}); each worker forks its guardian", file=sys.stderr)
    # WORKER-SHARED-HEAP: what the imports built is never collected again, here or in a worker.
    gc.freeze()
    serve(args.parent_pid, args.life_fd, args.endpoint, args.req_fd, args.resp_fd)
    os._exit(0)


if __name__ == "__main__":
    main()
