"""The warm template of isolated tool calls: a small process that forks each call (TOOL-WARM).

Forking the caller costs what the caller is: a worker with its imports and threads is several times
slower to fork than a small interpreter, and a command exec'd from its copy pays the teardown of that
copy too. So a process makes each call from a *template* instead: a fresh interpreter of its own
(``python -c``), started on first use, that has imported only the child side of a call (``_toolchild``:
not even the rest of the ``worker`` package). The caller sends it one request per call over a unix
seqpacket socket, with the call's descriptors attached (its pipes, and one end of a socket pair that
is the call's own channel); the template forks, answers ``["pid", pid]`` with a pidfd of the child on
that channel (the caller watches and signals the call through it), and, having reaped the child,
``["exit", status]``. The child joins the call's groups, made by the caller, before it runs anything.

Two templates per process, each on first use: one for commands (it never imports anything more, so
its fork and exec stay cheap) and one for functions. A function reaches its template by reference
(module and qualified name): the template imports the module, once, and the fork that runs the call
has it warm. What cannot be found that way - a lambda, a nested function, ``__main__``, a method of an
instance, a module that fails to import there or starts a thread when imported (a template with
threads is not safe to fork) - is answered ``["fallback", why, retire]``, and the caller forks itself
for it, as it does outside a worker.

A function's calls after the first of its module go straight to an *embryo*: a fork of the template
made ahead of the call in the call's groups, on a socket of the caller's (``_toolembryo``); the
template only forks and reaps it.

The template has no parent-death signal (its parent may be a thread that ends); it ends when its
control socket closes: at once, killing what it runs, when its caller is gone, else once its calls end.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import socket
import sys
import threading
from typing import Any

import msgspec

from . import _toolchild, _toolembryo, _toolspawner
from .proctree import _tree

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()

MAX_REQUEST = 60_000  # a larger request (big arguments) goes in a memfd instead of the message
MAX_FDS = 8
# Embryos asked for between calls are made once requests pause this long (s): a function's template
# makes them at once after each call it hands over; a command's only after a pause (back to back, a
# command spawned into its groups costs less than an embryo's fork, exec and teardown).
EMBRYO_IDLE = {"fn": 0.002, "cmd": 0.02}
READY_S = 0.05  # the longest a function's call waits for its embryo to stand in its groups
REPLY_S = 60.0  # the longest a call waits for its template to answer (an import that hangs: fork the caller)


class Fallback(Exception):
    """The template will not make this call: fork the caller instead (``retire``: nor any other)."""

    def __init__(self, why: str, retire: bool = False) -> None:
        super().__init__(why)
        self.retire = retire


# ---- the template process ---------------------------------------------------------------------

BOOT = (
    "import importlib.util, os, sys\n"
    "d = sys.argv[1]\n"
    "spec = importlib.util.spec_from_file_location("
    "'worker', os.path.join(d, '__init__.py'), submodule_search_locations=[d])\n"
    "sys.modules['worker'] = importlib.util.module_from_spec(spec)\n"
    "from worker._tooltemplate import serve\n"
    "serve(int(sys.argv[2]), sys.argv[3], spec)\n"
)


class _Server:
    def __init__(self, sock: socket.socket, kind: str, spec: Any) -> None:
        self.sock = sock
        self.kind = kind
        self.spec = spec  # the worker package, not yet executed: run in full before a function's import
        self.parent = os.getppid()
        self.parent_pid = os.getpid()  # (an embryo's parent)
        self.calls: dict[int, tuple[socket.socket, list[str]]] = {}
        self.embryos: dict[tuple[str, ...], tuple[int, socket.socket]] = {}
        self.pending: dict[tuple[str, ...], None] = {}  # groups awaiting an embryo (() : none)
        self.env: dict[tuple[str, ...], dict[str, str] | None] = {}  # the environment their next call expects
        self.spawners: set[int] = set()  # TOOL-SPAWNER: ours, standing in kept command groups
        # TOOL-EMBRYO-DIRECT: embryos whose caller hands them the call: pid -> (our end of its socket, groups)
        self.direct: dict[int, tuple[socket.socket, list[str]]] = {}
        self.retiring = False
        # signals we ignore (reset in a spawned command)
        self.ignored: tuple[int, ...] = _toolchild.ALL_SIGNALS
        self.null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.home = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def resolve(self, req: dict[str, Any]) -> Any:
        if self.retiring:
            raise Fallback("the template is retiring", retire=True)
        name = req["mod"]
        if req.get("path") is not None:
            sys.path[:] = req["path"]
        if sys.modules.get(name) is None:
            pkg = sys.modules["worker"]
            if "__all__" not in vars(pkg):  # (not a name: that would import it, WORKER-LAZY)
                self.spec.loader.exec_module(pkg)  # the package in full, as an agent module imports it
            try:
                import importlib

                importlib.import_module(name)
            except BaseException as exc:  # noqa: BLE001 - told to the caller, which forks itself
                raise Fallback(
                    f"importing {name} failed in the template: {type(exc).__name__}: {exc}"
                ) from None
            if threading.active_count() > 1 or len(os.listdir("/proc/self/task")) > 1:
                self.retiring = True
                raise Fallback(f"importing {name} started a thread", retire=True)
            gc.freeze()  # (see ``serve``)
            _toolchild.prepare_template()  # (the module may have set a signal handler)
        return self.find(req)

    def find(self, req: dict[str, Any]) -> Any:
        """The function of ``req`` (its module imported here if it was not: an embryo forked before
        its template imported it), or ``Fallback``."""
        name, qual = req["mod"], req["qual"]
        if req.get("path") is not None:
            sys.path[:] = req["path"]
        module = sys.modules.get(name)
        if module is None:
            import importlib

            module = importlib.import_module(name)
        obj: Any = module
        for part in qual.split("."):
            obj = getattr(obj, part, None)
        obj = getattr(obj, "fn", obj) if type(obj).__name__ == "Isolated" else obj
        if not callable(obj) or getattr(obj, "__qualname__", None) != qual:
            raise Fallback(f"{name}.{qual} is not that function in a fresh import")
        return obj

    def handle(self, data: bytes, fds: list[int]) -> None:
        if len(fds) == 1 and self.kind == "cmd":
            with contextlib.suppress(Exception):
                req = _dec.decode(data)
                if req.get("kind") == "spawner":
                    self.make_spawner(req["join"], fds[0])
                    return
        if len(fds) == 1 and self.kind == "fn":
            with contextlib.suppress(Exception):
                req = _dec.decode(data)
                if req.get("kind") == "embryo":
                    self.make_direct(req["join"], req.get("env"), fds[0])
                    return
        if not fds:
            with contextlib.suppress(Exception):
                req = _dec.decode(data)
                if req.get("kind") == "prepare":
                    # Made right after the next call is handed over, or once requests pause.
                    self.pending[tuple(req["join"])] = None
                    self.env[tuple(req["join"])] = req.get("env")
            return
        channel = socket.socket(fileno=fds[0])
        key: tuple[str, ...] = ()
        try:
            req = _dec.decode(data)
            key = tuple(req["join"])
            self.pending.pop(key, None)
            if _toolchild.take_args(req, fds):
                self.discard(self.embryos.pop(key, None))  # (it would need the arguments' memfd again)
            fn = self.resolve(req) if req["kind"] == "fn" else None
            embryo = self.embryos.pop(key, None)
            pid = self.hand_over(embryo, data, fds) if embryo is not None else 0
            if not pid:
                pid = self.spawn(req, fds[1:]) if _toolspawner.spawnable(req) else os.fork()
            if not key and not req.get("memfd") and self.kind == "cmd":
                self.pending[key] = None  # calls without groups: the next one's process is made now
                self.env[key] = req["env"]
        except Fallback as exc:
            self.discard(self.embryos.pop(key, None))  # (its groups go: the caller forks the call)
            with contextlib.suppress(OSError):
                channel.send(_enc.encode(["fallback", str(exc), exc.retire]))
            channel.close()
            for fd in fds[1:]:
                os.close(fd)
            return
        except BaseException as exc:  # noqa: BLE001 - told to the caller
            with contextlib.suppress(OSError):
                channel.send(_enc.encode(["error", f"{type(exc).__name__}: {exc}"]))
            channel.close()
            for fd in fds[1:]:
                os.close(fd)
            return
        if pid == 0:  # pragma: no cover - the call's process
            _child(req, fn, fds[1:])
        try:
            pidfd = os.pidfd_open(pid)  # before any reap of ours: it names this child for good
            socket.send_fds(channel, [_enc.encode(["pid", pid])], [pidfd])
            os.close(pidfd)
        except OSError:
            pass  # the caller is gone: the child is reaped all the same
        for fd in fds[1:]:
            os.close(fd)
        self.calls[pid] = (channel, list(req["join"]))
        self.make_embryos(now=True)  # TOOL-EMBRYO: the next calls' processes, while this one runs

    def make_embryos(self, now: bool = False) -> None:
        """Fork the embryos asked for (``now``: right after a call was handed over, those that
        are worth it then: a function's, or a command's that cannot be spawned)."""
        for key in list(self.pending):
            if now and self.kind == "cmd" and key:
                continue
            del self.pending[key]
            self.prepare(list(key))

    # TOOL-EMBRYO: forking is most of a short call's cost, and moving a process into a cgroup waits for an
    # RCU grace period when no move happened just before (~10 ms here): each call's process is made
    # ahead of time, in the kept groups it will run in, set up as far as no call is needed.
    def prepare(self, join: list[str]) -> None:
        """Fork an embryo into the groups ``join`` (none: for calls without groups): the next call
        that uses them is its work."""
        key = tuple(join)
        if self.retiring or key in self.embryos:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the embryo
            _embryo(self, theirs, join, self.env.get(key))
        theirs.close()
        self.embryos[key] = (pid, ours)

    def make_spawner(self, join: list[str], fd: int) -> None:
        """TOOL-SPAWNER: fork a spawner into the groups ``join``, on the caller's socket ``fd``."""
        if self.retiring:
            os.close(fd)
            return
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the spawner
            _toolspawner.serve(
                socket.socket(fileno=fd), join, self.parent_pid, lambda req, fds: _child(req, None, fds, True)
            )
        os.close(fd)
        self.spawners.add(pid)

    def make_direct(self, join: list[str], env: dict[str, str] | None, fd: int) -> None:
        """TOOL-EMBRYO-DIRECT: fork an embryo into the groups ``join`` on the caller's socket ``fd``
        (asked at a call's end: no call of theirs runs now). We keep our copy of its end, to send its
        exit status there once reaped."""
        sock = socket.socket(fileno=fd)
        if self.retiring:
            sock.close()
            return
        os.sched_yield()  # the caller that asked, preempted by our wake-up perhaps, ends its call first
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the embryo
            _toolembryo.serve(sock, join, env, self.parent_pid, True, self.find, _child)
        self.direct[pid] = (sock, join)

    def discard(self, embryo: tuple[int, socket.socket] | None) -> None:
        if embryo is not None:
            with contextlib.suppress(OSError):
                os.kill(embryo[0], signal.SIGKILL)  # (reaped with the orphans)
            embryo[1].close()

    def hand_over(self, embryo: tuple[int, socket.socket], data: bytes, fds: list[int]) -> int:
        """The call to its embryo once it stands in its groups (0: it does not; fork as usual)."""
        pid, sock = embryo
        try:
            # A function's embryo is forked already: what is left (its set-up, its move) is quicker
            # than a fork of ours. A command's is not waited for: spawning it costs less.
            sock.settimeout(READY_S if self.kind == "fn" else 0.0)
            if sock.recv(16) == b"ready":
                socket.send_fds(sock, [data], fds)
                sock.close()
                return pid
        except OSError:
            pass
        self.discard(embryo)
        return 0

    def spawn(self, req: dict[str, Any], fds: list[int]) -> int:
        """TOOL-SPAWN: a command without a fork of ours: we step into the call's groups (so the command
        is born in them: no moment outside), ``posix_spawn`` it (a vfork: no copy of our memory, as
        ``subprocess`` does), and step back. Its process group, signals and descriptors are set by
        the spawn; what the spawn cannot set (a parent-death signal, a network namespace, rlimits)
        is why only calls with all their limits in cgroups come here (``_toolspawner.spawnable``)."""
        joined: list[str] = []
        try:
            for path in req["join"]:
                _enter(path)
                joined.append(path)
            os.chdir(req["cwd"])
            return _toolspawner.posix_spawn(req, fds, self.null, self.ignored)
        except OSError as exc:
            raise Fallback(f"spawn failed: {exc}") from None  # the caller forks and reports it
        finally:
            for path in reversed(joined):
                _enter(os.path.dirname(path))  # back home (ours are the caller's: the parent group)
            os.fchdir(self.home)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.spawners.discard(pid)
            entry = self.calls.pop(pid, None) or self.direct.pop(pid, None)
            if entry is not None:  # else an orphan of a call (we are their subreaper)
                with contextlib.suppress(OSError):
                    entry[0].send(_enc.encode(["exit", status]))
                entry[0].close()

    def end_embryos(self) -> None:
        for pid in self.spawners:  # (their callers let the template go: their calls went before)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for key in list(self.embryos):
            pid, _ = self.embryos[key]
            self.discard(self.embryos.pop(key))
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def kill_all(self) -> None:
        for pid, (_, groups) in [*self.calls.items(), *self.direct.items()]:
            for path in groups:
                with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.kill"), "w") as f:
                    f.write("1")
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)

    def run(self) -> None:

        _tree.set_child_subreaper()  # what a dead call leaves is ours to reap
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C at a terminal is for the caller
        _toolchild.prepare_template()
        self.ignored = _toolchild.ignored_signals()
        if self.kind == "fn":
            _toolembryo.settle(self.find, _child)  # TOOL-EMBRYO-DIRECT: the call's path specialised here once
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        self.sock.send(b"ready")
        closing = False
        while True:
            idle = max(1, int(EMBRYO_IDLE[self.kind] * 1000))
            wait = 1000 if closing else (idle if self.pending else None)
            events = poller.poll(wait)
            if not events and self.pending and not closing:
                self.make_embryos()  # requests paused: no call is waiting behind these forks
            for fd, _ in events:
                if fd == wake_r:
                    with contextlib.suppress(OSError):
                        os.read(wake_r, 4096)
                    continue
                try:  # (close-on-exec: a spawned command must not inherit another call's pipes)
                    data, fds, _, _ = socket.recv_fds(
                        self.sock, MAX_REQUEST + 4096, MAX_FDS, socket.MSG_CMSG_CLOEXEC
                    )
                except OSError:
                    data, fds = b"", []
                if data:
                    self.handle(data, fds)
                else:
                    for extra in fds:
                        os.close(extra)
                    closing = True
                    poller.unregister(self.sock)
            self.reap()
            if closing:
                self.end_embryos()
                if os.getppid() != self.parent:
                    self.kill_all()  # the caller is gone: nobody watches these calls any more
                if not self.calls and not self.direct:
                    os._exit(0)  # (a direct embryo ends with its call, or once its caller lets it go)


