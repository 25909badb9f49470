"""Turns stuck before their first ``await``, client-chosen grace, and forged ends (issue 13, items 1 and 11).

SPEC "Precise points": a turn is escalatable from the moment its worker may run any of its code
(the import of the agent included): deadline, cancel, memory limit and disposal reach a turn whose
``Started`` never arrived, and such a turn that is then killed ends ``killed`` with ``started`` true.
Design rules LADDER-EARLY, LADDER-NO-STARTED and SEC-FORGE in ``docs/design.md``.

The stuck agents cannot emit (``emit`` is awaited), so each writes its pid to a file first; the
tests wait for that file (a bounded poll of another process's write), never for a sleep.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from supervisor import Client, Supervisor
from tests.support.daemonkit import serving
from tests.test_prefetch_zygote import EAGER, first_event, handed_to, seed

pytestmark = pytest.mark.anyio

FAST = {"workers": 1, "spares": 0, "grace": 0.2, "kill_after": 0.3}


async def wait_file(path: Path, bound: float = 60) -> str:
    """Wait (bounded) until another process has written ``path``; return its text."""
    with anyio.fail_after(bound):
        while not path.exists():  # noqa: ASYNC110, ASYNC240 - a stat of a local file another process writes
            await anyio.sleep(0.01)  # allowed: bounded poll of a file written by another process
    return path.read_text()  # noqa: ASYNC240 - a few bytes of a local file


async def wait_worker_import(sup: Supervisor, path: Path, bound: float = 60) -> int:
    """Wait (bounded) until a worker of ``sup`` is importing the agent module: ``path`` holds a
    worker's pid. ADAPT-PROBE imports the module once in a probe at the first submit of its name, which
    writes the same file with the probe's pid first."""
    with anyio.fail_after(bound):
        while True:
            if path.exists():  # noqa: ASYNC240 - a stat of a local file another process writes
                text = path.read_text()  # noqa: ASYNC240 - a few bytes of a local file
                workers = {w["pid"] for w in (await sup.status())["workers"]}
                if text.strip().isdigit() and int(text) in workers:
                    return int(text)
            await anyio.sleep(0.01)  # allowed: bounded poll of a file written by another process


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


STUCK = ["tests.agents.stuck:spin", "tests.agents.stuck:sleeper"]


@pytest.mark.parametrize("agent", [*STUCK, "tests.agents.stuck:self_stopper"])
async def test_timeout_reaches_a_turn_that_never_awaits(agent: str, tmp_path: Path) -> None:
    """The deadline fires for an async agent stuck before its first await (busy loop,
    ``time.sleep``, SIGSTOP of its own worker): ``killed``, cause deadline, started."""
    mark = tmp_path / "mark"
    async with Supervisor(**FAST) as sup:
        with anyio.fail_after(60):
            result = await sup.run(agent, {"mark": str(mark)}, timeout=0.5)
    assert (result.outcome, result.cause, result.started) == ("killed", {"kind": "deadline"}, True), result
    assert result.run_s >= 0.5 + 0.2  # timeout, then grace, counted from the start the worker noted
    assert gone(int(mark.read_text()))


@pytest.mark.parametrize("agent", [*STUCK, "tests.agents.stuck:self_stopper"])
async def test_cancel_reaches_a_turn_that_never_awaits(agent: str, tmp_path: Path) -> None:
    """``cancel()`` of a turn stuck before its first await is followed by the ladder:
    ``killed``, cause user, started true; the next turn runs on a new worker."""
    mark = tmp_path / "mark"
    async with Supervisor(**FAST) as sup:
        handle = await sup.submit(agent, {"mark": str(mark)})
        pid = int(await wait_file(mark))
        assert await handle.cancel() == {"kind": "user"}
        with anyio.fail_after(60):
            result = await handle.result()
            nxt = await sup.run("examples.agents:echo", "next")
    assert (result.outcome, result.cause, result.started) == ("killed", {"kind": "user"}, True), result
    assert result.worker_pid == pid and gone(pid)
    assert nxt.outcome == "completed" and nxt.worker_pid != pid


async def test_memory_limit_reaches_a_turn_that_never_awaits(tmp_path: Path) -> None:
    """``max_rss_mb`` reaches an agent that allocates, then spins without ever awaiting."""
    mark = tmp_path / "mark"
    async with Supervisor(**FAST, max_rss_mb=150, rss_interval=0.05) as sup:
        with anyio.fail_after(60):
            result = await sup.run("tests.agents.stuck:hog_spin", {"mark": str(mark), "mb": 300})
    assert (result.outcome, result.cause, result.started) == ("killed", {"kind": "memory"}, True), result


