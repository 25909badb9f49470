"""The serve daemon's life as a user meets it (issue 15, items 8, 9 and 11): a graceful stop keeps
queued turns for the next start when there is a journal; ``history``/``result``/``status`` find
the running daemon's journal wherever it is (or say there is none); ``turnpool reload`` makes new
turns run an edited agent while running turns finish on the old code."""

from __future__ import annotations

import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import msgspec

from supervisor import SyncClient, SyncSupervisor
from tests.support import daemonkit
from tests.support.daemonkit import FAST, serving

RECORD = "tests.agents.lifecycle:record"


def test_a_graceful_stop_keeps_queued_turns_for_the_next_start() -> None:
    """With a journal, SIGTERM while turns wait behind a busy worker: the daemon drains, exits 0,
    and the turns still queued stay queued; the next daemon on that journal runs each of them
    exactly once (the agent appends its id to a file at each run)."""
    home = daemonkit.short_dir()
    journal = home / "j.sqlite3"
    runs = home / "runs.txt"
    ids = [f"q{i}" for i in range(3)]
    args = ("--workers", "1", "--spares", "0", "--grace", "0.5", "--kill-after", "0.5", "--drain", "0.2")
    try:
        first = daemonkit.start(*args, "--journal", str(journal), home=home)
        with SyncClient.connect(first.endpoint) as client:
            busy = client.submit("examples.agents:slow", {"seconds": 600})
            next(iter(busy.events()))
            for turn_id in ids:
                client.submit(RECORD, {"file": str(runs)}, turn_id=turn_id)
        first.signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0, first.stderr()
        daemonkit.stop_process(first.proc)
        assert not runs.exists()  # none ran in the first life
        second = daemonkit.start(*args, "--journal", str(journal), home=home)
        try:
            with SyncClient.connect(second.endpoint) as client:
                results = [client.handle(turn_id).result() for turn_id in ids]
        finally:
            daemonkit.stop_process(second.proc)
        assert [r.outcome for r in results] == ["completed"] * 3, results
        assert sorted(runs.read_text().split()) == ids  # each ran once
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_without_a_journal_a_graceful_stop_disposes_queued_turns() -> None:
    """``--no-journal``: nothing survives a restart, so the queued turns end at the stop, aborted
    with cause disposed, and the client waiting on them is told."""
    args = ("--workers", "1", "--spares", "0", "--grace", "0.5", "--kill-after", "0.5", "--drain", "0.2")
    with serving(*args, "--no-journal") as d, SyncClient.connect(d.endpoint) as client:
        busy = client.submit("examples.agents:slow", {"seconds": 600})
        next(iter(busy.events()))
        queued = client.submit("examples.agents:echo", 1)
        d.signal(signal.SIGTERM)
        result = queued.result()
        assert result.outcome == "aborted" and result.cause == {"kind": "disposed"} and not result.started
        assert d.wait(timeout=60) == 0


def test_history_and_result_use_the_running_daemons_journal() -> None:
    """A daemon started with ``--journal PATH`` (not the default): ``status --json`` names PATH,
    and ``history``/``result`` without ``--journal`` read it. A ``--no-journal`` daemon:
    ``status --json`` says there is none, and ``history`` says so (exit 2), instead of reading
    some other file."""
    home = daemonkit.short_dir()
    journal = home / "elsewhere" / "mine.sqlite3"
    journal.parent.mkdir(mode=0o700)
    with serving(*FAST, "--journal", str(journal), home=home) as d:
        ran = d.cli("submit", "examples.agents:echo", "--input", "7", "--turn-id", "h-1", "--wait")
        assert ran.returncode == 0, ran.stderr
        st = msgspec.json.decode(d.cli("status", "--json").stdout)
        assert st["daemon"]["journal"] == str(journal)
        hist = d.cli("history", "--json")
        assert hist.returncode == 0, hist.stderr
        assert [msgspec.json.decode(line)["turn_id"] for line in hist.stdout.splitlines()] == ["h-1"]
        res = d.cli("result", "h-1")
        assert res.returncode == 0 and msgspec.json.decode(res.stdout)["output"] == 7, res.stderr
    with serving(*FAST, "--no-journal") as d:
        st = msgspec.json.decode(d.cli("status", "--json").stdout)
        assert st["daemon"]["journal"] is None
        hist = d.cli("history")
        assert hist.returncode == 2 and "without a journal" in hist.stderr, hist


AGENT_V1 = """
import anyio, os
VERSION = "one"

async def get(turn):
    return {"version": VERSION, "pid": os.getpid()}

async def hold(turn):
    await turn.emit({"pid": os.getpid()})
    while not os.path.exists(turn.input):
        await anyio.sleep(0.02)  # allowed: the agent's own polling for the test's release file
    return {"version": VERSION, "pid": os.getpid()}
"""