def _enter(path: str) -> None:
    fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


def _embryo(server: _Server, sock: socket.socket, join: list[str], env: dict[str, str] | None) -> None:
    """A call's process made ahead of time: in its groups and set up as far as no call is needed
    (``_toolchild.own_process``; the environment the last call in them had, the call's own as a
    rule), waiting for its call (then as ``_child``)."""
    try:
        _toolchild.own_process(join, scrub=server.kind != "cmd", keep=sock.fileno())
        if env is not None:
            _toolchild.set_environment(env)
        if os.getppid() != server.parent_pid:
            os._exit(0)  # the template died during the fork: no parent-death signal will come
        sock.send(b"ready")
        data, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST + 4096, MAX_FDS)
    except BaseException:  # noqa: BLE001 - not ready: the template forks the call itself
        os._exit(70)
    if not data or len(fds) < 4:
        os._exit(0)
    os.close(fds[0])  # the call's channel is the template's business
    req = _dec.decode(data)
    try:
        fn = server.resolve(req) if req["kind"] == "fn" else None
    except BaseException as exc:  # noqa: BLE001 - told to the caller
        with contextlib.suppress(BaseException):
            _toolchild.report_setup_error(fds[1], exc)
        os._exit(70)
    _child(req, fn, fds[1:], prepared=True)


