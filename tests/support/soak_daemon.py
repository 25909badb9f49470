"""The daemon soak: ``turnpool serve`` with its journal, SIGKILLed again and again under load.

Clients submit turns with ids chosen here; every agent (``tests/agents/soak.py``) appends its
turn id to a run log before doing anything else, so the agents themselves count how often each
turn ran. Between submits the daemon is SIGKILLed at random points and restarted on the same
journal; a submit whose acknowledgement was lost is sent again with the same ``turn_id`` (as a
client would). The mix holds async agents that never await, forks without exec, output floods,
crashes, failures, cooperative turns that are cancelled, and clients that vanish mid-request.

At the end every acknowledged turn must have exactly one result (0 lost), no turn may have run
twice (none is submitted with ``retry=True``), nothing the daemon or an agent started may be
alive (0 survivors), and the daemon's fds and RSS are sampled to show they stay flat.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.lowlevel
import psutil
import zmq

import wire
from supervisor import Client, TurnpoolError
from tests.support import daemonkit
from tests.support.soak import _alive_with_start
from wire import client_link

AGENT = "tests.agents.soak:counted"

# kind -> (weight, outcomes allowed when no daemon kill interrupted the turn)
KINDS: dict[str, tuple[int, frozenset[str]]] = {
    "noop": (700, frozenset({"completed"})),
    "fail": (40, frozenset({"failed"})),
    "crash": (10, frozenset({"crashed"})),
    "spin": (6, frozenset({"killed"})),
    "sleep_sync": (6, frozenset({"killed"})),
    "forker": (30, frozenset({"completed"})),
    "flood": (15, frozenset({"completed"})),
    "slow": (30, frozenset({"aborted"})),
}
# A turn running when the daemon was SIGKILLed ends crashed (SupervisorLost) at the restart.
INTERRUPTED = "SupervisorLost"


@dataclass
class DaemonReport:
    turns: int = 0
    seconds: float = 0.0
    kills: int = 0
    acked: int = 0
    resubmitted: int = 0
    lost: list[str] = field(default_factory=list)
    ran_twice: dict[str, str] = field(default_factory=dict)
    ran_unseen: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    survivors: list[str] = field(default_factory=list)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    by_kind: dict[str, collections.Counter[str]] = field(default_factory=dict)
    vanished_clients: int = 0
    samples: list[tuple[int, int, int, float]] = field(default_factory=list)  # (round, acked, fds, rss MiB)
    kill_to_gone: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.ran_twice or self.ran_unseen or self.wrong or self.survivors)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _sample(report: DaemonReport, rnd: int, pid: int) -> None:
    try:
        p = psutil.Process(pid)
        report.samples.append((rnd, report.acked, p.num_fds(), p.memory_info().rss / 2**20))
    except psutil.Error:
        pass


async def _vanishing_clients(endpoint: str, ids: list[str], n: int) -> int:
    """Clients that ask for a follow and a result, then close without a word."""
    ctx = zmq.Context()
    done = 0
    try:
        for i in range(n):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            tid = ids[i % len(ids)] if ids else "none"
            for msg in (
                client_link.Hello(1, client_link.CLIENT_PROTOCOL_VERSION),
                client_link.Follow(2, tid),
                client_link.GetResult(3, tid),
            ):
                sock.send(wire.encode(msg), zmq.NOBLOCK)
            sock.close(linger=100)
            done += 1
            if i % 20 == 0:
                await anyio.lowlevel.checkpoint()
    except zmq.ZMQError:
        pass
    finally:
        ctx.term()
    return done


async def daemon_soak(
    turns: int = 1500,
    *,
    kills: int = 3,
    submitters: int = 6,
    workers: int = 2,
    seed: int = 11,
    vanish_per_round: int = 100,
    progress: bool = False,
) -> DaemonReport:
    rng = random.Random(seed)
    names = list(KINDS)
    plan = rng.choices(names, [KINDS[k][0] for k in names], k=turns)
    home = daemonkit.short_dir()
    journal = home / "journal.db"
    runs_log, pids_log = home / "runs.log", home / "pids.log"
    args = (
        "--workers",
        str(workers),
        "--spares",
        "1",
        "--grace",
        "0.3",
        "--kill-after",
        "0.3",
        "--drain",
        "0",
        "--journal",
        str(journal),
    )
    report = DaemonReport(turns=turns)
    pending: collections.deque[tuple[str, str]] = collections.deque((f"t{i}", plan[i]) for i in range(turns))
    acked: dict[str, str] = {}
    sent_once: set[str] = set()
    t0 = time.monotonic()

    def request(tid: str, kind: str) -> dict[str, object]:
        inp: dict[str, object] = {"kind": kind, "log": str(runs_log), "pids": str(pids_log)}
        return inp

    async def run_round(rnd: int, target: int | None) -> None:
        """One daemon life: submit until ``target`` acks, then SIGKILL it (``None``: the last,
        graceful round that submits the rest and waits for every turn to end)."""
        served = daemonkit.start(*args, home=home)
        stop = anyio.Event()
        try:
            async with Client.connect(served.endpoint, request_timeout=30) as client:
                _sample(report, rnd, served.pid)

                async def submitter(index: int) -> None:
                    r = random.Random(seed * 1000 + rnd * 100 + index)
                    while pending and not stop.is_set():
                        tid, kind = pending.popleft()
                        if tid in sent_once:
                            report.resubmitted += 1
                        sent_once.add(tid)
                        timeout = {"spin": 0.2, "sleep_sync": 0.2, "slow": 0.5}.get(kind)
                        try:
                            await client.submit(AGENT, request(tid, kind), turn_id=tid, timeout=timeout)
                        except (TurnpoolError, OSError):
                            pending.appendleft((tid, kind))  # the ack was lost: send it again later
                            return
                        acked[tid] = kind
                        report.acked = len(acked)
                        if kind == "slow" and r.random() < 0.5:
                            try:
                                await client.cancel(tid)
                            except (TurnpoolError, OSError):
                                return
                        if target is not None and len(acked) >= target:
                            stop.set()

                async with anyio.create_task_group() as tg:
                    for index in range(submitters):
                        tg.start_soon(submitter, index)
                    if vanish_per_round:
                        report.vanished_clients += await _vanishing_clients(
                            served.endpoint, list(acked)[-200:], vanish_per_round
                        )
                if target is not None:
                    _sample(report, rnd, served.pid)
                    tree = _descendants(served.pid)
                    served.proc.send_signal(signal.SIGKILL)
                    killed_at = time.monotonic()
                    report.kills += 1
                    await anyio.to_thread.run_sync(served.proc.wait)
                    gone, alive = await anyio.to_thread.run_sync(lambda: psutil.wait_procs(tree, timeout=10))
                    report.kill_to_gone.append(time.monotonic() - killed_at)
                    for p in gone:
                        with contextlib.suppress(ChildProcessError):
                            os.waitpid(p.pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG: our own orphans (we are a subreaper)
                    for p in alive:
                        try:
                            what = " ".join(p.cmdline())[:160]
                        except psutil.Error:
                            what = "?"
                        report.survivors.append(
                            f"round {rnd}: pid {p.pid} alive 10 s after the daemon's SIGKILL: {what}"
                        )
                        with contextlib.suppress(psutil.Error):
                            p.kill()
                    return
                with anyio.fail_after(300):
                    await client.when_idle()
                _sample(report, rnd, served.pid)
        finally:
            if served.proc.poll() is None:
                daemonkit.stop_process(served.proc)
            elif served.proc.stdout is not None:
                served.proc.stdout.close()
        if progress:
            print(f"  round {rnd}: {len(acked)} acked, {len(pending)} pending", flush=True)

    for rnd in range(kills):
        base = (rnd + 1) * turns // (kills + 1)
        await run_round(rnd, base + rng.randrange(0, max(1, turns // (4 * (kills + 1)))))
        if progress:
            print(f"  kill {rnd + 1}/{kills}: {len(acked)} acked", flush=True)
    while pending:  # the last life: everything left, then a graceful stop
        await run_round(kills, None)
    report.seconds = time.monotonic() - t0

    from supervisor.journal.reader import lookup_on as _lookup
    from supervisor.journal.reader import open_reader as _reader

    runs = (
        collections.Counter(Path(runs_log).read_text().split())  # noqa: ASYNC240 - after the run
        if runs_log.exists()
        else collections.Counter()
    )
    # One read connection for every lookup (each one-off read checks the whole file first).
    record = _reader(journal)
    for tid, kind in acked.items():
        found = _lookup(record, tid)
        result = found[2] if found is not None else None
        if result is None:
            report.lost.append(tid)
            continue
        report.outcomes[result.outcome] += 1
        report.by_kind.setdefault(kind, collections.Counter())[result.outcome] += 1
        interrupted = (
            result.outcome == "crashed" and result.error is not None and result.error.type == INTERRUPTED
        )
        if (
            result.outcome not in KINDS[kind][1]
            and not interrupted
            and not (kind == "slow" and result.outcome == "aborted")
        ):
            report.wrong.append(f"{tid} {kind}: {result.outcome} {result.error} cause={result.cause}")
        if runs[tid] > 1:
            report.ran_twice[tid] = (
                f"{kind} ran {runs[tid]} times; result {result.outcome} "
                f"attempts={result.attempts} error={result.error}"
            )
        if runs[tid] and not result.started:
            report.ran_unseen.append(f"{tid} {kind}: ran but its result says it never started")
    record.close()
    if pids_log.exists():
        for line in pids_log.read_text().splitlines():
            pid, start = line.split()
            if _alive_with_start(int(pid), start):
                report.survivors.append(f"pid {pid}: a forker's background process outlived its turn")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
    import shutil

    shutil.rmtree(home, ignore_errors=True)
    return report


def markdown(report: DaemonReport, command: str) -> str:
    cols = ["completed", "failed", "aborted", "killed", "crashed"]
    rows = ["| kind | turns | " + " | ".join(cols) + " |", "| --- | ---: |" + " ---: |" * len(cols)]
    for k in sorted(report.by_kind):
        c = report.by_kind[k]
        rows.append(f"| {k} | {sum(c.values())} | " + " | ".join(str(c.get(o, 0)) for o in cols) + " |")
    t = report.outcomes
    twice = len(report.ran_twice)
    rows.append(f"| **all** | {sum(t.values())} | " + " | ".join(str(t.get(o, 0)) for o in cols) + " |")
    curve = [
        "| daemon life | acked so far | daemon fds | daemon RSS (MiB) |",
        "| ---: | ---: | ---: | ---: |",
    ]
    curve += [f"| {r} | {a} | {f} | {m:.1f} |" for r, a, f, m in report.samples]
    gone = sorted(report.kill_to_gone)
    gone_line = (
        f"median {gone[len(gone) // 2] * 1000:.0f} ms, worst {gone[-1] * 1000:.0f} ms" if gone else "no kill"
    )
    verdict = (
        "All checks passed."
        if report.ok
        else (
            f"FAILURES: lost {report.lost[:5]}, ran twice {dict(list(report.ran_twice.items())[:5])}, "
            f"ran unseen {report.ran_unseen[:3]}, wrong {report.wrong[:5]}, survivors {report.survivors[:5]}"
        )
    )
    return f"""## Daemon soak: SIGKILL under load, exactly once

Command: `{command}`. {report.turns} turns with ids chosen by the clients, through `turnpool serve`
with its journal, SIGKILLed {report.kills} times at random points and restarted on the same journal;
{report.resubmitted} submits whose acknowledgement was lost were sent again with the same `turn_id`;
{report.vanished_clients} clients sent Follow + GetResult and vanished. {report.seconds:.1f} s in all.

- acknowledged: {report.acked}; lost: {len(report.lost)}; ran twice (counted by the agents): {twice};
  ran although recorded as never started: {len(report.ran_unseen)}; outcome not allowed: {len(report.wrong)}
- survivors (daemon trees after each SIGKILL, and every forker's background process): {len(report.survivors)}
- daemon SIGKILL → every process of its tree gone: {gone_line}

{verdict}

{chr(10).join(rows)}

Daemon fds and RSS (sampled at the start and end of each life):

{chr(10).join(curve)}
"""
