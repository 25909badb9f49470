"""The ``turnpool`` commands against a real daemon: submit (--wait, --follow), cancel, status."""

from __future__ import annotations

import re
import subprocess
import time

import msgspec

from supervisor import SyncClient
from tests.support import daemonkit
from tests.support.daemonkit import FAST, serving


def test_submit_prints_the_turn_id_and_wait_prints_the_result() -> None:
    """``submit`` prints the id; ``--wait`` prints the TurnResult as JSON; exit 0 when completed, 1 if not."""
    with serving(*FAST) as d:
        plain = d.cli("submit", "examples.agents:echo", "--input", '{"text": "hi"}', "--turn-id", "cli-1")
        assert plain.returncode == 0, plain.stderr
        assert plain.stdout.strip() == "cli-1"
        waited = d.cli(
            "submit", "examples.agents:echo", "--input", '{"text": "yo"}', "--session", "s", "--wait"
        )
        assert waited.returncode == 0, waited.stderr
        result = msgspec.json.decode(waited.stdout)
        assert result["outcome"] == "completed" and result["output"] == {"text": "yo"}
        assert result["session"] == "s"
        failed = d.cli("submit", "examples.agents:failing", "--wait")
        assert failed.returncode == 1
        assert msgspec.json.decode(failed.stdout)["error"]["type"] == "ValueError"
        timed = d.cli(
            "submit", "examples.agents:slow", "--input", '{"seconds": 60}', "--timeout", "0.2", "--wait"
        )
        assert timed.returncode == 1
        assert msgspec.json.decode(timed.stdout)["cause"] == {"kind": "deadline"}
        with SyncClient.connect(d.endpoint) as client:
            assert client.handle("cli-1").result().output == {"text": "hi"}


def test_submit_follow_streams_events_then_the_result() -> None:
    """``--follow`` prints each event as one JSON line, then the result as the last line."""
    with serving(*FAST) as d:
        out = d.cli("submit", "examples.agents:streamer", "--input", '{"count": 3}', "--follow")
        assert out.returncode == 0, out.stderr
        lines = [msgspec.json.decode(line) for line in out.stdout.splitlines()]
        assert [e["i"] for e in lines[:-1]] == [0, 1, 2]
        assert lines[-1]["outcome"] == "completed" and lines[-1]["output"] == {"events": 3}


def test_cancel_a_turn_and_a_session() -> None:
    """``cancel TURN_ID`` and ``cancel --session S`` cancel with cause user and print what they did."""
    with serving(*FAST) as d, SyncClient.connect(d.endpoint) as client:
        turn_id = d.cli("submit", "examples.agents:slow", "--input", '{"seconds": 60}').stdout.strip()
        handle = client.handle(turn_id)
        next(iter(handle.events()))
        out = d.cli("cancel", turn_id)
        assert out.returncode == 0, out.stderr
        assert msgspec.json.decode(out.stdout) == {"turn_id": turn_id, "cause": {"kind": "user"}}
        result = handle.result()
        assert result.outcome == "aborted" and result.cause == {"kind": "user"}

        running = client.submit("examples.agents:slow", {"seconds": 60}, session="s9")
        queued = client.submit("examples.agents:echo", 1, session="s9")
        next(iter(running.events()))
        out = d.cli("cancel", "--session", "s9")
        assert out.returncode == 0, out.stderr
        printed = msgspec.json.decode(out.stdout)
        assert printed["session"] == "s9" and set(printed["cancelled"]) == {running.turn_id, queued.turn_id}
        assert running.result().cause == {"kind": "user"} and queued.result().outcome == "aborted"


def test_bad_input_exits_2_with_a_message() -> None:
    """Usage errors exit 2 with a message: cancel with neither or both targets, bad --input JSON,
    a bad agent name; an unknown turn exits 1 naming it."""
    with serving(*FAST) as d:
        for args, needle in (
            (("cancel",), "either TURN_ID or --session"),
            (("cancel", "x", "--session", "s"), "either TURN_ID or --session"),
            (("submit", "examples.agents:echo", "--input", "{nope"), "not valid JSON"),
            (("submit", "no agent here"), "package.module:attr"),
        ):
            out = d.cli(*args)
            assert out.returncode == 2, (args, out)
            assert needle in out.stderr, (args, out.stderr)
        out = d.cli("cancel", "no-such-turn")
        assert out.returncode == 1 and "unknown turn id 'no-such-turn'" in out.stderr