@pytest.mark.parametrize("agent", [*STUCK, "tests.agents.stuck:self_stopper"])
async def test_disposal_reaches_a_turn_that_never_awaits(agent: str, tmp_path: Path) -> None:
    """Leaving ``async with Supervisor`` returns, bounded, with a turn stuck before its first
    await: the turn ends ``killed``, cause disposed, and its worker is reaped."""
    mark = tmp_path / "mark"
    with anyio.fail_after(60):
        async with Supervisor(**FAST) as sup:
            handle = await sup.submit(agent, {"mark": str(mark)})
            pid = int(await wait_file(mark))
    result = await handle.result()
    assert (result.outcome, result.cause, result.started) == ("killed", {"kind": "disposed"}, True), result
    assert gone(pid)


async def test_blocking_import_is_cancelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent module whose import never returns is cancellable: ``killed``, started true
    (the import is the agent's code), never ``completed``."""
    monkeypatch.setenv("TURNPOOL_TEST_STUCK_DIR", str(tmp_path))
    async with Supervisor(**FAST) as sup:
        handle = await sup.submit("tests.agents.stuck_import_block:agent")
        pid = await wait_worker_import(sup, tmp_path / "import-block")
        await handle.cancel()
        with anyio.fail_after(60):
            result = await handle.result()
    assert (result.outcome, result.cause, result.started) == ("killed", {"kind": "user"}, True), result
    assert gone(pid)


async def test_slow_import_that_returns_after_a_cancel_is_not_completed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An import that returns after the turn was cancelled (within grace) does not go on to run
    the agent and end ``completed`` with cause user: the worker sees the Abort first and the turn
    ends ``aborted``, started true."""
    monkeypatch.setenv("TURNPOOL_TEST_STUCK_DIR", str(tmp_path))
    monkeypatch.setenv("TURNPOOL_TEST_SLOW_IMPORT_S", "1.5")
    async with Supervisor(workers=1, spares=0, grace=60, kill_after=1) as sup:
        handle = await sup.submit("tests.agents.stuck_import_slow:agent")
        await wait_worker_import(sup, tmp_path / "import-slow")
        await handle.cancel()
        with anyio.fail_after(60):
            result = await handle.result()
    assert (result.outcome, result.cause, result.started) == ("aborted", {"kind": "user"}, True), result


async def test_quick_turns_before_a_stuck_one_report_truthfully(tmp_path: Path) -> None:
    """Quick turns that end without awaiting (their Started and End share one frame), handed in
    one burst ahead of a turn that then spins, each end ``completed`` once with their own output:
    their ends leave the worker although the next turn never yields; the spinner is killed."""
    log = tmp_path / "log"
    mark = tmp_path / "mark"
    async with Supervisor(**FAST, **EAGER) as sup:
        await seed(sup)
        quick = [await sup.submit("tests.agents.stuck:count", {"log": str(log), "i": i}) for i in range(5)]
        stuck = await sup.submit("tests.agents.stuck:spin", {"mark": str(mark)})
        await wait_file(mark)
        await stuck.cancel()
        with anyio.fail_after(60):
            results = [await h.result() for h in quick]
            stuck_result = await stuck.result()
    assert [(r.outcome, r.output, r.started) for r in results] == [("completed", i, True) for i in range(5)]
    assert sorted(log.read_text().split()) == sorted(h.turn_id for h in quick)  # each ran once
    assert (stuck_result.outcome, stuck_result.started) == ("killed", True)


async def test_forged_end_for_a_handed_turn_has_no_effect() -> None:
    """An agent that sends an ``End`` (completed, made-up output) for another turn handed to its
    worker changes nothing: the frame is counted bad and the victim later runs for real."""
    async with Supervisor(workers=1, spares=0, **EAGER) as sup:
        await seed(sup)
        bad = sup.bad_frames
        forger = await sup.submit("tests.agents.stuck:forger", {"victim": "victim-1"})
        victim = await sup.submit("examples.agents:echo", {"real": True}, turn_id="victim-1")
        assert handed_to(sup, victim.turn_id) is not None
        with anyio.fail_after(60):
            forged = await forger.result()
            result = await victim.result()
    assert forged.outcome == "completed"
    assert (result.outcome, result.output, result.started) == ("completed", {"real": True}, True), result
    assert sup.bad_frames >= bad + 1


# ---- item 11: grace is capped; a second signal kills at once ----------------------------


async def test_grace_above_the_cap_is_refused_at_the_call() -> None:
    """``grace``/``kill_after`` above ``max_grace`` are refused where they are given, naming the
    cap; nothing is queued. A supervisor default above its own cap is refused too."""
    async with Supervisor(workers=1, spares=0, max_grace=10) as sup:
        for kwargs in ({"grace": 1e308}, {"grace": 10.5}, {"kill_after": 11}):
            with pytest.raises(ValueError, match="max_grace"):
                await sup.submit("examples.agents:echo", 1, **kwargs)
        assert (await sup.status())["queue"] == 0
        assert (await sup.run("examples.agents:echo", 1, grace=10, kill_after=10)).outcome == "completed"
    with pytest.raises(ValueError, match="max_grace"):
        Supervisor(grace=30, max_grace=10)
    with pytest.raises(TypeError):
        Supervisor(max_grace="300")  # type: ignore[arg-type]


async def test_kill_now_moves_every_live_turn_to_sigkill() -> None:
    """``kill_now()`` sends SIGKILL at once to the trees of live turns already being cancelled
    with a long grace, and to turns cancelled after it: disposal is then bounded."""
    async with Supervisor(workers=2, spares=0, grace=250, kill_after=250) as sup:
        a = await sup.submit("examples.agents:stubborn")
        b = await sup.submit("examples.agents:stubborn")
        await first_event(a)
        await first_event(b)
        await a.cancel()
        sup.kill_now()
        with anyio.fail_after(30):
            ra = await a.result()
    assert ra.outcome == "killed" and ra.cause == {"kind": "user"}
    rb = await b.result()  # disposed after kill_now: no grace wait
    assert rb.outcome == "killed" and rb.cause == {"kind": "disposed"}


async def test_kill_now_of_named_turns_reaches_a_stuck_turn(tmp_path: Path) -> None:
    """``kill_now(turn_ids=...)`` (a batch's second Ctrl-C) SIGKILLs the named turn at once even
    when it is stuck before its first await and was never cancelled; other turns are untouched."""
    mark = tmp_path / "mark"
    async with Supervisor(workers=2, spares=0, grace=250, kill_after=250) as sup:
        stuck = await sup.submit("tests.agents.stuck:spin", {"mark": str(mark)})
        other = await sup.submit("examples.agents:slow", {"seconds": 0.5})
        await wait_file(mark)
        sup.kill_now(turn_ids=[stuck.turn_id, "no-such-turn"])
        with anyio.fail_after(30):
            result = await stuck.result()
            assert (await other.result()).outcome == "completed"
    assert (result.outcome, result.started) == ("killed", True), result


def _serve_args(*extra: str) -> tuple[str, ...]:
    return ("--workers", "1", "--spares", "0", "--no-journal", *extra)


async def test_daemon_with_a_stuck_turn_exits_on_sigterm(tmp_path: Path) -> None:
    """``turnpool serve`` holding a turn stuck before its first await exits 0 on one SIGTERM,
    within a bound; the turn ends ``killed``, cause disposed."""
    mark = tmp_path / "mark"
    with serving(*_serve_args("--grace", "0.2", "--kill-after", "0.3", "--drain", "0.2")) as d:
        async with Client.connect(d.endpoint) as client:
            handle = await client.submit("tests.agents.stuck:spin", {"mark": str(mark)})
            await wait_file(mark)
            d.signal(signal.SIGTERM)
            with anyio.fail_after(60):
                result = await handle.result()
        with anyio.fail_after(60):
            code = await anyio.to_thread.run_sync(d.wait)
    assert (result.outcome, result.cause, result.started) == ("killed", {"kind": "disposed"}, True), result
    assert code == 0


async def test_daemon_refuses_huge_grace_and_a_second_signal_kills_at_once() -> None:
    """A submit with ``grace=1e308`` is refused by the daemon, naming ``--max-grace``; a turn with
    the largest grace allowed does not hold shutdown: the second SIGTERM SIGKILLs it at once."""
    with serving(*_serve_args("--drain", "600", "--max-grace", "500")) as d:
        async with Client.connect(d.endpoint) as client:
            with pytest.raises(ValueError, match="max_grace"):
                await client.submit("examples.agents:echo", 1, grace=1e308)
            handle = await client.submit("examples.agents:stubborn", grace=500, kill_after=500)
            info: Any = await first_event(handle)
            d.signal(signal.SIGTERM)
            with anyio.fail_after(60):
                while (await client.status())["daemon"]["accepting"]:
                    await anyio.lowlevel.checkpoint()
            d.signal(signal.SIGTERM)
            with anyio.fail_after(60):
                result = await handle.result()
        with anyio.fail_after(60):
            code = await anyio.to_thread.run_sync(d.wait)
    assert (result.outcome, result.cause) == ("killed", {"kind": "disposed"}), result
    assert code == 0 and gone(info["pid"])