def test_reload_makes_new_turns_run_edited_agent_code(tmp_path: Path) -> None:
    """Edit an agent's module while the daemon runs, then ``turnpool reload``: a turn running at
    the reload finishes on its old worker with the old code (never killed); every turn after it
    runs the new code on a fresh worker. Without the reload, workers that had imported the
    module keep the old code."""
    agents = tmp_path / "agents"
    agents.mkdir()
    module = agents / "reloadme.py"
    module.write_text(textwrap.dedent(AGENT_V1))
    release = tmp_path / "release"
    with (
        serving("--workers", "2", "--spares", "0", "--drain", "0", paths=(str(agents),)) as d,
        SyncClient.connect(d.endpoint) as client,
    ):
        before = [client.run("reloadme:get").output for _ in range(4)]
        assert {b["version"] for b in before} == {"one"}
        held = client.submit("reloadme:hold", str(release))
        held_pid = next(iter(held.events()))["pid"]
        module.write_text(textwrap.dedent(AGENT_V1).replace('"one"', '"two, edited"'))
        stale = client.run("reloadme:get").output
        assert stale["version"] == "one"  # a worker caches the module it imported
        out = d.cli("reload")
        assert out.returncode == 0, out.stderr
        t0 = time.monotonic()
        after = [client.run("reloadme:get").output for _ in range(4)]
        assert {a["version"] for a in after} == {"two, edited"}, after
        assert not {a["pid"] for a in after} & ({b["pid"] for b in before} | {held_pid})
        release.write_text("go")
        result = held.result()
        assert result.outcome == "completed" and result.output == {"version": "one", "pid": held_pid}
        assert time.monotonic() - t0 < 60
        later = [client.run("reloadme:get").output for _ in range(3)]
        assert held_pid not in {a["pid"] for a in later}  # the old worker retired after its turn


def test_sync_supervisor_reload_makes_new_turns_run_edited_agent_code(tmp_path: Path) -> None:
    """The embedded pool offers the same as ``turnpool reload``: ``SyncSupervisor.reload()`` after
    an agent's module was edited, and the next turns run the new code on fresh workers."""
    agents = tmp_path / "agents"
    agents.mkdir()
    module = agents / "reloadme_sync.py"
    module.write_text(textwrap.dedent(AGENT_V1))
    with SyncSupervisor(workers=1, spares=0, agent_path=[str(agents)]) as sup:
        before = sup.run("reloadme_sync:get").output
        assert before["version"] == "one"
        module.write_text(textwrap.dedent(AGENT_V1).replace('"one"', '"two, edited"'))
        assert sup.run("reloadme_sync:get").output["version"] == "one"  # the worker caches it
        assert sup.reload()["workers"] >= 1
        after = sup.run("reloadme_sync:get").output
        assert after["version"] == "two, edited" and after["pid"] != before["pid"]


def test_reload_json_and_no_daemon() -> None:
    """``reload --json`` prints what was recycled; against no daemon it fails fast (exit 1)."""
    with serving(*FAST) as d:
        out = d.cli("reload", "--json")
        assert out.returncode == 0, out.stderr
        assert msgspec.json.decode(out.stdout)["workers"] >= 1
    home = daemonkit.short_dir()
    env = daemonkit.env_for(home, f"ipc://{home}/none.sock")
    out = subprocess.run(
        daemonkit.turnpool_argv("reload"), env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 1 and "none.sock" in out.stderr


def test_reload_with_every_worker_busy_starts_new_turns_at_once(tmp_path: Path) -> None:
    """The only worker is busy with a long turn at the reload: its replacement starts at once and
    new turns run there (edited code) without waiting for the old turn, journal gate included."""
    agents = tmp_path / "agents"
    agents.mkdir()
    module = agents / "reloadme.py"
    module.write_text(textwrap.dedent(AGENT_V1))
    release = tmp_path / "release"
    with (
        serving("--workers", "1", "--spares", "0", "--drain", "0", paths=(str(agents),)) as d,
        SyncClient.connect(d.endpoint) as client,
    ):
        held = client.submit("reloadme:hold", str(release))
        held_pid = next(iter(held.events()))["pid"]
        module.write_text(textwrap.dedent(AGENT_V1).replace('"one"', '"two, edited"'))
        out = d.cli("reload", "--json")
        assert out.returncode == 0 and msgspec.json.decode(out.stdout) == {"workers": 1, "busy": 1}
        fresh = d.cli("submit", "reloadme:get", "--wait", timeout=60)  # bounded: fails, never hangs
        assert fresh.returncode == 0, fresh.stderr
        got = msgspec.json.decode(fresh.stdout)["output"]
        assert got["version"] == "two, edited" and got["pid"] != held_pid
        release.write_text("go")
        assert held.result().output == {"version": "one", "pid": held_pid}