def test_status_table_and_json() -> None:
    """``status`` shows workers (pid, state, turn, turns run, RSS), queue depth and counts per
    outcome as a table; ``--json`` gives the same facts raw."""
    with serving(*FAST) as d:
        assert d.cli("submit", "examples.agents:echo", "--wait").returncode == 0
        raw = d.cli("status", "--json")
        assert raw.returncode == 0, raw.stderr
        st = msgspec.json.decode(raw.stdout)
        assert len(st["workers"]) == 2 and st["outcomes"] == {"completed": 1}
        piped = d.cli("status")  # stdout is a pipe here: tab-separated text (CLI-PLAIN)
        assert piped.returncode == 0, piped.stderr
        text = piped.stdout
        for needle in ("pid", "state", "turn", "turns_run", "rss_mb", "queue\t0", "completed\t1"):
            assert needle in text, (needle, text)
        for w in st["workers"]:
            assert str(w["pid"]) in text
        text = status_on_a_terminal(d)
        for needle in ("pid", "state", "turn", "turns run", "RSS", "queue depth: 0", "completed"):
            assert needle in text, (needle, text)
        for w in st["workers"]:
            assert str(w["pid"]) in text


def status_on_a_terminal(d: daemonkit.Served) -> str:
    """``turnpool status`` with its stdout on a pseudo-terminal: what a user at a terminal sees."""
    import os
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.run(
            daemonkit.turnpool_argv("status"), env=d.env, stdout=slave, stderr=subprocess.PIPE, timeout=60
        )
        os.close(slave)
        slave = -1
        assert proc.returncode == 0, proc.stderr
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
        return re.sub(r"\x1b\[[0-9;]*m", "", b"".join(chunks).decode(errors="replace"))  # colours off
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)


def test_commands_without_a_daemon_fail_fast_naming_the_endpoint() -> None:
    """Every client command against no daemon exits 1 quickly with the endpoint in the message;
    ``--endpoint`` overrides the environment."""
    home = daemonkit.short_dir()
    env = daemonkit.env_for(home, f"ipc://{home}/nobody.sock")
    for args in (("status",), ("submit", "examples.agents:echo"), ("cancel", "x")):
        t0 = time.monotonic()
        out = subprocess.run(
            daemonkit.turnpool_argv(*args), env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 1, out
        assert f"ipc://{home}/nobody.sock" in out.stderr
        assert time.monotonic() - t0 < 30
    out = subprocess.run(
        daemonkit.turnpool_argv("status", "--endpoint", f"ipc://{home}/other.sock"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "other.sock" in out.stderr


def test_endpoint_flag_reaches_the_daemon() -> None:
    """``--endpoint`` on serve and on the client commands picks the socket, whatever the environment says."""
    home = daemonkit.short_dir()
    endpoint = f"ipc://{home}/flagged.sock"
    with serving(*FAST, "--endpoint", endpoint, home=home, endpoint=f"ipc://{home}/env.sock") as d:
        assert d.endpoint == endpoint
        out = d.cli("submit", "examples.agents:echo", "--input", "5", "--wait", "--endpoint", endpoint)
        assert out.returncode == 0, out.stderr
        assert msgspec.json.decode(out.stdout)["output"] == 5


def test_shared_options_are_refused_alike_by_every_command() -> None:
    """Issue 14: ``--workers``, ``--grace`` and ``--kill-after`` are declared and validated once
    (``supervisor/cli/options.py``, by the engine's own rules): ``serve``, ``batch`` and ``acp`` refuse
    the same bad value with exit 2 and the same reason, before starting anything."""
    import shutil

    home = daemonkit.short_dir()
    jobs = home / "jobs.jsonl"
    jobs.write_text('{"id": "a", "input": 1}\n')
    commands = {
        "serve": ("serve", "--no-journal"),
        "batch": ("batch", str(jobs), "-o", str(home / "out.jsonl"), "--agent", "examples.agents:echo"),
        "acp": ("acp", "--agent", "examples.agents:echo"),
    }
    for flag, value, reason in (
        ("--workers", "0", "workers must be >= 1, got 0"),
        ("--grace", "-1", "grace must be a finite number >= 0, got -1.0"),
        ("--kill-after", "-1", "kill_after must be a finite number >= 0, got -1.0"),
    ):
        said = {}
        for name, argv in commands.items():
            out = subprocess.run(
                daemonkit.turnpool_argv(*argv, flag, value),
                env=daemonkit.env_for(home, None),
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
            assert out.returncode == 2, (name, flag, out)
            said[name] = out.stderr.strip().splitlines()[-1].split("error: ", 1)[-1]
        assert set(said.values()) == {f"argument {flag}: {reason}"}, said
    assert not (home / "out.jsonl").exists()
    shutil.rmtree(home, ignore_errors=True)
