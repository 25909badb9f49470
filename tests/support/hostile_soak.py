"""The hostile-neighbour soak: one ``turnpool serve`` under every attack of one round at once.

A real daemon (its own runtime dir, a journal, a CURVE ``tcp://`` client endpoint, ``--http`` on
loopback with a token) starts with RLIMIT_NOFILE lowered to ``--fd-limit`` (soft and hard). For
``--duration`` seconds, all at once:

- floods (``tests/support/hostile_floods.py``), each bounded in count, bytes and time, loopback
  only: half-open HTTP connections (a request line and one header, never finished), connections
  streaming one endless header, raw TCP connections to the CURVE endpoint that never handshake;
  beside them an authenticated HTTP client asks for a turn about once a second;
- a second ``turnpool serve`` on the same journal from another network namespace
  (``unshare --net``, root only: skipped with the reason otherwise) and one through a hard link to
  the journal; each is recorded as refused (and why) or started (and then stopped);
- hostile agents (``tests/agents/hostile_neighbour.py``): a forger aiming at another worker's
  long ``victim`` turn, one that wipes its working directory (once, half-way), one whose thread
  keeps forking after it returned, a setsid double fork that leaves its cgroup before the turn
  crashes, one that SIGKILLs its own worker;
- ordinary clients submitting small turns with unique ids throughout: one connected from before
  the floods, the others through a fresh connection every few turns, as CLI users do.

Every agent appends its turn id to a run log before anything else, so executions are counted by
the agents themselves. At the end the daemon is stopped (SIGTERM; if that goes wrong, it is
restarted once on its journal, as an operator would, before anything is counted) and the report
gives: turns acknowledged, turns that ran twice, turns lost (acknowledged, no result in the
journal), forged results, processes left (the check of ``tests/conftest.py``, plus every pid an
agent left behind), the daemon's fds and RSS before, at peak and after, whether it stayed alive,
and what each flood and each second daemon met. ``Report.invariants()`` names every check; the CI version
(``tests/test_hostile_soak.py``) asserts the ones listed there.

``make soak-hostile`` (``python -m tests.support.hostile_soak``) runs it and appends its figures
to ``benchmarks/SOAK.md``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import resource
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psutil

from supervisor import Client, TurnpoolError
from tests.agents.hostile_neighbour import FORGED
from tests.support import daemonkit, hostile_floods, leftovers, memkit
from tests.support.soak import _alive_with_start

HOSTILE = "tests.agents.hostile_neighbour"
TOKEN = "hostile-soak-token"
ORDINARY = "tests.agents.soak:counted"  # kind "noop": notes its run and returns None


ATTACKS = ("floods", "second-daemon", "forge", "wipe", "thread_forker", "escape", "suicide")


@dataclass
class Plan:
    """How hard each attack pushes; ``quick()`` and ``ci()`` are smaller."""

    duration: float = 120.0
    fd_limit: int = 256
    workers: int = 3
    half_open: int = 300  # half-open HTTP connections, from the start
    half_open_late: int = 0  # more of them, opened at 60 % of the run (past the fd limit at the end)
    header_streams: int = 4
    header_mib: int = 64  # per endless-header connection
    raw_tcp: int = 100  # raw TCP connections to the CURVE endpoint
    fresh_client_every: int = 10  # ordinary turns per connection
    submitters: int = 2
    hostile_every: float = 2.0  # seconds between two hostile turns
    victim_seconds: float = 3.0
    linger: float = 120.0  # longest life of anything an agent leaves behind
    thread_children: int = 40
    settle: float = 60.0  # seconds the turns still running after the attacks have to end
    stop_timeout: float = 20.0  # seconds from SIGTERM (drain 0) to exit before the daemon is SIGKILLed
    skip: frozenset[str] = frozenset()  # attacks left out: ATTACKS names them

    @classmethod
    def quick(cls, duration: float = 30.0) -> Plan:
        return cls(duration=duration, half_open=200, header_streams=2, header_mib=16, raw_tcp=60)

    @classmethod
    def ci(cls) -> Plan:
        return cls(
            duration=8.0,
            fd_limit=160,
            half_open=40,
            half_open_late=80,
            header_streams=1,
            header_mib=4,
            raw_tcp=25,
            hostile_every=0.5,
            victim_seconds=2.0,
            linger=60.0,
            thread_children=15,
            settle=10.0,
            stop_timeout=10.0,
        )


@dataclass
class Sample:
    seconds: float
    fds: int
    rss_mb: float
    processes: int  # the daemon's descendants


@dataclass
class Report:
    plan: Plan
    seconds: float = 0.0
    acked: dict[str, str] = field(default_factory=dict)  # turn id -> kind
    outcomes: dict[str, collections.Counter[str]] = field(default_factory=dict)  # kind -> outcomes
    ran: collections.Counter[str] = field(default_factory=collections.Counter)
    lost: list[str] = field(default_factory=list)
    forged: list[str] = field(default_factory=list)  # turns whose result is the forger's
    agents_said: list[Any] = field(default_factory=list)
    ordinary_unfinished: list[str] = field(default_factory=list)
    submit_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    left: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    before: Sample | None = None
    after: Sample | None = None
    daemon_died: str | None = None  # what was seen when it died during the run
    daemon_exit: int | None = None
    second_daemon: dict[str, str] = field(default_factory=dict)
    second_pids: list[int] = field(default_factory=list)
    main_pid: int = 0
    floods: dict[str, dict[str, int]] = field(default_factory=dict)
    stderr_emfile: int = 0
    stderr_lines: int = 0
    status_end: dict[str, Any] = field(default_factory=dict)
    stop_seconds: float = 0.0
    idle_at_end: bool = False  # every turn had ended within ``plan.settle`` of the attacks' end
    recovery: str = ""  # when the stop went wrong: what a restart on the journal did

    @property
    def ran_twice(self) -> list[str]:
        return sorted(t for t, n in self.ran.items() if n > 1)

    def invariants(self) -> dict[str, bool]:
        """Every check by name: True when it held in this run."""
        b, a = self.before, self.after
        ordinary = [t for t, k in self.acked.items() if k == "ordinary"]
        header = self.floods.get("endless HTTP header", {})
        probe = self.floods.get("authenticated HTTP client", {})
        return {
            "turns_lost_0": not self.lost,
            "daemon_alive_throughout": self.daemon_died is None,
            "no_process_left": not self.left,
            # An escape's grandchild (setsid, root cgroup, fds closed) after its turn crashed is
            # counted apart: the crashed path's sweep is the promise still being made.
            "no_process_left_but_escapes": not [p for p in self.left if not p.endswith("agent: escape")],
            "ran_twice_0": not self.ran_twice,
            "no_forged_result": not self.forged,
            "second_daemon_refused": bool(self.second_daemon)
            and all(v.startswith(("refused", "skipped")) for v in self.second_daemon.values()),
            "ordinary_turns_all_completed": bool(ordinary) and not self.ordinary_unfinished,
            "idle_within_settle": self.idle_at_end,
            "daemon_exit_0": self.daemon_exit == 0,
            "fds_back_near_start": b is not None and a is not None and a.fds <= b.fds + 16,
            "rss_bounded": b is not None
            and bool(self.samples)
            and max(s.rss_mb for s in self.samples) <= b.rss_mb + 64,
            "no_emfile_in_stderr": self.stderr_emfile == 0,
            # Cut: the daemon closed (or answered and closed) every endless header. A stall (the
            # daemon no longer reading) is not a bound: an overwhelmed event loop does that too.
            "endless_header_cut": "floods" in self.plan.skip
            or header.get("cut_by_daemon", 0) >= self.plan.header_streams,
            # DAEMON-FD: while half-open connections hold the HTTP front end's share, a new connection is
            # refused (503) rather than the daemon dying; an authenticated client is served between
            # them, as the header deadline (HTTP-BOUND) frees the share.
            "http_served_under_flood": probe.get("ok", 0) > 0,
        }


def _lower_nofile(limit: int) -> Callable[[], None]:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return lower


def _sample(pid: int, t0: float) -> Sample | None:
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return Sample(
                time.monotonic() - t0,
                p.num_fds(),
                p.memory_info().rss / 2**20,
                len(p.children(recursive=True)),
            )
    except psutil.Error:
        return None


# -- the run ----------------------------------------------------------------------------------------


async def hostile_soak(plan: Plan, *, progress: bool = False, keep_home: str | None = None) -> Report:
    """Run ``plan``; with ``keep_home``, a run whose checks did not all hold leaves a copy of its
    directory there (the daemon's stderr, the journal, the run and pid logs)."""
    import zmq.auth

    report = Report(plan)
    home = daemonkit.short_dir()
    keys, allowed = home / "keys", home / "allowed"
    keys.mkdir()
    allowed.mkdir()
    server_pub, server_sec = zmq.auth.create_certificates(str(keys), "server")
    client_pub, client_sec = zmq.auth.create_certificates(str(keys), "client")
    os.rename(client_pub, allowed / "client.key")
    token = home / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    journal = home / "journal.db"
    runs_log, pids_log = str(home / "runs.log"), str(home / "pids.log")
    before_us = {p.pid for p in leftovers.descendants()}

    def say(text: str) -> None:
        if progress:
            print(f"  [{time.monotonic() - t0:6.1f}s] {text}", file=sys.stderr, flush=True)

    t0 = time.monotonic()
    served = daemonkit.start(
        "--workers",
        str(plan.workers),
        "--spares",
        "1",
        "--grace",
        "0.5",
        "--kill-after",
        "0.5",
        "--drain",
        "0",
        "--journal",
        str(journal),
        "--curve-secret-key",
        server_sec,
        "--curve-clients",
        str(allowed),
        *daemonkit.HTTP,
        "--http-token",
        str(token),
        "--allow-agent",  # SEC-SHARED: a tcp endpoint names the agents its clients may run
        f"{HOSTILE}:*",
        "--allow-agent",
        ORDINARY.split(":")[0] + ":*",
        home=home,
        endpoint="tcp://127.0.0.1:0",
        preexec_fn=_lower_nofile(plan.fd_limit),
    )
    report.main_pid = served.pid
    curve = {"curve_server_key": server_pub, "curve_secret_key": client_sec}
    stop_floods = threading.Event()
    threads: list[threading.Thread] = []
    stack = contextlib.AsyncExitStack()
    try:
        tcp_host, tcp_port = served.endpoint[len("tcp://") :].rsplit(":", 1)
        http_host, http_port = served.http_url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
        say(f"daemon {served.pid} on {served.endpoint}, http {served.http_url}, fd limit {plan.fd_limit}")

        def request(kind: str, **extra: Any) -> dict[str, Any]:
            return {"kind": kind, "log": runs_log, "pids": pids_log, "linger": plan.linger, **extra}

        async with Client.connect(served.endpoint, request_timeout=30, **curve) as client:
            with anyio.fail_after(60):  # warm: a worker answered before "before" is measured
                await client.run(ORDINARY, request("noop"), turn_id="warm")
            report.acked["warm"] = "warm"
        report.before = _sample(served.pid, t0)
        if report.before is not None:
            report.samples.append(report.before)
        say(f"before: {report.before}")

        # Opened before the floods: a client that stays connected (submitter 0 and the final
        # accounting) and the hostile agents' client; the other submitters reconnect often.
        steady = await stack.enter_async_context(Client.connect(served.endpoint, request_timeout=15, **curve))
        hclient = await stack.enter_async_context(
            Client.connect(served.endpoint, request_timeout=15, **curve)
        )
        floods: dict[str, dict[str, int]] = {
            "half-open HTTP": collections.Counter(),
            "endless HTTP header": collections.Counter(),
            "raw TCP to the CURVE endpoint": collections.Counter(),
            "authenticated HTTP client": collections.Counter(),
        }
        report.floods = floods
        hport, tport = int(http_port), int(tcp_port)
        threads.append(
            threading.Thread(
                target=hostile_floods.half_open_http,
                args=(http_host, hport, plan.half_open, stop_floods, floods["half-open HTTP"]),
            )
        )
        if plan.half_open_late:
            late = (
                http_host,
                hport,
                plan.half_open_late,
                stop_floods,
                floods["half-open HTTP"],
                plan.duration * 0.6,
            )
            threads.append(threading.Thread(target=hostile_floods.half_open_http, args=late))
        threads.extend(
            threading.Thread(
                target=hostile_floods.endless_header,
                args=(http_host, hport, plan.header_mib, stop_floods, floods["endless HTTP header"]),
            )
            for _ in range(plan.header_streams)
        )
        threads.append(
            threading.Thread(
                target=hostile_floods.raw_tcp,
                args=(tcp_host, tport, plan.raw_tcp, stop_floods, floods["raw TCP to the CURVE endpoint"]),
            )
        )
        if "floods" in plan.skip:
            threads.clear()
        probe = (http_host, hport, TOKEN, stop_floods, floods["authenticated HTTP client"])
        threads.append(threading.Thread(target=hostile_floods.http_probe, args=probe))
        for th in threads:
            th.start()

        end_at = time.monotonic() + plan.duration
        done = anyio.Event()

        def daemon_gone() -> bool:
            if report.daemon_died is None and served.proc.poll() is not None:
                report.daemon_died = f"exit {served.proc.returncode} at {time.monotonic() - t0:.1f}s"
                say(f"DAEMON DIED: {report.daemon_died}")
            return report.daemon_died is not None

        async def sampler() -> None:
            while not done.is_set():
                if daemon_gone():
                    return
                s = _sample(served.pid, t0)
                if s is not None:
                    report.samples.append(s)
                with anyio.move_on_after(0.5):
                    await done.wait()

        async def submit_ordinary(c: Client, tid: str) -> None:
            await c.submit(ORDINARY, request("noop"), turn_id=tid)
            report.acked[tid] = "ordinary"
            with anyio.move_on_after(15):
                await c.result(tid)

        async def ordinary(index: int) -> None:
            n = 0
            while time.monotonic() < end_at and not daemon_gone():
                try:
                    if index == 0:
                        await submit_ordinary(steady, f"ord-steady-{n}")
                        n += 1
                        continue
                    async with Client.connect(served.endpoint, timeout=10, request_timeout=15, **curve) as c:
                        for _ in range(plan.fresh_client_every):
                            if time.monotonic() >= end_at:
                                return
                            await submit_ordinary(c, f"ord-{index}-{n}")
                            n += 1
                except (TurnpoolError, OSError) as exc:
                    what = "steady client" if index == 0 else "fresh client"
                    report.submit_errors[f"{what}: {type(exc).__name__}"] += 1
                    with anyio.move_on_after(0.5):  # not a sync: a pause before the next try
                        await done.wait()

        async def submit_hostile(tid: str, kind: str, agent: str, inp: dict[str, Any]) -> None:
            try:
                await hclient.submit(agent, inp, turn_id=tid)
                report.acked[tid] = kind
            except (TurnpoolError, OSError) as exc:
                report.submit_errors[f"{kind}: {type(exc).__name__}"] += 1

        async def hostile() -> None:
            kinds = [k for k in ("victim_forge", "thread_forker", "escape", "suicide") if k not in plan.skip]
            if "forge" in plan.skip:
                kinds.remove("victim_forge")
            wiped = "wipe" in plan.skip
            if not kinds:
                return
            i = 0
            while time.monotonic() < end_at and not daemon_gone():
                kind = kinds[i % len(kinds)]
                if not wiped and time.monotonic() > end_at - plan.duration / 2:
                    kind, wiped = "wipe", True
                tid = f"h-{kind}-{i}"
                if kind == "victim_forge":
                    victim = f"victim-{i}"
                    await submit_hostile(
                        victim, "victim", f"{HOSTILE}:victim", request("v", seconds=plan.victim_seconds)
                    )
                    forger = request("f", prefix="victim-", seconds=plan.victim_seconds)
                    await submit_hostile(tid, "forge", f"{HOSTILE}:forge", forger)
                elif kind == "thread_forker":
                    forker = request("t", children=plan.thread_children)
                    await submit_hostile(tid, kind, f"{HOSTILE}:thread_forker", forker)
                else:
                    await submit_hostile(tid, kind, f"{HOSTILE}:{kind}", request(kind))
                i += 1
                with anyio.move_on_after(plan.hostile_every):  # the pace of the attacks
                    await done.wait()

        async def neighbours() -> None:
            with anyio.move_on_after(plan.duration / 4):  # a quarter of the way in, under the floods
                await done.wait()
            if "second-daemon" not in plan.skip and not done.is_set():
                report.second_daemon = await anyio.to_thread.run_sync(
                    hostile_floods.second_daemons, journal, report.second_pids
                )
                say(f"second daemon: {report.second_daemon}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler)
            tg.start_soon(neighbours)
            # The clients stop at the end of the run even in the middle of a request (a connect
            # or a result the exhausted daemon leaves unanswered): what was acknowledged counts.
            with anyio.move_on_after(plan.duration + 1):
                async with anyio.create_task_group() as clients:
                    clients.start_soon(hostile)
                    for index in range(plan.submitters):
                        clients.start_soon(ordinary, index)
            say("submitting over; floods closed")
            stop_floods.set()
            for th in threads:
                await anyio.to_thread.run_sync(th.join, 30)
            if not daemon_gone():
                try:
                    with anyio.move_on_after(plan.settle) as settling:
                        await steady.when_idle()
                    report.idle_at_end = not settling.cancelled_caught
                    report.status_end = await steady.status()
                except (TurnpoolError, OSError) as exc:
                    report.submit_errors[f"final: {type(exc).__name__}"] += 1
            if report.before is not None and not daemon_gone():
                # Closed connections and freed memory take the daemon a moment (MEM-TRIM: memory is
                # handed back once a second): "after" is read once they are back, or at a bound.
                daemon = psutil.Process(served.pid)
                with anyio.move_on_after(5):
                    while True:
                        if daemon.num_fds() <= report.before.fds + 16:
                            break
                        await anyio.sleep(0.1)  # allowed: pacing a bounded poll of the daemon's fds
                await memkit.rss_under(daemon, int((report.before.rss_mb + 16) * 2**20), limit=5)
            report.after = _sample(served.pid, t0)
            if report.after is not None:
                report.samples.append(report.after)
            done.set()
        say(f"after: {report.after}")
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            await stack.aclose()
        stop_floods.set()
        for th in threads:
            th.join(30)
        daemon_gone_now = served.proc.poll() is not None
        if daemon_gone_now and report.daemon_died is None:
            report.daemon_died = f"exit {served.proc.returncode} before the stop"
        stopping = time.monotonic()
        daemonkit.stop_process(served.proc, timeout=plan.stop_timeout)
        report.stop_seconds = time.monotonic() - stopping
        report.daemon_exit = served.proc.returncode
        report.seconds = time.monotonic() - t0

    if report.daemon_exit != 0:
        report.recovery = await anyio.to_thread.run_sync(_recover, journal, plan.settle)
    _account(report, journal, runs_log, pids_log, before_us, home)
    if keep_home is None or all(report.invariants().values()):
        shutil.rmtree(home, ignore_errors=True)
    else:
        try:
            shutil.copytree(home, keep_home, ignore=shutil.ignore_patterns("*.sock"), dirs_exist_ok=True)
        except (OSError, shutil.Error) as exc:
            report.submit_errors[f"keeping the run's directory: {exc}"[:160]] += 1
        shutil.rmtree(home, ignore_errors=True)
    return report


def _recover(journal: Path, settle: float) -> str:
    """After a stop that went wrong: what an operator does, ``turnpool serve`` again on the journal
    (no attack, no fd limit) until its recovered turns are done, then a clean stop. A turn
    acknowledged before is lost only if it has no result after this."""

    async def wait_idle(endpoint: str) -> str:
        async with Client.connect(endpoint, request_timeout=60) as client:
            with anyio.move_on_after(settle) as scope:
                await client.when_idle()
            return "idle" if not scope.cancelled_caught else f"not idle after {settle:g} s"

    try:
        with daemonkit.serving("--journal", str(journal), *daemonkit.FAST) as d:
            state = anyio.run(wait_idle, d.endpoint)
            stopping = time.monotonic()
        return f"restarted on the journal, {state}, stopped in {time.monotonic() - stopping:.1f} s"
    except Exception as exc:  # noqa: BLE001 - a journal the run damaged is a finding, not a crash
        return f"restart on the journal failed: {type(exc).__name__}: {str(exc)[:160]}"


def _account(
    report: Report, journal: Path, runs_log: str, pids_log: str, before_us: set[int], home: Path
) -> None:
    """After the stop: results from the journal, executions from the run log, what is left."""
    from supervisor.journal.reader import lookup_on, open_reader

    if os.path.exists(runs_log):
        report.ran.update(Path(runs_log).read_text().split())
    try:
        record = open_reader(journal)
    except Exception as exc:  # noqa: BLE001 - a journal a second daemon damaged is a finding
        report.lost = sorted(report.acked)
        report.submit_errors[f"journal unreadable: {exc}"[:120]] += 1
        record = None
    if record is not None:
        try:
            for tid, kind in report.acked.items():
                found = lookup_on(record, tid)
                result = found[2] if found is not None else None
                if result is None:
                    report.lost.append(tid)
                    continue
                report.outcomes.setdefault(kind, collections.Counter())[result.outcome] += 1
                output = result.output
                if output == FORGED:
                    report.forged.append(tid)
                elif kind in ("forge", "wipe") and isinstance(output, dict):
                    report.agents_said.append({kind: output})
                if kind == "ordinary" and result.outcome != "completed":
                    err = f"{result.error.type}: {result.error.message}"[:80] if result.error else ""
                    report.ordinary_unfinished.append(f"{tid}: {result.outcome} {err} cause={result.cause}")
        finally:
            record.close()
    # What is left: descendants of this process (the conftest check), then every pid noted by an
    # agent's leftover (an escape that left the root cgroup is found by its pid and start time).
    left = [p for p in leftovers.descendants() if p.pid not in before_us]
    noted: dict[int, tuple[str, str]] = {}  # pid -> (start time, the agent that left it)
    if os.path.exists(pids_log):
        for line in Path(pids_log).read_text().splitlines():
            pid, start, kind = line.split()
            noted[int(pid)] = (start, kind)
    owners = {report.main_pid: "the daemon's", **{p: "a second daemon's" for p in report.second_pids}}
    whose: dict[int, str] = {}
    for p in left:
        if p.pid in noted:
            whose[p.pid] = f"left by an agent: {noted[p.pid][1]}"
            continue
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if "--parent-pid" in cmd:
            parent = int(cmd[cmd.index("--parent-pid") + 1])
            whose[p.pid] = f"a worker or zygote of {owners.get(parent, f'pid {parent}')}"
    desc, zombies = leftovers.clear(left, timeout=1.0)
    report.left += [f"{d.split()[0]}: {whose.get(int(d.split()[0]), d.split(' ', 1)[-1])}" for d in desc]
    report.left += [f"{z}: unreaped zombie" for z in zombies]
    for pid, (start, kind) in noted.items():  # gone from our tree (e.g. re-parented to init)
        if _alive_with_start(pid, start):
            report.left.append(f"{pid} (outside this process's tree): left by an agent: {kind}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    err = home / "stderr.log"
    if err.exists():
        text = err.read_text(errors="replace")
        report.stderr_lines = text.count("\n")
        report.stderr_emfile = text.count("Too many open files")


# -- the report -------------------------------------------------------------------------------------


def summary(report: Report) -> str:
    b, a = report.before, report.after
    peak_fds = max((s.fds for s in report.samples), default=0)
    peak_rss = max((s.rss_mb for s in report.samples), default=0.0)
    peak_procs = max((s.processes for s in report.samples), default=0)
    kinds = collections.Counter(report.acked.values())

    def fmt(s: Sample | None, what: str) -> str:
        return "—" if s is None else (str(s.fds) if what == "fds" else f"{s.rss_mb:.1f}")

    rows = [
        (
            "turns acknowledged",
            f"{len(report.acked)} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})",
        ),
        ("turns that ran twice", f"{len(report.ran_twice)} {report.ran_twice[:5] or ''}"),
        ("turns lost (acknowledged, no result)", f"{len(report.lost)} {report.lost[:5] or ''}"),
        ("forged results accepted", f"{len(report.forged)} {report.forged[:5] or ''}"),
        (
            "ordinary turns not completed",
            f"{len(report.ordinary_unfinished)} {report.ordinary_unfinished[:3] or ''}",
        ),
        ("processes left after the stop", f"{len(report.left)} {report.left[:5] or ''}"),
        ("daemon alive throughout", "yes" if report.daemon_died is None else f"NO ({report.daemon_died})"),
        ("every turn ended within the settle time", "yes" if report.idle_at_end else "NO"),
        ("daemon exit status at the stop", f"{report.daemon_exit} after {report.stop_seconds:.1f} s"),
        ("after a stop that went wrong", report.recovery or "—"),
        ("daemon fds before / peak / after", f"{fmt(b, 'fds')} / {peak_fds} / {fmt(a, 'fds')}"),
        ("daemon RSS MiB before / peak / after", f"{fmt(b, 'rss')} / {peak_rss:.1f} / {fmt(a, 'rss')}"),
        ("daemon's descendants at peak", str(peak_procs)),
        ("daemon stderr: lines / 'Too many open files'", f"{report.stderr_lines} / {report.stderr_emfile}"),
    ]
    rows += [(f"second daemon, {k}", v) for k, v in report.second_daemon.items()]
    rows += [
        (f"flood: {k}", ", ".join(f"{n} {v}" for n, v in sorted(d.items())) or "—")
        for k, d in report.floods.items()
    ]
    rows += [
        (f"outcomes: {k}", ", ".join(f"{o} {n}" for o, n in sorted(c.items())))
        for k, c in sorted(report.outcomes.items())
    ]
    if report.submit_errors:
        rows.append(("client errors", ", ".join(f"{k} {n}" for k, n in sorted(report.submit_errors.items()))))
    if report.agents_said:
        rows.append(("what the forgers and the wipe said", str(report.agents_said[:4])))
    table = "\n".join(["| figure | value |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in rows])
    checks = "\n".join(
        f"- {'held' if ok else '**FAILED**'}: `{name}`" for name, ok in report.invariants().items()
    )
    return f"{table}\n\nChecks (`Report.invariants()`):\n\n{checks}\n"


def markdown(report: Report, command: str) -> str:
    p = report.plan
    late = f" ({p.half_open_late} more at 60 % of the run)" if p.half_open_late else ""
    skipped = f"\n- left out: {', '.join(sorted(p.skip))}" if p.skip else ""
    return f"""
## Hostile-neighbour soak

Command: {command}. Run at {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())} on {os.cpu_count()} cores
(shared), Python {sys.version.split()[0]}; {report.seconds:.1f} s in all. One `turnpool serve` (journal on,
CURVE `tcp://` client endpoint, `--http` on loopback with a token, {p.workers} workers + 1 spare) started
with RLIMIT_NOFILE {p.fd_limit} (soft and hard), for {p.duration:.0f} s under all of these at once:

- {p.half_open} half-open HTTP connections{late}, {p.header_streams} endless-header connections (up to
  {p.header_mib} MiB each), {p.raw_tcp} raw TCP connections to the CURVE endpoint; an authenticated HTTP
  client asking for a turn about once a second;
- a second `turnpool serve` on the same journal from another network namespace, and one through a hard
  link to the journal;
- one hostile turn every {p.hostile_every:g} s, in turn: a forger aiming at another worker's long turn, a
  thread that keeps forking after its turn returned, a setsid grandchild that leaves for the root cgroup
  before its turn crashes, a SIGKILL of its own worker; once, half-way, an `rm -rf ./*` of its working
  directory;
- {p.submitters} ordinary clients submitting throughout (one connected from the start, the others through a
  fresh connection every {p.fresh_client_every} turns).{skipped}

Every agent counts its own executions; "lost" is read from the journal after the stop.

{summary(report)}"""


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.hostile_soak")
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds of attack (default 120; quick 30)"
    )
    parser.add_argument("--quick", action="store_true", help="smaller floods, 30 s")
    parser.add_argument(
        "--fd-limit", type=int, default=None, help="RLIMIT_NOFILE of the daemon (default 256)"
    )
    parser.add_argument("--report", default="benchmarks/SOAK.md", help="appended to ('-': print only)")
    parser.add_argument("--ci", action="store_true", help="the plan of tests/test_hostile_soak.py")
    parser.add_argument("--skip", action="append", default=[], choices=ATTACKS, help="leave out an attack")
    parser.add_argument("--keep", default=None, help="copy the run's directory here if a check failed")
    args = parser.parse_args()

    from worker import proctree

    proctree.set_child_subreaper()  # orphans come here, where the leftover check sees them
    if args.ci:
        plan = Plan.ci()
    elif args.quick:
        plan = Plan.quick(args.duration or 30.0)
    else:
        plan = Plan(duration=args.duration or 120.0)
    if args.fd_limit:
        plan.fd_limit = args.fd_limit
    plan.skip = frozenset(args.skip)
    print(f"hostile-neighbour soak: {plan}", file=sys.stderr)
    report = anyio.run(lambda: hostile_soak(plan, progress=True, keep_home=args.keep))
    flags = " ".join(sys.argv[1:])
    command = f"`make soak-hostile` (`.venv/bin/python -m tests.support.hostile_soak {flags}`)"
    text = markdown(report, command)
    print(text)
    if args.report != "-":
        with open(args.report, "a") as f:
            f.write(text)
        print(f"appended to {args.report}", file=sys.stderr)
    return 0 if all(report.invariants().values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