def _child(
    req: dict[str, Any], fn: Any, fds: list[int], prepared: bool = False, rehearsal: bool = False
) -> None:
    """The call's process, from its set-up on (``rehearsal``: the call's path run on a dummy in an
    embryo or template, its descriptors left alone, returning: ``_toolembryo.rehearse``)."""
    res_w, out_w, err_w = fds[:3]
    in_r = fds[3] if len(fds) > 3 else None
    try:
        lim = req["lim"]
        _toolchild.setup(
            memory_mb=lim[0],
            pids=lim[1],
            cpu_s=lim[2],
            network=lim[3],
            env=req["env"],
            join=req["join"],
            limited=frozenset(req["limited"]),
            command=req["kind"] == "cmd",
            keep=(res_w,),
            out=out_w,
            err=err_w,
            stdin=in_r,
            prepared=prepared,
            rehearsal=rehearsal,
        )
        if req["cwd"] is not None:
            os.chdir(req["cwd"])
        if req["kind"] == "cmd":
            argv = req["argv"]
            try:
                os.execvpe(argv[0], argv, req["env"])
            except OSError as exc:
                _toolchild.report_setup_error(res_w, exc)
            os._exit(127)
        args, kwargs = _dec.decode(req["args"])
        body = _toolchild.child_body(
            fn, tuple(args), kwargs, req["async"], rehearsal, final=True, contain=req["contain"]
        )
        body(res_w)
        if rehearsal:
            return
    except BaseException as exc:  # told to the caller, then gone
        if rehearsal:
            raise
        with contextlib.suppress(BaseException):
            _toolchild.report_setup_error(res_w, exc)
    os._exit(70)


