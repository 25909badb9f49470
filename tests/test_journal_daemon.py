"""The daemon's journal end to end: SIGKILL mid-batch, restart, nothing lost and nothing run twice."""

from __future__ import annotations

import hashlib
import json
import shutil
from contextlib import aclosing
from itertools import pairwise

import anyio
import pytest

from supervisor import Client
from supervisor.journal import read_history
from tests.support.daemonkit import FAST, serving, short_dir, start, stop_process

pytestmark = pytest.mark.anyio


async def first_event(handle) -> None:  # type: ignore[no-untyped-def]
    with anyio.fail_after(30):
        async with aclosing(handle.events()) as events:
            async for _ in events:
                return


async def test_sigkill_mid_batch_then_restart_ends_every_turn_once() -> None:
    """SIGKILL the daemon with turns running and queued, restart it on the same journal: ended
    turns' results are fetched as before; queued turns run (a session in its order); a running
    turn ends ``crashed`` (supervisor lost) unless submitted with ``retry=True``, which runs again
    with ``attempts`` 2. A queued turn the journal had already cleared to run (JOURNAL-GATE: handed ahead to
    a worker, so it may have started) ends ``crashed`` too; one still ``queued`` there runs. Every
    accepted turn ends exactly once."""
    home = short_dir()
    journal = home / "journal.sqlite3"
    marker = home / "marker"
    first = start(*FAST, "--journal", str(journal), home=home)
    try:
        async with Client.connect(first.endpoint) as client:
            with anyio.fail_after(60):
                done = [await client.run("examples.agents:echo", {"i": i}) for i in range(3)]
            plain = await client.submit("examples.agents:slow", {"seconds": 600})
            retried = await client.submit("tests.agents:hang_first_time", {"marker": str(marker)}, retry=True)
            await first_event(plain)
            await first_event(retried)
            queued = [
                await client.submit("examples.agents:slow", {"seconds": 0.05}, session="s") for _ in range(4)
            ]
            assert (await client.status())["queue"] == 4
    finally:
        first.proc.kill()
        first.proc.wait(timeout=30)
        stop_process(first.proc)
    at_kill = {row["turn_id"]: row["state"] for row in read_history(journal, limit=1000)}
    second = start(*FAST, "--journal", str(journal), home=home)
    try:
        async with Client.connect(second.endpoint) as client:
            with anyio.fail_after(60):
                again = [await client.handle(r.turn_id).result() for r in done]
                r_plain = await client.handle(plain.turn_id).result()
                r_retried = await client.handle(retried.turn_id).result()
                r_queued = [await client.handle(h.turn_id).result() for h in queued]
            assert again == done  # the record read back equals what the client saw
            assert r_plain.outcome == "crashed" and r_plain.error and r_plain.error.type == "SupervisorLost"
            assert r_retried.outcome == "completed" and r_retried.output == {"run": "again"}
            assert r_retried.attempts == 2
            for r in r_queued:
                assert r.outcome == ("completed" if at_kill[r.turn_id] == "queued" else "crashed"), r
            assert sum(at_kill[h.turn_id] == "queued" for h in queued) >= 3  # a session: one at a time
            r_queued = [r for r in r_queued if r.outcome == "completed"]
            for prev, nxt in pairwise(r_queued):
                assert nxt.started_at >= prev.ended_at
            resubmit = await client.submit("examples.agents:echo", {"i": 0}, turn_id=done[0].turn_id)
            assert await resubmit.result() == done[0]  # idempotent across the restart: never run twice
    finally:
        stop_process(second.proc)
    rows = read_history(journal, limit=1000)
    assert len(rows) == 3 + 2 + 4
    assert all(row["state"] == "ended" for row in rows)
    shutil.rmtree(home, ignore_errors=True)


def test_corrupt_and_locked_journals_are_refused() -> None:
    """``serve`` refuses a corrupt journal and one held by another live daemon, with a clear
    message, and leaves the file untouched."""
    with serving(*FAST) as live:
        journal = live.home / "shared.sqlite3"
        other_home = short_dir()
        holder = start(*FAST, "--journal", str(journal), home=other_home)
        try:
            before = hashlib.sha256(journal.read_bytes()).hexdigest()
            refused = live.cli(
                "serve", *FAST, "--journal", str(journal), "--endpoint", f"ipc://{live.home}/other.sock"
            )
            assert refused.returncode == 1 and "locked by another live daemon" in refused.stderr
            assert hashlib.sha256(journal.read_bytes()).hexdigest() == before
        finally:
            stop_process(holder.proc)
            shutil.rmtree(other_home, ignore_errors=True)
        corrupt = live.home / "corrupt.sqlite3"
        corrupt.write_bytes(b"definitely not sqlite" * 64)
        refused = live.cli(
            "serve", *FAST, "--journal", str(corrupt), "--endpoint", f"ipc://{live.home}/c.sock"
        )
        assert refused.returncode == 1 and "corrupt" in refused.stderr
        assert corrupt.read_bytes() == b"definitely not sqlite" * 64
        usage = live.cli("serve", "--no-journal", "--journal", str(corrupt))
        assert usage.returncode == 2 and "--no-journal" in usage.stderr


def test_history_and_result_read_the_daemons_default_journal() -> None:
    """With no flags, ``serve`` journals to the per-user state dir (one file per endpoint) and
    ``turnpool history`` / ``turnpool result`` read it."""
    with serving(*FAST) as d:
        out = d.cli("submit", "examples.agents:echo", "--input", '{"a": 1}', "--session", "h", "--wait")
        assert out.returncode == 0, out.stderr
        turn_id = json.loads(out.stdout)["turn_id"]
        failed = d.cli("submit", "examples.agents:failing", "--wait")
        assert failed.returncode == 1
        hist = d.cli("history", "--json", "--session", "h")
        assert hist.returncode == 0, hist.stderr
        rows = [json.loads(line) for line in hist.stdout.splitlines()]
        assert [r["turn_id"] for r in rows] == [turn_id] and rows[0]["outcome"] == "completed"
        by_outcome = d.cli("history", "--json", "--outcome", "failed")
        assert [json.loads(line)["error_type"] for line in by_outcome.stdout.splitlines()] == ["ValueError"]
        res = d.cli("result", turn_id)
        assert res.returncode == 0 and json.loads(res.stdout)["output"] == {"a": 1}
        assert list((d.home / "state" / "turnpool").glob("journal-*.sqlite3"))
