"""The child side of an isolated tool call (see ``_toolproc``): what the forked process does before the
call runs (its groups, limits, signals, descriptors, environment, network) and after (its leftovers), and
what the call itself may ask (``current_call_cancelled``)."""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from .proctree import _tree

# Every signal a process can change (a spawned command gets what its spawner ignores back to defaults).
ALL_SIGNALS = tuple(sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}))


def ignored_signals() -> tuple[int, ...]:
    """The signals this process ignores now."""
    return tuple(s for s in ALL_SIGNALS if signal.getsignal(s) == signal.SIG_IGN)


def take_args(req: dict[str, Any], fds: list[int]) -> bool:
    """Arguments too large for a message, set aside in a memfd (its last descriptor,
    ``_tooltemplate.args_aside``), read back into ``req``; whether there were any."""
    if not req.get("memfd"):
        return False
    with os.fdopen(fds.pop(), "rb") as f:
        req["args"] = f.read()
    return True


if TYPE_CHECKING:
    from ._toolgroups import Groups
    from ._toollimits import Limits

MIB = 1024 * 1024

_enc = msgspec.msgpack.Encoder()


_in_call = False
_call_cancelled = False


def current_call_cancelled() -> bool:
    """Inside an isolated call: whether its ladder has asked it to stop (timeout or cancel)."""
    return _call_cancelled


class CallInterrupted(KeyboardInterrupt):
    """Raised in an isolated call's main thread when its ladder asks it to stop (SIGINT)."""


def _on_sigint(signum: int, frame: Any) -> None:
    global _call_cancelled
    _call_cancelled = True
    raise CallInterrupted("isolated call asked to stop")


def setup_child(
    limits: Limits, groups: Groups, keep: tuple[int, ...], out: int, err: int, stdin: int | None
) -> None:
    """A forked caller's child: everything before the call (see ``setup``)."""
    setup(
        memory_mb=limits.memory_mb,
        pids=limits.pids,
        cpu_s=limits.cpu_s,
        network=limits.network,
        env=limits.environment(),
        join=groups.paths(),
        limited=frozenset(groups.dirs),
        command=stdin is not None,
        keep=keep,
        out=out,
        err=err,
        stdin=stdin,
    )


def setup(
    *,
    memory_mb: float | None,
    pids: int | None,
    cpu_s: float | None,
    network: bool,
    env: dict[str, str],
    join: list[str],
    limited: frozenset[str],
    command: bool,
    keep: tuple[int, ...],
    out: int,
    err: int,
    stdin: int | None,
    prepared: bool = False,
    rehearsal: bool = False,
) -> None:
    """Everything a call's child does before the call (a fork of the caller or of a template):
    own process group, groups joined first, then limits, signals, fds, environment. ``prepared``:
    the call-independent part (``own_process``) was done ahead of the call (an embryo).
    ``rehearsal``: the same path on a dummy, descriptors left alone (``_toolembryo.rehearse``)."""
    if not prepared:
        own_process(join, scrub=not command)
    if memory_mb is not None and "memory" not in limited:
        # Fallback: address space, counted from what the forked call already maps (a command: from 0).
        base = 0 if command else _vm_size()
        cap = base + int(memory_mb * MIB)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    if pids is not None and "pids" not in limited and os.geteuid() != 0:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))
    if cpu_s is not None:
        soft = max(1, int(cpu_s + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))
    if not network:
        unshare_network()
    set_environment(env)
    if rehearsal:
        return
    os.dup2(out, 1)
    os.dup2(err, 2)
    if stdin is not None:
        os.dup2(stdin, 0)
    else:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
    last = 2
    for fd in sorted(keep):
        os.closerange(last + 1, fd)
        last = fd
    os.closerange(last + 1, os.sysconf("SC_OPEN_MAX"))


def set_environment(env: dict[str, str]) -> None:
    """``os.environ`` (and the C environment) made ``env``, touching only what differs: an embryo
    set it ahead of its call, which finds it done."""
    current = os.environ
    for key in [k for k in current if k not in env]:
        del current[key]
    for key, value in env.items():
        if current.get(key) != value:
            current[key] = value


