"""The worker pool: ``WorkerSlot`` (one worker process as the supervisor tracks it) and
``WorkerPool`` (starting, retiring and reaping them)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import itertools
import logging
import os
import secrets
import shutil
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.abc
import anyio.to_thread

from wire import worker_link
from worker import proctree

from .._checks import check_nice
from .._fds import FdShortage, SpawnRoom, is_shortage
from .._paths import private_dir
from . import output as _output
from . import procs as _procs
from .reaper import Reaper
from .share import OWN, AutogroupShare, own_nice, pool_weight
from .treemem import TreeMemory
from .workspace import WorkerFiles, make_worker_dir, remove_tree
from .zygote import Zygote

if TYPE_CHECKING:
    from .link import WorkerLink
    from .timers import Timer, Timers
    from .turns import TurnRecord

log = logging.getLogger("turnpool.supervisor")

# WORKER-FD-RETRY: a worker is started only while this many descriptors are free: its connection to the worker
# link is accepted by libzmq, which aborts the process when that accept finds none.
SPAWN_HEADROOM = 16
SPAWN_FDS = 8  # descriptors one worker start may add here, counted generously (3 stay open per worker)
# WORKER-SPARE: how long a replacement for a spare that took over waits before it starts (seconds).
SPARE_REFILL_DELAY = 0.01

SlotState = Literal["starting", "idle", "busy", "stopping", "dead"]


class WorkerSlot:
    __slots__ = (
        "ahead",
        "cgroup",
        "deferred_ready",
        "doomed",
        "exit_code",
        "failure",
        "fd",
        "files",
        "heard",
        "heir_turn",
        "id",
        "ident",
        "known",
        "marker",
        "out",
        "passed",
        "pid",
        "ready_at",
        "spawns",
        "stale",
        "started_at",
        "state",
        "timer",
        "token",
        "turn",
        "turns_run",
        "workdir",
    )

    def __init__(
        self, *, worker_id: str, pid: int, fd: int | None, token: str, marker: str, now: float
    ) -> None:
        self.id = worker_id
        self.ident = worker_id.encode()
        self.pid = pid
        self.fd = fd
        self.token = token
        self.marker = marker
        self.state: SlotState = "starting"
        self.turn: TurnRecord | None = None  # the turn it reported Started for
        # Turns handed ahead (prefetched), in the order the worker will start them. They still
        # count as queued until the worker reports Started.
        self.ahead: collections.deque[TurnRecord] = collections.deque()
        self.out: list[Any] = []  # messages batched for one frame (flushed by the supervisor)
        self.turns_run = 0
        self.known: set[int] = set()  # descendants seen when the tree was frozen
        self.spawns: dict[int, str] = {}  # spawn request id -> child turn id
        self.started_at = now
        self.ready_at: float | None = None
        self.timer: Timer | None = None  # start-up deadline, or the stop deadline when retiring
        self.doomed = False  # escalation began: never goes back to idle
        self.exit_code: int | None = None
        self.deferred_ready: Any = None  # a Ready that came before the zygote's report of the pid
        self.failure: str | None = None  # why it was killed before it was ready, if we know
        self.cgroup: str | None = None  # its own cgroup v2 directory, where the pool has one
        # Handed turns the worker went past (its start marker names a later one, rule LADDER-EARLY): their
        # Started and End may still come, and are then taken as theirs.
        self.passed: set[str] = set()
        # WORKER-RELOAD: it imported agent code before a reload: it finishes its running turn, takes no
        # new one, and is replaced (not counted as live, so its replacement starts at once).
        self.stale = False
        # LADDER-HANDOVER: the running turn's ``Started`` came over the wire (not only its start marker):
        # its End then asks for an ``EndAck`` (WORKER-FLUSH), so no turn handed ahead can start before one.
        self.heard = False
        # LADDER-HEIR: the turn handed, at this doomed worker's kill decision, to a warm spare that
        # starts it once this worker's process is gone (the spare's own pidfd on it).
        self.heir_turn: TurnRecord | None = None
        self.files: WorkerFiles | None = None  # SEC-WORKER-FILES: its start marker and End log
        self.workdir: str | None = None  # WORKER-CWD: the directory its agents run in

    @property
    def inflight(self) -> int:
        return len(self.ahead) + (self.turn is not None)

    @property
    def live(self) -> bool:
        return self.state in ("starting", "idle", "busy")

    def __repr__(self) -> str:
        return f"WorkerSlot({self.id}, pid={self.pid}, {self.state})"


class WorkerPool:
    """The worker processes: slots, starting them (forked by the zygote or as fresh interpreters),
    back-off after failed starts, retiring, and reaping a worker's whole tree when it exits.

    It keeps no turn state. The supervisor decides how many workers there should be (``fill``)
    and settles the turns of a worker that is gone (``on_exit``, called once the worker's pid is
    exited; ``reap_exit`` does the process side of it). ``on_message`` receives a Ready the
    zygote's pid report held back; ``changed`` is called whenever a slot leaves the pool and
    ``refill`` when the pool should be topped up again (after a back-off, or a lost worker).
    """

    def __init__(
        self,
        *,
        link: WorkerLink,
        timers: Timers,
        prefix: str,
        heartbeat: float,
        start_timeout: float,
        stop_timeout: float,
        python: str | None,
        worker_args: tuple[str, ...],
        use_zygote: bool,
        preload: tuple[str, ...],
        on_message: Callable[[WorkerSlot, Any], None],
        on_exit: Callable[[WorkerSlot], Awaitable[None]],
        changed: Callable[[], None],
        refill: Callable[[], None],
        nice: int | None = None,
    ) -> None:
        self.link = link
        self.nice = check_nice(nice)  # WORKER-NICE: workers run at this niceness (None: as this process)
        self.timers = timers
        self.prefix = prefix
        self.heartbeat = heartbeat
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.python = python
        self.worker_args = worker_args
        self.use_zygote = use_zygote
        self.preload = preload
        self.on_message = on_message
        self.on_exit = on_exit
        self.changed = changed
        self.refill = refill
        self.slots: dict[str, WorkerSlot] = {}
        self.reaper = Reaper(self)  # LADDER-STEPS, LADDER-ORPHANS, LADDER-BATCH
        self.share = AutogroupShare(timers.call_later)  # WORKER-CPU-SHARE
        self.memory = TreeMemory()  # MEM-STATUS-SAMPLE: the workers' memory as status() reports it
        self.zygote: Zygote | None = None
        self.cgroups: proctree.CgroupPool | None = None  # our pool cgroup, when cgroups are in use
        self.output: _output.WorkerOutput | None = None
        self.runtime_dir: Path | None = None  # the engine's private directory: the worker endpoint
        self.work_dir: Path | None = None  # WORKER-CWD: where each worker gets a directory of its own
        self.pythonpath = ""
        self.start_failures = 0
        self.last_start_error: str | None = None
        self.shortage = FdShortage()  # EMFILE/ENFILE met starting workers (WORKER-FD-RETRY), by where
        self.ready_event: anyio.Event | None = None
        self.tg: anyio.abc.TaskGroup | None = None
        self.closing = False  # the supervisor is shutting down: a lost zygote is expected
        self.life_r = -1  # workers inherit the read end: its EOF tells them the supervisor is gone
        self.life_w = -1
        self._worker_ids = itertools.count(1)
        self._spawn_room = SpawnRoom(SPAWN_HEADROOM, SPAWN_FDS)
        self._backoff_until = 0.0
        self._refill_timer: Timer | None = None
        self._fill_target = 0
        self.own_nice: int | None = None  # WORKER-SUPERVISOR-WEIGHT: our autogroup's niceness while raised
        self._fill_scheduled = False  # WORKER-REPLACE-LATER: a fill is due in a loop callback
        self._spare_fill: Timer | None = None  # WORKER-SPARE: a replacement for a spare, due later

    def ready(
        self, slot: WorkerSlot, msg: worker_link.Ready, now: float
    ) -> Literal["ready", "held", "refused"]:
        """A worker's ``Ready``: the handshake. ``ready`` (the slot is now idle), ``held`` (the
        zygote's report of its pid is not read yet: the Ready waits for it) or ``refused`` (not the
        token and pid this slot was started with, or another protocol version: the worker is killed)."""
        if not slot.pid:
            self.zygote_pids()
            if not slot.pid and slot.state == "starting" and msg.token == slot.token:
                # An embryo woken by the zygote can say Ready before the zygote's report
                # of its pid reaches us: hold the Ready until that report is read.
                slot.deferred_ready = msg
                return "held"
        if slot.state != "starting" or msg.token != slot.token or msg.pid != slot.pid:
            return "refused"
        if msg.version != worker_link.PROTOCOL_VERSION:
            slot.failure = (
                f"worker {slot.id} (pid {slot.pid}) speaks protocol {msg.version}, "
                f"expected {worker_link.PROTOCOL_VERSION}"
            )
            self.last_start_error = slot.failure
            _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)
            return "refused"
        if slot.timer is not None:
            slot.timer.cancel()
        if self.nice is not None:
            _procs.lower_priority(slot.pid, self.nice)  # WORKER-NICE: before it runs any turn
        self.share.apply(slot.pid, self._fill_target, self.nice)  # WORKER-CPU-SHARE: weigh a few programs
        slot.state = "idle"
        slot.ready_at = now
        self.start_failures = 0
        return "ready"

    # ---- start and stop ----------------------------------------------------------------

    def prepare(self, *, worker_output: Any, max_bytes: int, agent_path: Any) -> None:
        """Before anything starts: the workers' output (WORKER-OUTPUT: a log that cannot be written fails
        here, before anything exists), the engine's private directory (the worker endpoint) and the
        one workers' own directories go in (WORKER-CWD), this process as child subreaper, and the
        import path workers get (WORKER-PATH)."""
        output = _output.WorkerOutput(worker_output, max_bytes=max_bytes)
        output.start()
        self.output = output
        try:
            self.runtime_dir = private_dir()
            self.work_dir = private_dir(self.runtime_dir.parent, kind="work")
        except BaseException:
            if self.runtime_dir is not None:
                shutil.rmtree(self.runtime_dir, ignore_errors=True)
            output.close()
            raise
        proctree.set_child_subreaper()
        self.pythonpath = _procs.import_path(agent_path)

    async def start(self, *, tg: anyio.abc.TaskGroup, use_cgroups: bool) -> None:
        """Open the life pipe, the pool cgroup (if usable) and the zygote (if asked for)."""
        self.tg = tg
        self.life_r, self.life_w = os.pipe()
        os.set_inheritable(self.life_r, True)
        self.ready_event = anyio.Event()
        if use_cgroups:
            # Also sweeps pools left by supervisors killed with SIGKILL (may wait for their exits).
            self.cgroups = await anyio.to_thread.run_sync(proctree.CgroupPool.create)
            if self.cgroups is None:
                log.info("cgroup v2 not usable here: worker trees are tracked by subreaper and markers")
        if self.use_zygote and proctree.set_child_subreaper():
            assert self.output is not None
            out_fd = self.output.open("zygote")
            try:
                self.zygote = Zygote.start(
                    endpoint=self.link.endpoint,
                    life_fd=self.life_r,
                    python=self.python,
                    extra_args=self.worker_args,
                    preload=self.preload,
                    out_fd=out_fd,
                    cwd=str(self.work_dir),
                    pythonpath=self.pythonpath,
                    cgroup_pool=self.cgroups.path if self.cgroups else None,
                )
            except OSError as exc:
                log.warning("could not start the zygote, starting workers as fresh interpreters: %s", exc)
            else:
                tg.start_soon(self._zygote_loop, self.zygote)
            finally:
                os.close(out_fd)

    async def close(self) -> None:
        """Every worker is gone: sweep what they left (LADDER-BATCH), stop the zygote, remove the pool
        cgroup."""
        await self.reaper.settled()
        await self.stop_zygote()
        if self.cgroups is not None:
            await anyio.to_thread.run_sync(self.cgroups.close)
            self.cgroups = None

    def close_pipe(self) -> None:
        for fd in (self.life_r, self.life_w):
            if fd >= 0:
                os.close(fd)
        self.life_r = self.life_w = -1

    async def release(self) -> None:
        """After every worker is reaped: close the life pipe, remove the engine's directory and the
        workers' (WORKER-CWD), and drain what workers left in their output and stop its pump, off the
        event loop."""
        self.close_pipe()
        # WORKER-SUPERVISOR-WEIGHT: the niceness we had before, once no pool of ours runs.
        OWN.release(id(self))
        self.own_nice = None
        with anyio.CancelScope(shield=True):
            for directory in (self.runtime_dir, self.work_dir):
                if directory is not None:
                    await anyio.to_thread.run_sync(remove_tree, str(directory))
            if self.output is not None:
                await anyio.to_thread.run_sync(self.output.close)

    # ---- sizing ------------------------------------------------------------------------

    def ready_count(self) -> int:
        return sum(1 for s in self.slots.values() if s.state in ("idle", "busy"))

    def live_count(self) -> int:
        return sum(1 for s in self.slots.values() if s.live and not s.doomed and not s.stale)

    def fill(self, target: int, *, spares: int = 0) -> None:
        """Start workers until ``target`` are live, unless start failures put the pool in back-off.

        WORKER-REPLACE-LATER: on a running event loop the starts happen in a loop callback of their own, after
        what is already scheduled - above all the frame handing a queued turn to a warm spare,
        which the same exit scheduled first: a replacement's start (a cgroup, a pipe, a request to
        the zygote: ≈ 0.2 ms) no longer delays the spare taking over.

        WORKER-SPARE: when the pool is short of no more than its ``spares`` (a spare took the place of
        a worker that died, so every turn slot still has a worker), the replacement starts
        ``SPARE_REFILL_DELAY`` later instead: its start (the zygote's fork, the new process's
        imports and warm-up) no longer competes for the CPUs with the spare taking over the
        queued turn. A pool short of more than that (no spare left) starts them at once."""
        if target != self._fill_target and not self.closing:
            # WORKER-SUPERVISOR-WEIGHT: where we may, we weigh what the pool weighs (a few programs), not one.
            self.own_nice = OWN.hold(id(self), own_nice(pool_weight(target, self.nice)))
        self._fill_target = target
        if self._fill_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._fill_now()
            return
        if spares > 0 and target - self.live_count() <= spares:
            if self._spare_fill is None:
                self._spare_fill = self.timers.call_later(SPARE_REFILL_DELAY, self._fill_spare)
            return
        self._fill_scheduled = True
        loop.call_soon(self._fill_now)

    def _fill_spare(self) -> None:
        self._spare_fill = None
        if not self._fill_scheduled:
            self._fill_now()

    def _fill_now(self) -> None:
        self._fill_scheduled = False
        if self._spare_fill is not None:  # this fill covers it
            self._spare_fill.cancel()
            self._spare_fill = None
        if self.closing or self.tg is None:
            return
        target = self._fill_target
        live = self.live_count()
        if live < target and self.timers.clock() < self._backoff_until:
            if self._refill_timer is None:
                self._refill_timer = self.timers.call_at(self._backoff_until, self._after_backoff)
            return
        while live < target:
            if not self._spawn():  # WORKER-FD-RETRY: backed off; fill again once the back-off is over
                if self._refill_timer is None:
                    self._refill_timer = self.timers.call_at(self._backoff_until, self._after_backoff)
                return
            live += 1

    def _after_backoff(self) -> None:
        self._refill_timer = None
        self.refill()

    def start_failed(self, reason: str) -> None:
        """A worker could not start: back off exponentially (50 ms … 5 s) before the next one."""
        self.start_failures += 1
        self.last_start_error = reason
        delay = min(0.05 * 2 ** min(self.start_failures, 8), 5.0)
        self._backoff_until = self.timers.clock() + delay
        log.error(
            "worker start failed (%d in a row, retrying in %.2fs): %s", self.start_failures, delay, reason
        )
        if (
            self.ready_event is not None
            and not self.ready_event.is_set()
            and self.start_failures >= 3
            and self.ready_count() == 0
        ):
            self.ready_event.set()  # start() reports the failure instead of waiting for the deadline

    # ---- spawning ----------------------------------------------------------------------

    # WORKER-FD-RETRY: a worker start that finds no file descriptor (EMFILE/ENFILE) backs off and is retried.
    def _spawn(self) -> bool:
        """Start one worker; ``False`` when it could not be (the failure is recorded and the pool
        backs off: ``start_failed`` sets the timer that fills it again)."""
        worker_id = f"w{next(self._worker_ids)}"
        token = secrets.token_hex(16)
        marker = f"{os.getpid()}-{self.prefix}-{worker_id}"
        assert self.output is not None and self.work_dir is not None
        try:
            if not self._spawn_room.ok():
                raise OSError(errno.EMFILE, f"fewer than {SPAWN_HEADROOM} file descriptors are free")
            # WORKER-REBIND: the endpoint it will connect to is there (made again if it was deleted).
            self.link.ensure_bound()
            # SEC-WORKER-FILES, WORKER-CWD: its start marker and End log (nameless), its own directory.
            files = WorkerFiles(worker_id, token)
        except OSError as exc:
            # Raised here, in a loop callback, it would reach no one and the pool would stay short
            # for good: every failure to start is a failed start, backed off and retried (WORKER-FD-RETRY).
            self._start_error(exc, f"could not prepare worker {worker_id}")
            return False
        try:
            workdir = make_worker_dir(self.work_dir, worker_id)
            dir_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            files.close()
            self._start_error(exc, f"could not make worker {worker_id}'s directory")
            return False
        cgroup = None
        try:
            # Made before the worker exists: it joins it before it forks anything.
            cgroup = self.cgroups.worker_dir(worker_id) if self.cgroups is not None else None
            out_fd = self.output.open(worker_id)
        except OSError as exc:
            if cgroup is not None:
                proctree.cgroup_remove(cgroup)
            os.close(dir_fd)
            files.close()
            remove_tree(workdir)
            self._start_error(exc, f"could not start worker {worker_id}")
            return False
        try:
            slot = self._spawn_with(
                worker_id, token, marker, self.zygote, out_fd, cgroup, files, workdir, dir_fd
            )
        finally:
            os.close(out_fd)  # the worker holds its own copy as fds 1 and 2
            os.close(dir_fd)
            files.handed()  # the worker maps its own copies; no descriptor of ours leads to them
        if slot is None:
            files.close()
            remove_tree(workdir)
            return False
        slot.files, slot.workdir = files, workdir
        return True

    def _start_error(self, exc: OSError, what: str = "could not start a worker") -> None:
        if is_shortage(exc):
            self.shortage.count("worker_start", exc)
        self.start_failed(f"{what}: {exc}")

    def _add(self, slot: WorkerSlot, cgroup: str | None) -> None:
        slot.cgroup = cgroup
        self.slots[slot.id] = slot
        self.link.peers[slot.ident] = slot
        slot.timer = self.timers.call_later(self.start_timeout, self._start_timed_out, slot)

    def _spawn_with(
        self,
        worker_id: str,
        token: str,
        marker: str,
        zygote: Zygote | None,
        out_fd: int,
        cgroup: str | None,
        files: WorkerFiles,
        workdir: str,
        dir_fd: int,
    ) -> WorkerSlot | None:
        assert self.tg is not None
        now = self.timers.clock()
        if zygote is not None and not zygote.lost:
            fds = [out_fd, files.marker_fd, files.endlog_fd, dir_fd]
            if files.proof_fd >= 0:
                fds.append(files.proof_fd)  # LADDER-PROOF: the worker maps it before it forks anything
            if zygote.request(worker_id, token, marker, self.heartbeat, fds):
                # The pid comes back from the zygote (``_zygote_pids``); until then it is 0.
                slot = WorkerSlot(worker_id=worker_id, pid=0, fd=None, token=token, marker=marker, now=now)
                self._add(slot, cgroup)
                return slot
            self._zygote_lost(zygote)
        files.drop_proof()  # LADDER-PROOF: a fresh interpreter is not given the page: nothing to prove by
        try:
            pid = _procs.spawn_worker(
                endpoint=self.link.endpoint,
                worker_id=worker_id,
                token=token,
                marker=marker,
                life_fd=self.life_r,
                heartbeat=self.heartbeat,
                python=self.python,
                extra_args=self.worker_args,
                cgroup=cgroup,
                out_fd=out_fd,
                cwd=workdir,
                pythonpath=self.pythonpath,
                own_fds=(files.marker_fd, files.endlog_fd),
            )
        except OSError as exc:
            if cgroup is not None:
                proctree.cgroup_remove(cgroup)
            self._start_error(exc)
            return None
        if self.output is not None:
            self.output.name(worker_id, pid)
        slot = WorkerSlot(
            worker_id=worker_id, pid=pid, fd=_procs.pidfd(pid), token=token, marker=marker, now=now
        )
        if cgroup is not None:
            _procs.CGROUPS[pid] = cgroup
        self._add(slot, cgroup)
        self.tg.start_soon(self._watch, slot)
        return slot

    # ---- the zygote --------------------------------------------------------------------

    async def _zygote_loop(self, zygote: Zygote) -> None:
        while not zygote.lost:
            await anyio.wait_readable(zygote.resp_fd)
            if self.zygote is not zygote:
                return
            self.zygote_pids()
        self._zygote_lost(zygote)

    def zygote_pids(self) -> None:
        """Read the pids the zygote reports for the workers it forked."""
        zygote = self.zygote
        if zygote is None:
            return
        for worker_id, pid in zygote.read():
            slot = self.slots.get(worker_id)
            if slot is None or slot.pid:
                continue
            if pid <= 0:
                self._drop_unborn(slot, f"the zygote could not fork worker {worker_id} (errno {-pid})")
                continue
            slot.pid = pid
            slot.fd = _procs.pidfd(pid)
            if slot.cgroup is not None:
                _procs.CGROUPS[pid] = slot.cgroup
            if self.output is not None:
                self.output.name(worker_id, pid)
            assert self.tg is not None
            self.tg.start_soon(self._watch, slot)
            if slot.state == "stopping":  # retired before its pid was known
                _procs.signal_tree(pid, signal.SIGKILL, known=slot.known)
            ready, slot.deferred_ready = slot.deferred_ready, None
            if ready is not None:
                self.on_message(slot, ready)
        if zygote.lost:
            self._zygote_lost(zygote)

    def _drop_unborn(self, slot: WorkerSlot, reason: str) -> None:
        """A slot whose worker will never exist (the zygote failed or died before forking it)."""
        if slot.timer is not None:
            slot.timer.cancel()
        if slot.cgroup is not None:
            proctree.cgroup_remove(slot.cgroup)
        self._drop_own(slot)
        slot.state = "dead"
        self.slots.pop(slot.id, None)
        self.link.peers.pop(slot.ident, None)
        if not self.closing:  # (while closing it is no failure: the worker is not wanted)
            self.start_failed(reason)
        self.changed()
        self.refill()

    def _zygote_lost(self, zygote: Zygote) -> None:
        """The zygote exited: workers asked of it and not reported are never coming; start
        the next ones as fresh interpreters."""
        if self.zygote is not zygote:
            return
        self.zygote = None
        if not self.closing:
            log.warning("the zygote (pid %s) is gone: starting workers as fresh interpreters", zygote.pid)
        assert self.tg is not None
        self.tg.start_soon(self._reap_zygote, zygote)
        for slot in [s for s in self.slots.values() if not s.pid]:
            self._drop_unborn(slot, "the zygote exited before forking the worker")
        self.refill()

    async def _reap_zygote(self, zygote: Zygote) -> None:
        with anyio.CancelScope(shield=True):
            zygote.close_requests()
            with anyio.move_on_after(self.stop_timeout):
                await _procs.wait_exit(zygote.pid, zygote.fd)
            if _procs.reap(zygote.pid) is None and _procs.alive(zygote.pid):
                await _procs.kill_and_reap([zygote.pid])
            zygote.read()  # embryos announced meanwhile
            # Unassigned embryos see EOF on their pipe once the zygote is gone and exit; they are
            # our children (re-parented), so reap them.
            for pid in list(zygote.embryos):
                fd = _procs.pidfd(pid)
                with anyio.move_on_after(self.stop_timeout):
                    await _procs.wait_exit(pid, fd)
                if fd is not None:
                    os.close(fd)
                if _procs.reap(pid) is None and _procs.alive(pid):
                    await _procs.kill_and_reap([pid])
            zygote.close()

    async def stop_zygote(self) -> None:
        zygote = self.zygote
        if zygote is None:
            return
        self.zygote = None
        await self._reap_zygote(zygote)

    def boost(self, slot: WorkerSlot) -> None:
        """WORKER-SHARE-AT-CANCEL: ``slot``'s turn is cancelled: its worker weighs a program until idle, or
        what we weigh (WORKER-SUPERVISOR-WEIGHT: where we were raised, one such worker at a time)."""
        if slot.pid and not self.hurry(slot):
            self.share.boost(slot.pid, self.nice)

    def hurry(self, slot: WorkerSlot) -> bool:
        """WORKER-SUPERVISOR-WEIGHT: ``slot``'s worker is stopping: it weighs what we weigh (one at a
        time)."""
        return bool(slot.pid) and self.own_nice is not None and self.share.hurry(slot.pid, self.own_nice)

    def settle(self, slot: WorkerSlot) -> None:
        """``slot`` is idle again: back to the pool's share if it was boosted."""
        self.share.settle(slot.pid, self._fill_target, self.nice)

    # ---- retiring and exits ------------------------------------------------------------

    def _start_timed_out(self, slot: WorkerSlot) -> None:
        if slot.state == "starting" and not slot.pid:
            self._drop_unborn(
                slot, f"the zygote reported no pid for worker {slot.id} within {self.start_timeout}s"
            )
            return
        if slot.state == "starting":
            slot.failure = f"worker {slot.id} (pid {slot.pid}) sent no Ready within {self.start_timeout}s"
            self.last_start_error = slot.failure
            _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)

    def retire(self, slot: WorkerSlot) -> None:
        """Ask an idle worker to exit; kill its tree if it has not within ``stop_timeout``."""
        if slot.state in ("stopping", "dead"):
            return
        was = slot.state
        slot.state = "stopping"
        if slot.timer is not None:
            slot.timer.cancel()
        if not slot.pid and self.closing:
            self._abandon_preloading_zygote()
            if slot.id not in self.slots:
                return  # dropped unborn with the zygote
        if was == "idle":
            self.link.send(slot, worker_link.Shutdown())
            slot.timer = self.timers.call_later(self.stop_timeout, self._stop_timed_out, slot)
        else:
            _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)

    def _abandon_preloading_zygote(self) -> None:
        """Closing while the zygote still imports its preload (a start interrupted by Ctrl-C, a
        preload that never returns): it has forked no worker yet and none is needed any more, so
        it is killed now instead of waited for; its unborn slots are dropped with it (API-SYNC)."""
        zygote = self.zygote
        if zygote is None:
            return
        self.zygote_pids()  # take what it already reported
        if self.zygote is not zygote or zygote.ready:
            return  # it forks workers: their pids come, and each is killed then (``zygote_pids``)
        log.info("closing while the zygote (pid %s) still imports its preload: killing it", zygote.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(zygote.pid, signal.SIGKILL)
        zygote.lost = True
        self._zygote_lost(zygote)

    def _stop_timed_out(self, slot: WorkerSlot) -> None:
        if slot.state != "dead":
            log.warning("worker %s (pid %s) did not exit after Shutdown: killing its tree", slot.id, slot.pid)
            _procs.signal_tree(slot.pid, signal.SIGKILL, known=slot.known)

    async def _watch(self, slot: WorkerSlot) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await _procs.wait_exit(slot.pid, slot.fd)
            finally:
                if slot.fd is not None:
                    os.close(slot.fd)
                    slot.fd = None
            await self.on_exit(slot)

    async def reap_exit(self, slot: WorkerSlot) -> int | None:
        """The worker's pid exited: reap it with its whole tree and forget the slot (``Reaper``).
        Returns its exit code."""
        return await self.reaper.reap(slot)

    def _drop_own(self, slot: WorkerSlot) -> None:
        """A worker that never ran: drop its marker, End log and directory at once."""
        if slot.files is not None:
            slot.files.close()
            slot.files = None
        if slot.workdir is not None:
            remove_tree(slot.workdir)
            slot.workdir = None

    def read_noted(self, slot: WorkerSlot) -> tuple[str, float] | None:
        """LADDER-EARLY: the turn ``slot``'s worker last noted it started, and when; ``None`` if none."""
        return slot.files.noted() if slot.files is not None else None

    def drop_files_later(self, slot: WorkerSlot) -> None:
        """LADDER-SETTLE: drop a dead worker's start marker and End log unread, in a loop callback
        after the one delivering its turn's result."""
        files, slot.files = slot.files, None
        if files is not None:
            asyncio.get_running_loop().call_soon(files.close)

    def take_noted(self, slot: WorkerSlot) -> tuple[str, float] | None:
        """After the worker exited: the turn its start marker names and when it started it (LADDER-EARLY)."""
        return self.read_noted(slot)

    def take_end_log(self, slot: WorkerSlot) -> list[tuple[float, Any]]:
        """After the worker exited: the ends it logged (WORKER-END-LOG) as ``(start time, End)``, oldest
        first, checked against the worker's pid; its marker and log are then dropped."""
        files, slot.files = slot.files, None
        if files is None:
            return []
        records = files.ends(slot.pid)
        files.close()
        return records
