"""The supervisor's handle on the zygote (``worker._zygote``): start it, ask it for workers,
collect their pids, stop it.

A worker forked by the zygote is re-parented to the supervisor (a child subreaper), so it is
watched (pidfd), signalled and reaped by pid exactly like a spawned one.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterable

from . import procs as _procs


# WORKER-ZYGOTE: workers are forked from a zygote, and stay ours.
class Zygote:
    def __init__(self, pid: int, req: socket.socket, resp_r: int) -> None:
        self.pid = pid
        self.fd = _procs.pidfd(pid)
        self._req: socket.socket | None = req
        self.resp_fd = resp_r
        self._buf = b""
        self.ready = False
        self.lost = False
        self.embryos: set[int] = set()  # pre-forked, not yet assigned: our children to reap at the end

    @classmethod
    def start(
        cls,
        *,
        endpoint: str,
        life_fd: int,
        python: str | None,
        extra_args: Iterable[str],
        preload: Iterable[str],
        out_fd: int,
        cwd: str,
        pythonpath: str,
        cgroup_pool: str | None = None,
    ) -> Zygote:
        # Requests go over a unix seqpacket socket, not a pipe: each one carries the worker's
        # output fd (``socket.send_fds``), one message per request.
        req, req_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        req.setblocking(False)
        # A burst of requests (a large pool starting) must not find the socket full: a full one
        # reads as a zygote that stopped reading, and workers then start as fresh interpreters.
        req.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 2**20)
        resp_r, resp_w = os.pipe()
        os.set_blocking(resp_r, False)
        req_r = req_child.detach()
        os.set_inheritable(req_r, True)
        os.set_inheritable(resp_w, True)
        exe = python or sys.executable
        argv = [
            exe,
            *_procs.SAFE_FLAGS,
            *extra_args,
            "-m",
            "worker._zygote",
            "--parent-pid",
            str(os.getpid()),
            "--life-fd",
            str(life_fd),
            "--endpoint",
            endpoint,
            "--req-fd",
            str(req_r),
            "--resp-fd",
            str(resp_w),
            "--preload",
            ",".join(preload),
            "--cwd",
            cwd,
            *(("--cgroup-pool", cgroup_pool) if cgroup_pool else ()),
        ]
        env = _procs.worker_env(pythonpath)
        try:
            pid = os.posix_spawn(
                exe, argv, env, setsid=True, setsigmask=(), file_actions=_procs.output_actions(out_fd)
            )
        except BaseException:
            for fd in (req_r, resp_r, resp_w):
                os.close(fd)
            req.close()
            raise
        os.close(req_r)
        os.close(resp_w)
        return cls(pid, req, resp_r)

    def request(self, worker_id: str, token: str, marker: str, heartbeat: float, fds: list[int]) -> bool:
        """Ask for a worker given ``fds``: its stdout and stderr, its start marker, its End log and
        its working directory (the caller still closes its copies); False if the zygote is gone or
        not reading (the caller starts one another way)."""
        if self.lost or self._req is None:
            return False
        try:
            socket.send_fds(self._req, [f"{worker_id} {token} {marker} {heartbeat!r}".encode()], fds)
            return True
        except OSError:
            self.lost = True
            return False

    def probe(self, agent: str, seconds: float) -> int | None:
        """ADAPT-PROBE: ask for a probe of ``agent``; the read end (non-blocking) of the pipe its one
        JSON line comes back on (EOF without it: no answer), or None if the zygote cannot be asked."""
        if self.lost or self._req is None:
            return None
        r, w = os.pipe()
        os.set_blocking(r, False)
        deadline = time.monotonic() + seconds
        try:
            socket.send_fds(self._req, [f"probe {deadline!r} {agent}".encode()], [w])
        except OSError:  # full (a burst of worker requests) or gone: no probe this time
            os.close(r)
            return None
        finally:
            os.close(w)
        return r

    def read(self) -> list[tuple[str, int]]:
        """Pids reported so far, as ``(worker_id, pid)``; a negative pid means the fork failed.
        Sets ``lost`` on EOF (the zygote exited)."""
        while True:
            try:
                chunk = os.read(self.resp_fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                self.lost = True
                break
            if not chunk:
                self.lost = True
                break
            self._buf += chunk
        out = []
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            try:
                worker_id, pid_text = line.decode().split(" ")
                out.append((worker_id, int(pid_text)))
            except ValueError:
                continue
        workers = []
        for worker_id, pid in out:
            if worker_id == "ready":
                self.ready = True
            elif worker_id in ("embryo", "watcher"):
                # TREE-WATCHER: the pool's watcher is reaped with the embryos once the zygote is gone
                # (it exits by itself once every worker has too).
                self.embryos.add(pid)
            else:
                self.embryos.discard(pid)
                workers.append((worker_id, pid))
        return workers

    def close_requests(self) -> None:
        """EOF on its request socket: the zygote exits."""
        if self._req is not None:
            self._req.close()
            self._req = None

    def close(self) -> None:
        self.close_requests()
        for name in ("resp_fd", "fd"):
            fd = getattr(self, name)
            if fd is not None and fd >= 0:
                os.close(fd)
            setattr(self, name, -1 if name == "resp_fd" else None)