def own_process(join: list[str], *, scrub: bool, keep: int | None = None) -> None:
    """TOOL-EMBRYO: what a call's process does that depends on no call: its own process group and
    parent-death signal, its groups joined (TOOL-JOIN-FIRST), default signals (SIGINT the call's
    interruption), the caller's environment block scrubbed, and subreaper of its tree. An embryo
    does it before its call comes (``keep``: the one descriptor it keeps, its template's socket)."""
    global _in_call, _call_cancelled
    _in_call, _call_cancelled = True, False
    os.setpgid(0, 0)
    _tree.set_parent_death_signal(signal.SIGKILL)
    for path in join:  # TOOL-JOIN-FIRST: before anything of the call runs (nothing forks outside its groups)
        fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for sig in _reset:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, _on_sigint)
    if scrub and not _block_scrubbed:
        _scrub_proc_environ()  # (a command's exec gives it a block of its own)
    if keep is not None:
        os.closerange(3, keep)  # the template's sockets and other calls' descriptors
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
    _tree.set_child_subreaper()  # a double-forked daemon of the call stays in the call's tree


_RESET = (
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGCHLD,
    signal.SIGPIPE,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGXCPU,
    signal.SIGQUIT,
    signal.SIGXFSZ,
)


_reset: tuple[int, ...] = _RESET  # what a call's process resets (a template: only what it changed)
_block_scrubbed = False  # this process's environment block is zeros already (a template's forks)


def prepare_template() -> None:
    """In a template, once its signals are set and after each import: what its forks need not redo
    (signals it left at their default; the environment block, scrubbed here once for all)."""
    global _reset, _block_scrubbed
    _reset = tuple(s for s in _RESET if signal.getsignal(s) != signal.SIG_DFL)
    if not _block_scrubbed:
        # The C environment first moves out of the block (unset and set again: copies of its own),
        # so that zeroing the block changes no variable of the template's.
        saved = dict(os.environ)
        for key in saved:
            del os.environ[key]
        os.environ.update(saved)
        _scrub_proc_environ()
        _block_scrubbed = True


def unshare_network() -> None:
    """TOOL-NET: a network namespace of its own (root: CLONE_NEWNET; else user + net), or raise."""
    flags = os.CLONE_NEWNET if hasattr(os, "CLONE_NEWNET") else 0x40000000
    unshare = getattr(os, "unshare", None)
    if unshare is None:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)

        def unshare(f: int) -> None:
            if libc.unshare(f) != 0:
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e))

    try:
        unshare(flags)
    except OSError as first:
        try:
            unshare(flags | 0x10000000)  # CLONE_NEWUSER
        except OSError:
            raise OSError(
                first.errno,
                f"network=False refused: the kernel allows no new network namespace here ({first.strerror})",
            ) from None


def _vm_size() -> int:
    try:  # (plain system calls: a buffered open costs more than the read, on a call's path)
        fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return int(os.read(fd, 4096).split()[0]) * os.sysconf("SC_PAGE_SIZE")
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return 0


def _scrub_proc_environ() -> None:
    """Overwrite the environment block the process started with, so /proc/self/environ (read by a
    forked call that never execs) does not show the caller's variables."""
    try:
        with open("/proc/self/stat", "rb") as f:
            data = f.read()
        fields = data[data.rfind(b")") + 2 :].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50, 51)
        if 0 < start < end:
            with open("/proc/self/mem", "r+b", buffering=0) as mem:
                mem.seek(start)
                mem.write(b"\0" * (end - start))
    except (OSError, ValueError, IndexError, OverflowError):
        pass


def end_own_tree() -> None:
    """In the child, after the call: kill what the call left running (it is our subreaped tree)."""
    try:
        os.waitpid(-1, os.WNOHANG)  # one syscall: no child at all (the usual case) is ECHILD
    except ChildProcessError:
        return  # (a subreaper: what the call left, even double-forked, would be our child)
    except OSError:
        pass
    with contextlib.suppress(Exception):
        _tree.kill_descendants(os.getpid(), timeout=1.0)


def receive(sock: Any, timeout: float, max_fds: int = 0) -> tuple[Any, list[int]]:
    """One message on ``sock`` within ``timeout``: (decoded, or None if none came or it was not
    msgpack; the descriptors it carried)."""
    import socket

    sock.settimeout(timeout)
    try:
        data, fds, _, _ = socket.recv_fds(sock, 256, max_fds)
    except OSError:
        return None, []
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(None)
    try:
        return (msgspec.msgpack.decode(data) if data else None), fds
    except msgspec.DecodeError:
        return None, fds


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def report_setup_error(fd: int, exc: BaseException) -> None:
    """The call could not be set up (or exec failed): tell the caller on the result pipe."""
    errno = exc.errno if isinstance(exc, OSError) else None
    write_all(fd, _enc.encode(["setup", type(exc).__name__, str(exc), errno]))


# TOOL-LADDER: leads an outcome written once nothing else of the call can run again (never the first
# byte of a msgpack value: an outcome without it is one the caller waits for the process to end after),
# then the outcome's length (4 bytes, little-endian): the caller knows it has it all without an end of file.
FINAL = b"\xc1"
FINAL_HEAD = 5


