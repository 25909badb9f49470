"""Cancelling the caller (issue 15, item 7; design rule API-RUN-OWNS).

Cancelling the task that awaits ``run()`` — ``anyio.move_on_after``, ``asyncio.wait_for``, a
cancelled task, Ctrl-C in a blocking twin — cancels its turn (cause ``user``) and returns only
once the turn is quiescent (its worker killed and reaped when it had to be). Cancelling a wait on
``result()`` or ``events()`` does not touch the turn: a handle only observes. For ``Supervisor``,
``Client`` and ``SyncSupervisor``/``SyncClient``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.backends import backend, gone
from tests.support.daemonkit import FAST, ROOT, serving

pytestmark = pytest.mark.anyio

BOUND = 60.0


async def started(backend: Any, turn_id: str) -> int:
    """Wait (bounded) for the turn's first event; the worker's pid."""
    with anyio.fail_after(BOUND):
        while True:
            try:
                async with aclosing(backend.handle(turn_id).events()) as events:
                    async for event in events:
                        return int(event["pid"])
            except supervisor_unknown():
                await anyio.sleep(0.01)  # allowed: the submit is on its way in another task


def supervisor_unknown() -> type[Exception]:
    from supervisor import UnknownTurn

    return UnknownTurn


@pytest.mark.parametrize("kind", ["supervisor", "client"])
async def test_move_on_after_around_run_cancels_the_turn_and_waits(kind: str) -> None:
    """A cancel scope around ``run()`` that fires while the turn runs: the turn ends ``killed``
    (a stubborn agent, so the ladder runs) with cause ``user``, and by the time the scope has
    exited the worker is gone (quiescence, not just a request)."""
    async with backend(kind) as b:
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def caller() -> None:
                with scope:
                    await b.run("examples.agents:stubborn", {"seconds": 120}, turn_id="t-run")
                caller_done.set()

            caller_done = anyio.Event()
            tg.start_soon(caller)
            pid = await started(b, "t-run")
            scope.cancel()
            with anyio.fail_after(BOUND):
                await caller_done.wait()
            if kind == "supervisor":
                assert gone(pid), "run() returned before the turn was quiescent"
        with anyio.fail_after(BOUND):
            result = await b.handle("t-run").result()
    assert (result.outcome, result.cause) == ("killed", {"kind": "user"}), result
    assert scope.cancelled_caught


@pytest.mark.parametrize("kind", ["supervisor", "client"])
async def test_asyncio_wait_for_and_task_cancel_cancel_the_turn(kind: str) -> None:
    """``asyncio.wait_for`` and ``Task.cancel()`` on a task awaiting ``run()`` cancel its turn
    (cause ``user``): the turn never runs on unobserved."""
    async with backend(kind) as b:
        task = asyncio.ensure_future(b.run("examples.agents:slow", {"seconds": 120}, turn_id="t-task"))
        await started(b, "t-task")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(b.run("examples.agents:slow", {"seconds": 120}, turn_id="t-wf"), 0.5)
        with anyio.fail_after(BOUND):
            first = await b.handle("t-task").result()
            second = await b.handle("t-wf").result()
    assert (first.outcome, first.cause) == ("aborted", {"kind": "user"}), first
    assert second.outcome == "aborted" and second.cause == {"kind": "user"}, second


@pytest.mark.parametrize("kind", ["supervisor", "client"])
async def test_cancelling_a_result_or_events_wait_leaves_the_turn_running(kind: str) -> None:
    """``move_on_after`` around ``handle.result()`` or around iterating ``handle.events()`` only
    stops observing: the turn runs on and completes."""
    async with backend(kind) as b:
        handle = await b.submit("examples.agents:slow", {"seconds": 1.5})
        await started(b, handle.turn_id)
        with anyio.move_on_after(0.2):
            await handle.result()
        with anyio.move_on_after(0.2):
            async with aclosing(handle.events()) as events:
                async for _ in events:
                    pass
        with anyio.fail_after(BOUND):
            result = await handle.result()
    assert result.outcome == "completed" and result.cause is None, result


def _sync_script(kind: str, endpoint: str, marker: Path) -> str:
    make = (
        "SyncSupervisor(workers=1, spares=0, grace=0.3, kill_after=0.3, agent_path=[ROOT])"
        if kind == "supervisor"
        else f"SyncClient.connect({endpoint!r})"
    )
    return textwrap.dedent(
        f"""
        import faulthandler, signal, sys
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for stacks if it hangs
        # Ctrl-C as an interactive Python gets it, whatever this test's own parent left: a run started in
        # the background of a non-interactive shell inherits SIGINT ignored, and Python keeps it so.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        ROOT = {ROOT!r}
        sys.path.insert(0, ROOT)
        from supervisor import SyncClient, SyncSupervisor
        b = {make}
        try:
            b.run("tests.agents.api:marks_then_waits", {{"marker": {str(marker)!r}}}, turn_id="t-sync")
        except KeyboardInterrupt:
            r = b.handle("t-sync").result()
            print("RESULT", r.outcome, r.cause["kind"] if r.cause else None, flush=True)
        b.close()
        """
    )


@pytest.mark.parametrize("kind", ["supervisor", "client"])
def test_ctrl_c_in_a_blocking_run_cancels_its_turn(kind: str, tmp_path: Path) -> None:
    """Ctrl-C while ``SyncSupervisor.run``/``SyncClient.run`` waits: ``KeyboardInterrupt`` comes
    once the turn is cancelled (cause ``user``) and quiescent."""
    marker = tmp_path / "started"

    def go(endpoint: str, env: dict[str, str] | None) -> str:
        proc = subprocess.Popen(
            [sys.executable, "-c", _sync_script(kind, endpoint, marker)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + BOUND
            while not marker.exists():
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the turn never started"
                time.sleep(0.02)  # allowed: bounded poll of a file written by another process
            os.kill(proc.pid, signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=BOUND)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGUSR1)  # every thread's stack on its stderr, then end it
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.communicate(timeout=5)
                proc.kill()
                out, err = proc.communicate()
                pytest.fail(f"no exit {BOUND:.0f} s after Ctrl-C; where its threads were:\n{err[-6000:]}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()  # closes its pipes too
        assert proc.returncode == 0, err[-3000:]
        return out

    if kind == "client":
        with serving(*FAST) as d:
            out = go(d.endpoint, d.env)
    else:
        out = go("", None)
    assert "RESULT aborted user" in out, out