def serve(fd: int, kind: str, spec: Any) -> None:
    """The template's main (see ``BOOT``)."""
    os.set_inheritable(fd, False)
    _tree._prctl(3, 0)  # PR_GET_DUMPABLE: libc loaded here once, not in every fork (~0.4 ms each)
    # What is imported so far is never collected in a fork: a collection there would write to every
    # object's header, copying the template's whole heap page by page.
    gc.freeze()
    _Server(socket.socket(fileno=fd), kind, spec).run()


# ---- the caller's side --------------------------------------------------------------------------


class Template:
    """A running template, as its caller sees it."""

    def __init__(self, kind: str) -> None:
        import subprocess

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        here = os.path.dirname(os.path.abspath(__file__))
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", BOOT, here, str(theirs.fileno()), kind],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self.kind = kind
        self.sock = ours
        self.owner = os.getpid()
        self.pid = self.proc.pid
        self.known: set[str] = set()  # modules it imported: their calls can go to an embryo
        self.loose: _toolembryo.Embryo | None = None  # the next call without groups' embryo
        self.loose_lock = threading.Lock()
        ours.settimeout(60.0)
        try:
            ready = ours.recv(16)
        except OSError:
            ready = b""
        ours.settimeout(None)
        if ready != b"ready":
            self.close()
            raise OSError("the tool template did not start")

    def prepare(self, join: list[str], env: dict[str, str] | None = None) -> None:
        """TOOL-EMBRYO: ask for a call's process to wait in the kept groups ``join`` (no answer),
        its environment ``env`` set already."""
        if self.owner == os.getpid():
            with contextlib.suppress(OSError):
                self.sock.send(_enc.encode({"kind": "prepare", "join": join, "env": env}))

    def embryo(self, join: list[str], env: dict[str, str] | None) -> _toolembryo.Embryo | None:
        """TOOL-EMBRYO-DIRECT: an embryo to wait in the kept groups ``join`` (none: a call without
        groups), its environment ``env`` set already; not waited for."""
        if self.owner != os.getpid() or self.kind != "fn":
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            msg = _enc.encode({"kind": "embryo", "join": join, "env": env})
            socket.send_fds(self.sock, [msg], [theirs.fileno()])
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        return _toolembryo.Embryo(ours, self)

    def take_loose(self) -> _toolembryo.Embryo | None:
        """The embryo waiting for a call without groups (the caller's now), if any."""
        with self.loose_lock:
            embryo, self.loose = self.loose, None
        return embryo

    def refill_loose(self, env: dict[str, str] | None) -> None:
        """Ask for the next call without groups' embryo (at a call's end)."""
        with self.loose_lock:
            if self.loose is not None:
                return
            self.loose = self.embryo([], env)

    def spawner(self, join: list[str]) -> _toolspawner.Spawner | None:
        """TOOL-SPAWNER: a spawner to stand in the kept command groups ``join`` (not waited for)."""
        if self.owner != os.getpid() or self.kind != "cmd":
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            socket.send_fds(self.sock, [_enc.encode({"kind": "spawner", "join": join})], [theirs.fileno()])
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        return _toolspawner.Spawner(ours)

    def spawn(self, req: dict[str, Any], fds: list[int]) -> tuple[int, int, socket.socket]:
        """Ask for one call: (its pid, a pidfd of it, its channel). Raises ``Fallback`` or
        ``OSError`` (the template is gone)."""
        req, extra = args_aside(req)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            socket.send_fds(self.sock, [_enc.encode(req)], [theirs.fileno(), *fds, *extra])
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
            for fd in extra:
                os.close(fd)
        ours.settimeout(REPLY_S)  # a first call of a module waits for its import in the template
        try:
            data, got, _, _ = socket.recv_fds(ours, 65536, 1)
        except TimeoutError:
            ours.close()
            raise Fallback(f"the template took more than {REPLY_S:g} s to answer", retire=True) from None
        except OSError:
            data, got = b"", []
        ours.settimeout(None)
        msg: list[Any] = _dec.decode(data) if data else ["error", "the tool template is gone"]
        if msg[0] == "pid" and got:
            if req["kind"] == "fn":
                self.known.add(req["mod"])  # imported there: its calls can go to an embryo
            return int(msg[1]), got[0], ours
        for fd in got:
            os.close(fd)
        ours.close()
        if msg[0] == "fallback":
            raise Fallback(str(msg[1]), bool(msg[2]))
        raise OSError(f"the tool template failed: {msg[1]}")

    def close(self) -> None:
        """Close the control socket (and let its waiting embryos go): the template ends once its
        calls have."""
        from . import _toolgroups

        _toolgroups.let_embryos_go(self)
        loose = self.take_loose()
        if loose is not None:
            loose.close()
        with contextlib.suppress(OSError):
            self.sock.close()