def _alone(contain: str | None) -> bool:
    """Whether this process is all that is left of its call: its only thread, no monitoring tool
    registered, no child of its own (it is the subreaper of its tree: what its children left is its
    child), and, where the call has a v2 group ``contain``, the group's only process."""
    if len(os.listdir("/proc/self/task")) != 1:
        return False
    monitoring = getattr(sys, "monitoring", None)  # (Python 3.12+: its callbacks would run on the way out)
    if monitoring is not None and any(monitoring.get_tool(i) is not None for i in range(6)):
        return False
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return False  # (a child, running or a zombie)
    except ChildProcessError:
        pass
    if contain is None:
        return True
    fd = os.open(os.path.join(contain, "cgroup.procs"), os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096).split() == [str(os.getpid()).encode()]
    finally:
        os.close(fd)


def end_final(fd: int, payload: bytes, contain: str | None, rehearsal: bool = False) -> None:
    """TOOL-LADDER, after the function returned and its outcome is encoded: where nothing else of the
    call can run again, write the outcome marked ``FINAL`` and exit (not returning), so that the caller
    returns without waiting for the kernel to tear the process down. Nothing else can run once
    collections are off (no ``__del__`` or weakref callback of the call's objects: every one of them
    stays referenced until the exit), profile and trace hooks are off, every signal is blocked (the
    handlers of those already come run here, before the checks) and the process is alone
    (``_alone``). Else returns, collections and signals as they were: the caller waits for the
    process to be gone and sweeps its tree. ``rehearsal``: the checks, then back as they were."""
    if len(payload) >= 1 << 32:
        return  # (its length would not fit: the caller waits for the end of the pipe)
    collecting = gc.isenabled()
    gc.disable()
    sys.setprofile(None)
    sys.settrace(None)
    old: set[Any] | None = None
    alone = False
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # (pending handlers run here: before the checks)
        signal.pthread_sigmask(signal.SIG_BLOCK, ALL_SIGNALS)
        alone = _alone(contain)
    except BaseException:  # noqa: BLE001 - a handler raised, or a check failed: the caller waits
        alone = False
    if alone and not rehearsal:
        try:
            write_all(fd, FINAL + len(payload).to_bytes(4, "little") + payload)
            os.sched_yield()  # its caller, woken by the write, first (its exit can wait)
        finally:
            os._exit(0)
    if old is not None:
        with contextlib.suppress(BaseException):
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    if collecting:
        gc.enable()


def child_body(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    is_async: bool,
    rehearsal: bool = False,
    final: bool = False,
    contain: str | None = None,
) -> Callable[[int], None]:
    """What the call's process runs once set up: the function, its outcome on the result pipe
    (``rehearsal``: then returns, the process goes on). ``final``: the outcome is marked final where
    nothing else of the call can run again (``end_final``; ``contain``: the call's v2 group)."""

    def body(fd: int) -> None:
        try:
            value = _run_async(fn, args, kwargs) if is_async else fn(*args, **kwargs)
            try:
                payload = _enc.encode(["ok", value])
            except (TypeError, ValueError, msgspec.EncodeError) as exc:
                payload = _enc.encode(
                    [
                        "raised",
                        "builtins",
                        "TypeError",
                        [f"result of {fn.__name__}() cannot cross back: {exc}"],
                    ]
                )
        except CallInterrupted:
            payload = _enc.encode(["stopped"])
        except MemoryError:
            payload = _enc.encode(["memory"])
        except BaseException as exc:  # noqa: BLE001 - told to the caller
            args_ = [a if isinstance(a, (str, int, float, bool, type(None))) else repr(a) for a in exc.args]
            payload = _enc.encode(["raised", type(exc).__module__, type(exc).__qualname__, args_])
        if final:
            end_final(fd, payload, contain, rehearsal)  # (returns only where something of the call may run)
        with contextlib.suppress(OSError):
            write_all(fd, payload)
            if not rehearsal:
                os.close(fd)
        if rehearsal:
            return
        end_own_tree()
        os._exit(0)

    return body


def _run_async(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import asyncio

    asyncio.events._set_running_loop(None)  # forked from inside the caller's running loop
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(fn(*args, **kwargs))

        def interrupt() -> None:
            global _call_cancelled
            _call_cancelled = True
            task.cancel()

        loop.add_signal_handler(signal.SIGINT, interrupt)
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            raise CallInterrupted("isolated call asked to stop") from None
    finally:
        with contextlib.suppress(Exception):
            loop.close()
