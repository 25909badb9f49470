"""WORKER-SHORT-SLICE: the ZeroMQ I/O threads that hand each frame on run at a short EEVDF slice.

Under hundreds of busy workers, an event's wait was its worker's ZeroMQ I/O thread waiting for a CPU
once woken; a short slice lets a woken thread preempt sooner, its weight unchanged. Read back here
with ``sched_getattr`` on each thread of the real processes: the worker's, the supervisor's, the
daemon's and its client's. Where the kernel refuses, nothing changes and everything works.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from typing import Any

import anyio
import pytest
import zmq

from supervisor import Client, Supervisor
from tests.support import daemonkit
from worker import lowlevel

pytestmark = pytest.mark.anyio


def _kernel_takes_slices() -> bool:
    """A thread of ours at the short slice reads back as such (6.12 and later; before, the kernel
    takes the call and ignores the runtime)."""
    got: list[int | None] = []

    def probe() -> None:
        got.append(lowlevel.slice_of(0) if lowlevel.set_slice(0) == 0 else None)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return got == [lowlevel.SHORT_SLICE_NS]


TAKES = _kernel_takes_slices()
needs_slices = pytest.mark.skipif(
    not TAKES, reason="this kernel ignores a SCHED_OTHER thread's sched_runtime"
)


def _threads(pid: int) -> dict[int, tuple[str, int | None]]:
    """``pid``'s threads: tid -> (name, slice in ns)."""
    out: dict[int, tuple[str, int | None]] = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/comm") as f:
            out[int(t)] = (f.read().strip(), lowlevel.slice_of(int(t)))
    return out


def _io_slices(threads: dict[int, tuple[str, int | None]]) -> list[int | None]:
    return [s for name, s in threads.values() if name.startswith("ZMQbg/IO")]


def _default_slice() -> int | None:
    return lowlevel.slice_of(threading.get_native_id())  # this test's thread: never shortened


@needs_slices
async def test_a_workers_zeromq_io_thread_runs_at_the_short_slice_its_other_threads_untouched() -> None:
    with anyio.fail_after(60):
        async with Supervisor(workers=1, spares=0) as sup:
            await sup.run("benchmarks._agents:ticker", {"rate": 100, "seconds": 0.02})
            pid = next(w["pid"] for w in (await sup.status())["workers"] if w["pid"])
            threads = _threads(pid)
    assert _io_slices(threads) == [lowlevel.SHORT_SLICE_NS], threads
    others = [s for name, s in threads.values() if not name.startswith("ZMQbg/")]
    assert others and set(others) == {_default_slice()}, threads  # the agent's threads keep theirs


@needs_slices
async def test_the_supervisors_zeromq_io_thread_runs_at_the_short_slice() -> None:
    before = set(_threads(os.getpid()))
    loop_before = lowlevel.slice_of(threading.get_native_id())
    with anyio.fail_after(60):
        async with Supervisor(workers=1, spares=0):
            new = {t: v for t, v in _threads(os.getpid()).items() if t not in before}
    assert _io_slices(new) == [lowlevel.SHORT_SLICE_NS], new
    assert lowlevel.slice_of(threading.get_native_id()) == loop_before  # the caller's own thread: untouched


@needs_slices
async def test_a_daemons_and_its_clients_zeromq_io_threads_run_at_the_short_slice() -> None:
    with daemonkit.serving(*daemonkit.FAST, "--no-journal") as served:
        before = set(_threads(os.getpid()))
        with anyio.fail_after(60):
            async with Client.connect(served.endpoint) as client:
                await client.status()
                mine = {t: v for t, v in _threads(os.getpid()).items() if t not in before}
        daemon = _threads(served.pid)
    # two contexts in the daemon (its workers' link and its clients' endpoint), one in the client
    assert _io_slices(daemon) == [lowlevel.SHORT_SLICE_NS] * 2, daemon
    assert _io_slices(mine) == [lowlevel.SHORT_SLICE_NS], mine


def _refusing(err: int) -> Any:
    """libc's ``syscall`` with ``sched_setattr`` refused with ``err`` (no such call, a seccomp filter, no
    permission); ``sched_getattr`` still answers, as it would."""
    real = ctypes.CDLL(None, use_errno=True).syscall
    refused = lowlevel.SLICE_SYSCALLS[os.uname().machine][0]

    def call(nr: int, *args: Any) -> int:
        if nr == refused:
            ctypes.set_errno(err)
            return -1
        return int(real(nr, *args))

    return call


@pytest.mark.skipif(os.uname().machine not in lowlevel.SLICE_SYSCALLS, reason="no syscall numbers known here")
@pytest.mark.parametrize("err", [errno.EPERM, errno.ENOSYS, errno.EINVAL])
async def test_a_kernel_that_refuses_the_slice_changes_nothing(err: int) -> None:
    """Where ``sched_setattr`` is refused, the errno comes back, no thread is touched, and a ZeroMQ
    context's first socket, made the way every turnpool link makes it, works as ever."""
    call = _refusing(err)
    assert lowlevel.set_slice(0, call=call) == err
    ctx = zmq.Context()
    try:
        before = set(_threads(os.getpid()))
        with lowlevel.new_threads_short(call=call) as done:
            a = ctx.socket(zmq.PAIR)
        new = {t: v for t, v in _threads(os.getpid()).items() if t not in before}
        b = ctx.socket(zmq.PAIR)
        a.bind("inproc://slice")
        b.connect("inproc://slice")
        a.send(b"frame")
        assert b.poll(10_000) and b.recv() == b"frame"
        a.close()
        b.close()
    finally:
        ctx.term()
    assert done == []
    assert new and set(s for _, s in new.values()) == {_default_slice()}, new  # the context's threads as ever


def test_no_such_call_changes_nothing() -> None:
    """A kernel without the call at all (ENOSYS for getattr too): nothing read, nothing asked."""

    def absent(*args: Any) -> int:
        ctypes.set_errno(errno.ENOSYS)
        return -1

    assert lowlevel.set_slice(0, call=absent) == errno.ENOSYS
    assert lowlevel.slice_of(0, call=absent) is None
    with lowlevel.new_threads_short(call=absent) as done:
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
    assert done == []
