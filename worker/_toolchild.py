"""The child side of an isolated tool call (see ``_toolproc``): what the forked process does before the
call runs (its groups, limits, signals, descriptors, environment, network) and after (its leftovers), and
what the call itself may ask (``current_call_cancelled``)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
from typing import TYPE_CHECKING, Any

from . import _tree

if TYPE_CHECKING:
    from ._toolproc import Groups, Limits

MIB = 1024 * 1024


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
    """Everything a call's child does before the call: own group, limits, signals, fds, env."""
    global _in_call, _call_cancelled
    _in_call, _call_cancelled = True, False
    os.setpgid(0, 0)
    _tree.set_parent_death_signal(signal.SIGKILL)
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for sig in (
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGCHLD,
        signal.SIGPIPE,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGXCPU,
        signal.SIGQUIT,
    ):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, _on_sigint)
    groups.join()
    if limits.memory_mb is not None and "memory" not in groups.dirs:
        # Fallback: address space, counted from what the forked call already maps.
        base = _vm_size() if stdin is None else 0
        cap = base + int(limits.memory_mb * MIB)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    if limits.pids is not None and "pids" not in groups.dirs and os.geteuid() != 0:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.pids, limits.pids))
    if limits.cpu_s is not None:
        soft = max(1, int(limits.cpu_s + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))
    if not limits.network:
        unshare_network()
    env = limits.environment()
    os.environ.clear()
    os.environ.update(env)
    _scrub_proc_environ()
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
    _tree.set_child_subreaper()  # a double-forked daemon of the call stays in the call's tree


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
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
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
    with contextlib.suppress(Exception):
        _tree.kill_descendants(os.getpid(), timeout=1.0)