def args_aside(req: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """``req`` with arguments too large for a message set aside in a memfd (sent as its last
    descriptor), and that memfd (to close once sent)."""
    args = req.get("args")
    if args is None or len(args) <= MAX_REQUEST:
        return req, []
    memfd = os.memfd_create("turnpool-call-args", os.MFD_CLOEXEC)
    _toolchild.write_all(memfd, args)
    os.lseek(memfd, 0, os.SEEK_SET)
    return {**req, "args": None, "memfd": True}, [memfd]


def exit_status(channel: socket.socket, wanted: bool = True) -> int:
    """The call's wait status, from its template once reaped (SIGKILL if the template is gone);
    0 without waiting when not ``wanted``."""
    if not wanted:
        channel.close()
        return 0
    channel.settimeout(REPLY_S)  # (the template reaps at once, unless busy importing for another call)
    try:
        data = channel.recv(256)
    except OSError:
        data = b""
    finally:
        channel.close()
    if data:
        msg = _dec.decode(data)
        if msg[0] == "exit":
            return int(msg[1])
    return int(signal.SIGKILL)


_TEMPLATES: dict[str, Template | None] = {}  # kind -> this process's template (None: could not start)
_LOCK = threading.Lock()
_forced: bool | None = None  # lowlevel.tool_templates(): on/off whatever the process is
_DROPPED: list[Template] = []  # templates let go that had not exited yet


def _wanted() -> bool:
    if _toolchild._in_call:
        return False  # a call that makes a call forks itself: no template of its own
    if _forced is not None:
        return _forced
    from ._guards import process_role

    return process_role() == "worker"


def get(kind: str) -> Template | None:
    """This process's template for ``kind`` ("fn" or "cmd"), started on first use; None where
    calls fork the caller (outside a worker, unless turned on; or it could not start)."""
    if not _wanted():
        return None
    me = os.getpid()
    t = _TEMPLATES.get(kind)
    if t is not None and t.owner == me:
        return t
    if kind in _TEMPLATES and t is None:
        return None
    with _LOCK:
        t = _TEMPLATES.get(kind)
        if t is not None and t.owner == me:
            return t
        try:
            t = Template(kind)
        except OSError:
            _TEMPLATES[kind] = None
            return None
        _TEMPLATES[kind] = t
        from . import _guards

        _guards.keep_child(t.pid)  # TREE-KEPT-CHILDREN: the worker's own, not a turn's leftover
        return t


def pid_of(kind: str) -> int | None:
    """The pid of this process's running template for ``kind``, if any (for tests and probes)."""
    t = _TEMPLATES.get(kind)
    return t.pid if t is not None and t.owner == os.getpid() else None


def drop(t: Template) -> None:
    """Stop using ``t`` (gone, or retiring): the next call starts another."""
    with _LOCK:
        if _TEMPLATES.get(t.kind) is t:
            del _TEMPLATES[t.kind]
    t.close()
    from . import _guards

    _guards.release_child(t.pid)
    with contextlib.suppress(Exception):
        if t.proc.poll() is None:  # it ends with its last call (a worker's sweep reaps it)
            _DROPPED.append(t)


def enable(on: bool | None) -> None:
    """Templates for this process's calls: ``True`` on, ``False`` off (calls fork the caller; a
    running template stays, unused), ``None`` the default (on only inside a worker), which closes
    the templates of a process that is not a worker."""
    global _forced
    _forced = on
    if on is None and not _wanted():
        from . import _guards

        for t in [*_TEMPLATES.values(), *_DROPPED]:
            if t is not None and t.owner == os.getpid():
                t.close()
                with contextlib.suppress(Exception):
                    t.proc.wait(timeout=10)
                _guards.release_child(t.pid)
        _TEMPLATES.clear()
        _DROPPED.clear()
