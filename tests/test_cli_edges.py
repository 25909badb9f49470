"""The ``turnpool`` command outside its happy path, as a user meets it (issue 15, CLI side).

Each test runs the console script in a subprocess (``tests/support/daemonkit``) against a real
daemon where one is needed: malformed endpoints fail fast (2), a batch never writes into its
own jobs file (10), ``batch --connect`` rides out ``QueueFull`` (12), Ctrl-C on ``submit
--wait`` cancels the turn it printed (13), bad input gets one line and exit 1/2, never a
traceback (14), piped output is plain and whole (15), and the small things of item 18.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from supervisor import SyncClient
from tests.support import daemonkit
from tests.support.daemonkit import FAST, ROOT, serving

BOUND = 30.0  # seconds any failing-fast command gets before the test calls it a hang


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = BOUND
) -> subprocess.CompletedProcess[str]:
    """``turnpool ARGS`` in a subprocess, bounded; a hang fails the test (TimeoutExpired)."""
    return subprocess.run(
        daemonkit.turnpool_argv(*args),
        env=env if env is not None else isolated_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def isolated_env() -> dict[str, str]:
    home = daemonkit.short_dir()
    return daemonkit.env_for(home, f"ipc://{home}/none.sock")


def one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    """The command's error: exactly one line on stderr, no traceback."""
    err = out.stderr.strip()
    assert "Traceback" not in err, err
    assert err and len(err.splitlines()) == 1, err
    return err


def write_jobs(path: Path, n: int, agent: str = "examples.agents:echo", **extra: Any) -> Path:
    path.write_text(
        "".join(json.dumps({"id": f"j{i}", "input": i, "agent": agent, **extra}) + "\n" for i in range(n))
    )
    return path


def batch_env() -> dict[str, str]:
    env = isolated_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    return env


# ---- item 2: malformed endpoints -----------------------------------------------------------

MALFORMED = (
    ("/tmp/turnpool-bare.sock", "ipc://"),
    ("tcp://127.0.0.1", "port"),
    ("tcp://localhost:notaport", "port"),
    ("foo://bar", "unknown scheme"),
    ("ipc://", "path"),
)


@pytest.mark.parametrize(("endpoint", "needle"), MALFORMED)
def test_a_malformed_endpoint_fails_fast_in_the_cli(endpoint: str, needle: str) -> None:
    """``--endpoint`` (and ``TURNPOOL_ENDPOINT``) that is a bare path, a tcp:// without a port,
    or an unknown scheme: exit 2 at once with one line naming the endpoint and what is wrong —
    for a client command and for ``serve``. (It used to wait for a daemon until Ctrl-C.)"""
    for args in (
        ("status", "--endpoint", endpoint),
        ("submit", "examples.agents:echo", "--endpoint", endpoint),
    ):
        out = run(*args)
        err = one_line_error(out)
        assert out.returncode == 2, out
        assert endpoint in err and needle in err, err
    env = isolated_env()
    env["TURNPOOL_ENDPOINT"] = endpoint
    out = run("status", env=env)
    assert out.returncode == 2 and endpoint in one_line_error(out)
    served = run("serve", "--endpoint", endpoint, "--workers", "1")
    assert served.returncode == 2 and endpoint in one_line_error(served), served


def test_a_malformed_endpoint_fails_fast_in_client_and_sync_client() -> None:
    """``SyncClient.connect(ep)`` and ``Client.connect(ep)`` with a malformed endpoint raise
    ``ValueError`` naming it, at the call — a user's script, bounded."""
    script = textwrap.dedent(
        """
        import asyncio
        from supervisor import Client, SyncClient
        for ep in ("/tmp/x.sock", "tcp://127.0.0.1", "foo://bar"):
            try:
                with SyncClient.connect(ep) as c:
                    c.status()
            except ValueError as exc:
                assert ep in str(exc), exc
                print("sync", ep, exc)
            try:
                Client.connect(ep)
            except ValueError as exc:
                assert ep in str(exc), exc
                print("async", ep)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=BOUND, env=isolated_env()
    )
    assert out.returncode == 0, out.stderr
    words = [line.split()[0] for line in out.stdout.splitlines()]
    assert words.count("sync") == 3 and words.count("async") == 3, out.stdout


# ---- item 10: the output is the input ------------------------------------------------------


def test_batch_refuses_to_write_results_into_its_jobs_file(tmp_path: Path) -> None:
    """``batch J -o J`` (also with ``--resume``, through a symlink or a hard link) is refused
    with exit 2 before anything runs, and the jobs file is left as it was."""
    jobs = write_jobs(tmp_path / "jobs.jsonl", 2)
    before = jobs.read_bytes()
    (tmp_path / "sym.jsonl").symlink_to(jobs)
    os.link(jobs, tmp_path / "hard.jsonl")
    for out_name in ("jobs.jsonl", "sym.jsonl", "hard.jsonl"):
        for extra in ((), ("--resume",)):
            out = run(
                "batch", str(jobs), "-o", str(tmp_path / out_name), "--workers", "1", *extra, env=batch_env()
            )
            err = one_line_error(out)
            assert out.returncode == 2, out
            assert "jobs file" in err and "--resume" not in err, err
            assert jobs.read_bytes() == before


# ---- item 12: QueueFull while batching through a daemon ------------------------------------


def test_batch_connect_backs_off_while_the_daemon_is_full(tmp_path: Path) -> None:
    """A daemon whose queue holds 1 turn and a batch submitting 12 at once: the batch waits and
    retries on ``QueueFull`` instead of stopping, every job completes, and the summary's rate
    is a real figure (jobs over wall time)."""
    jobs = write_jobs(tmp_path / "jobs.jsonl", 12, agent="examples.agents:slow")
    lines = [json.loads(line) for line in jobs.read_text().splitlines()]
    jobs.write_text("".join(json.dumps({**job, "input": {"seconds": 0.1}}) + "\n" for job in lines))
    out_path = tmp_path / "out.jsonl"
    with serving("--workers", "1", "--spares", "0", "--max-queue", "1", "--drain", "0") as d:
        t0 = time.monotonic()
        out = d.cli(
            "batch",
            str(jobs),
            "-o",
            str(out_path),
            "--connect",
            d.endpoint,
            "--concurrency",
            "12",
            timeout=120,
        )
        wall = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    results = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert len(results) == 12 and {r["outcome"] for r in results} == {"completed"}
    rate = float(out.stdout.split(" jobs/s")[0].rsplit("(", 1)[1])
    # Jobs over the batch's own wall time: at most 12 jobs of 0.1 s run one at a time on the one worker
    # allow (10/s), at least 12 over this CLI's whole run (its interpreter's start included, which the
    # batch's clock does not see; the printed rate is rounded to 0.1).
    assert 12 / wall - 0.05 <= rate <= 10.05, (rate, wall, out.stdout)


# ---- item 13: Ctrl-C on submit --wait / --follow -------------------------------------------


@contextlib.contextmanager
def popen(*args: str, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """``turnpool ARGS`` running in the background; killed and reaped if still there at the end."""
    with subprocess.Popen(
        daemonkit.turnpool_argv(*args),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()


def _read_stderr_line(proc: subprocess.Popen[str], needle: str, timeout: float = BOUND) -> str:
    """Read the process's stderr line by line until one contains ``needle`` (bounded)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"no stderr line with {needle!r} within {timeout}s: {seen}")


@pytest.mark.parametrize("mode", ["--wait", "--follow"])
def test_ctrl_c_on_submit_wait_cancels_the_turn_it_printed(mode: str) -> None:
    """``submit --wait``/``--follow`` prints the turn id (stderr) before waiting; Ctrl-C cancels
    that turn (cause user), waits for its end, says so, and exits 130."""
    with serving(*FAST) as d, SyncClient.connect(d.endpoint) as client:
        with popen("submit", "examples.agents:slow", "--input", '{"seconds": 600}', mode, env=d.env) as proc:
            line = _read_stderr_line(proc, "turn ")
            turn_id = line.split("turn ", 1)[1].split()[0]
            handle = client.handle(turn_id)
            next(iter(handle.events()))  # running
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=BOUND) == 130
            err = proc.stderr.read() if proc.stderr else ""
            assert "cancelled" in err and turn_id in err, err
        result = handle.result()
        assert result.outcome == "aborted" and result.cause == {"kind": "user"}


def test_a_second_ctrl_c_stops_waiting_and_says_how_to_follow_up() -> None:
    """A turn that does not stop within its grace: the first Ctrl-C asks it to stop, the second
    leaves at once (exit 130) without waiting for the ladder, naming the commands to use next."""
    with serving(
        "--workers", "1", "--spares", "0", "--grace", "60", "--kill-after", "0.5", "--drain", "0"
    ) as d:
        with SyncClient.connect(d.endpoint) as client:
            with popen("submit", "examples.agents:stubborn", "--wait", env=d.env) as proc:
                line = _read_stderr_line(proc, "turn ")
                turn_id = line.split("turn ", 1)[1].split()[0]
                next(iter(client.handle(turn_id).events()))
                proc.send_signal(signal.SIGINT)
                _read_stderr_line(proc, "again")
                proc.send_signal(signal.SIGINT)
                assert proc.wait(timeout=BOUND) == 130
                err = proc.stderr.read() if proc.stderr else ""
                assert f"turnpool result {turn_id}" in err, err
            running = [w["turn_id"] for w in client.status()["workers"]]
            assert turn_id in running  # left to its ladder (grace 60 s), not waited for
        # Skip the drain: a second SIGTERM kills the stubborn turn now. Two signals sent back to back
        # may reach the daemon as one (a pending signal is not queued twice): it would then dispose
        # with the turn's 60 s grace. So the second is sent again until the daemon has exited.
        d.signal(signal.SIGTERM)
        deadline = time.monotonic() + BOUND
        while d.proc.poll() is None and time.monotonic() < deadline:
            d.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                d.proc.wait(timeout=0.5)


# ---- item 14: one-line messages, never tracebacks ------------------------------------------


def test_batch_output_in_a_missing_directory_is_refused_before_the_pool_starts(tmp_path: Path) -> None:
    """``batch -o missing_dir/x.jsonl``: exit 2 with one line naming the directory, before any
    worker starts (it used to start the pool and die with a traceback)."""
    jobs = write_jobs(tmp_path / "jobs.jsonl", 1)
    out = run(
        "batch", str(jobs), "-o", str(tmp_path / "missing" / "x.jsonl"), "--workers", "1", env=batch_env()
    )
    err = one_line_error(out)
    assert out.returncode == 2 and str(tmp_path / "missing") in err, err


def test_serve_metrics_port_in_use_is_one_line() -> None:
    """``serve --metrics-port P`` with P taken: exit 1, one line naming the port and the fix."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        served = daemonkit.start(*FAST, "--metrics-port", str(port), check_ready=False)
        try:
            code = served.wait(timeout=60)
        finally:
            daemonkit.stop_process(served.proc)
        err = served.stderr().strip()
        assert code == 1, err
        assert "Traceback" not in err and str(port) in err and "--metrics-port" in err, err


SWEEP: tuple[tuple[str, ...], ...] = (
    ("serve", "--config", "/nonexistent/turnpool.toml"),
    ("serve", "--workers", "0"),
    ("serve", "--workers", "many"),
    ("serve", "--grace", "-1"),
    ("serve", "--journal", "/proc/turnpool/j.sqlite3"),
    ("serve", "--path", "/nonexistent/agents"),
    ("serve", "--http", "localhost:notaport"),
    ("serve", "--log-level", "LOUD"),
    ("submit", "not an agent"),
    ("submit", "examples.agents:echo", "--input", "{bad"),
    ("submit", "examples.agents:echo", "--timeout", "-3"),
    ("cancel",),
    ("history", "--journal", "/nonexistent/j.sqlite3"),
    ("history", "--limit", "-1"),
    ("history", "--since", "whenever"),
    ("result", "x", "--journal", "/"),
    ("batch", "/nonexistent/jobs.jsonl", "-o", "/nonexistent-turnpool/o.jsonl"),
    ("batch", "/dev/null", "-o", "/nonexistent-turnpool/o.jsonl", "--workers", "0"),
    ("batch", "/etc/hostname", "-o", "/nonexistent-turnpool/o.jsonl"),
    ("acp", "--agent", "nope", "--workers", "1"),
)


@pytest.mark.parametrize("args", SWEEP, ids=[" ".join(a) for a in SWEEP])
def test_every_command_answers_bad_input_with_one_line(args: tuple[str, ...]) -> None:
    """Each command given bad input exits 1 or 2 (README's table) with one line on stderr naming
    the cause — never a traceback, never a hang."""
    out = run(*args)
    assert out.returncode in (1, 2), out
    err = out.stderr.strip()
    assert "Traceback" not in err, err
    assert err.splitlines()[-1].startswith(("turnpool", "usage:")) or "error:" in err, err


# ---- item 15: piped output -----------------------------------------------------------------


def test_piped_status_and_history_print_whole_values_as_tab_separated_text() -> None:
    """When stdout is not a terminal, ``status`` and ``history`` print tab-separated plain text
    (a header row, then one row per worker / turn) with every id whole, however long."""
    home = daemonkit.short_dir()
    journal = home / "j.sqlite3"
    long_id = "a-rather-long-turn-id-" + "x" * 70
    with serving(*FAST, "--journal", str(journal), home=home) as d, SyncClient.connect(d.endpoint) as client:
        handle = client.submit("examples.agents:slow", {"seconds": 600}, turn_id=long_id)
        next(iter(handle.events()))
        st = d.cli("status")
        assert st.returncode == 0, st.stderr
        rows = [line.split("\t") for line in st.stdout.splitlines()]
        header = next(r for r in rows if r[0] == "worker" and "pid" in r)
        busy = [r for r in rows if r[0] == "worker" and long_id in r]
        assert busy and len(busy[0]) == len(header), rows
        assert any(r[:2] == ["journal", str(journal)] for r in rows), rows
        handle.cancel()
        handle.result()
        hist = d.cli("history")
        assert hist.returncode == 0, hist.stderr
        lines = hist.stdout.splitlines()
        head = lines[0].split("\t")
        assert head[:2] == ["turn_id", "agent"], lines
        row = dict(zip(head, lines[1].split("\t"), strict=True))
        assert row["turn_id"] == long_id and row["agent"] == "examples.agents:slow" and row["cause"] == "user"
        assert row["accepted"].endswith("Z") and "T" in row["accepted"], row


def test_json_on_every_command_that_prints_data(tmp_path: Path) -> None:
    """``--json`` is accepted by every command that prints data, and its stdout is JSON (one
    object, or one per line)."""
    home = daemonkit.short_dir()
    jobs = write_jobs(tmp_path / "jobs.jsonl", 2)
    with serving(*FAST, "--journal", str(home / "j.sqlite3"), home=home) as d:
        sub = d.cli("submit", "examples.agents:echo", "--json", "--turn-id", "js-1")
        assert sub.returncode == 0, sub.stderr
        assert msgspec.json.decode(sub.stdout) == {"turn_id": "js-1"}
        waited = d.cli("submit", "examples.agents:echo", "--json", "--wait", "--input", "3")
        assert msgspec.json.decode(waited.stdout)["output"] == 3
        for args in (
            ("status", "--json"),
            ("cancel", "js-1", "--json"),
            ("history", "--json"),
            ("result", "js-1", "--json"),
            ("batch", str(jobs), "-o", str(tmp_path / "o.jsonl"), "--connect", d.endpoint, "--json"),
        ):
            out = d.cli(*args)
            assert out.returncode == 0, (args, out.stderr)
            assert out.stdout.strip(), args
            for line in out.stdout.splitlines():
                msgspec.json.decode(line)
        summary = msgspec.json.decode(d.cli(*args[:-1], "--resume", "--json").stdout)
        assert summary["jobs"] == 2 and summary["skipped"] == 2


# ---- item 18: the small things -------------------------------------------------------------


def test_version() -> None:
    """``turnpool --version`` prints the installed version and exits 0."""
    from importlib.metadata import version

    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"turnpool {version('turnpool')}", out


def test_batch_output_dash_writes_results_to_stdout(tmp_path: Path) -> None:
    """``batch -o -``: the result lines go to stdout (one JSON object per line), the summary to
    stderr; ``--resume`` with ``-o -`` is refused (nothing to resume from)."""
    jobs = write_jobs(tmp_path / "jobs.jsonl", 3)
    out = run("batch", str(jobs), "-o", "-", "--workers", "1", env=batch_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(r["output"] for r in results) == [0, 1, 2]
    assert "batch" in out.stderr
    again = run("batch", str(jobs), "-o", "-", "--resume", "--workers", "1", env=batch_env())
    assert again.returncode == 2 and "--resume" in one_line_error(again)


def test_wait_and_follow_are_mutually_exclusive() -> None:
    """``submit --wait --follow`` is a usage error (exit 2), refused before connecting."""
    out = run("submit", "examples.agents:echo", "--wait", "--follow")
    assert out.returncode == 2 and "not allowed with" in out.stderr, out


def test_progress_interval_bounds_have_one_message(tmp_path: Path) -> None:
    """``--progress-interval`` 0, -1, nan, inf: the same message (the bound), exit 2."""
    jobs = write_jobs(tmp_path / "jobs.jsonl", 1)
    messages = set()
    for value in ("0", "-1", "nan", "inf"):
        out = run("batch", str(jobs), "-o", str(tmp_path / "o.jsonl"), f"--progress-interval={value}")
        assert out.returncode == 2, out
        last = out.stderr.strip().splitlines()[-1]
        assert last.endswith(f"got {value}"), last
        messages.add(last.removesuffix(value))
    assert len(messages) == 1, messages
    assert "> 0" in messages.pop()


def test_stale_socket_lock_files_are_removed() -> None:
    """A daemon that stops removes its ``*.sock.lock``; one left by a daemon killed with SIGKILL
    is removed by the next daemon on that endpoint when it stops."""
    home = daemonkit.short_dir()
    lock = home / "s.sock.lock"
    try:
        first = daemonkit.start(*FAST, home=home)
        assert lock.exists()
        daemonkit.stop_process(first.proc)
        assert first.proc.returncode == 0
        assert not lock.exists()
        killed = daemonkit.start(*FAST, home=home)
        killed.proc.kill()
        daemonkit.stop_process(killed.proc)
        assert lock.exists()  # nobody could clean up after a SIGKILL
        after = daemonkit.start(*FAST, home=home)
        daemonkit.stop_process(after.proc)
        assert not lock.exists()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_cause_and_timestamps_are_written_one_way(tmp_path: Path) -> None:
    """The cause is ``{"kind": K}`` in ``result``, ``history --json`` and batch output alike;
    timestamps are epoch seconds (numbers) in every JSON output and ISO 8601 UTC in tables."""
    home = daemonkit.short_dir()
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        json.dumps({"id": "a", "input": {"seconds": 60}, "agent": "examples.agents:slow", "timeout": 0.3})
        + "\n"
    )
    with serving(*FAST, "--journal", str(home / "j.sqlite3"), home=home) as d:
        out = d.cli("batch", str(jobs), "-o", str(tmp_path / "o.jsonl"), "--connect", d.endpoint)
        assert out.returncode == 1, out.stderr
        line = json.loads((tmp_path / "o.jsonl").read_text())
        res = msgspec.json.decode(d.cli("result", line["turn_id"]).stdout)
        row = msgspec.json.decode(d.cli("history", "--json").stdout.splitlines()[0])
    assert line["cause"] == res["cause"] == row["cause"] == {"kind": "deadline"}
    for value in (
        line["submitted_at"],
        line["ended_at"],
        res["ended_at"],
        row["accepted_at"],
        row["ended_at"],
    ):
        assert isinstance(value, float) and abs(value - time.time()) < 3600, value


def test_an_over_long_id_is_cut_in_error_messages() -> None:
    """``cancel``/``result`` of a 5000-character unknown id: the message shows its start and
    its length, and stays one short line."""
    long_id = "z" * 5000
    with serving(*FAST) as d:
        for args in (("cancel", long_id), ("result", long_id)):
            out = d.cli(*args)
            err = one_line_error(out)
            assert out.returncode == 1, out
            assert len(err) < 300 and "5000 characters" in err and "zzzz" in err, err


def test_inputs_msgspec_would_turn_into_strings_are_refused() -> None:
    """``Decimal``, ``UUID``, ``date`` and naive ``datetime`` inputs are refused at submit with a
    ``TypeError`` naming where they are; a timezone-aware ``datetime`` round-trips as one."""
    script = textwrap.dedent(
        """
        import datetime, decimal, sys, uuid
        from supervisor import SyncClient
        with SyncClient.connect(sys.argv[1]) as c:
            for bad in (decimal.Decimal("1.5"), uuid.uuid4(), datetime.date.today(), datetime.datetime.now()):
                try:
                    c.submit("examples.agents:echo", {"k": [1, bad]})
                except TypeError as exc:
                    assert "$.k[1]" in str(exc) and type(bad).__name__ in str(exc), exc
                else:
                    raise SystemExit(f"{bad!r} was accepted")
            aware = datetime.datetime.now(datetime.UTC)
            out = c.run("examples.agents:echo", {"at": aware}).output
            assert out == {"at": aware}, out
        print("ok")
        """
    )
    with serving(*FAST) as d:
        out = subprocess.run(
            [sys.executable, "-c", script, d.endpoint], capture_output=True, text=True, timeout=60, env=d.env
        )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_sighup_drains_like_sigterm() -> None:
    """SIGHUP (the terminal closed) drains like SIGTERM: the running turn finishes, exit 0."""
    with (
        serving("--workers", "1", "--spares", "0", "--drain", "60") as d,
        SyncClient.connect(d.endpoint) as client,
    ):
        handle = client.submit("examples.agents:slow", {"seconds": 1})
        next(iter(handle.events()))
        d.signal(signal.SIGHUP)
        assert handle.result().outcome == "completed"
        assert d.wait(timeout=60) == 0


# ---- every path one line; a closed pipe is quiet (CLI-ONE-LINE) -------------------------------------


WAITED_BAD: tuple[tuple[str, ...], ...] = (
    ("nope",),
    ("__main__:x",),
    ("examples.agents:echo", "--timeout", "1e999"),
    ("examples.agents:echo", "--turn-id", "a\nb"),
    ("examples.agents:echo", "--session", "tab\there"),
    ("examples.agents:echo", "--turn-id", "\udcff"),  # a non-UTF-8 argument byte
    ("examples.agents:echo", "--input", "[" * 20_000 + "]" * 20_000),  # LINK-DEPTH
)


def test_submit_wait_and_follow_answer_bad_input_as_submit_does() -> None:
    """CLI-ONE-LINE: ``submit BAD --wait`` / ``--follow`` (a bad agent name, ``__main__:x``, a timeout
    of ``1e999``, a turn id or session LINK-TURN-ID refuses) prints the same one line and exit 2 as
    ``submit BAD`` (was: a 53-line ExceptionGroup traceback and exit 1). (One daemon for both modes.)"""
    home = daemonkit.short_dir()
    with serving(*FAST, "--no-journal", home=home) as d:
        for bad in WAITED_BAD:
            plain = d.cli("submit", *bad)
            assert plain.returncode == 2, (bad, plain.stderr)
            for mode in ("--wait", "--follow"):
                waited = d.cli("submit", *bad, mode)
                assert waited.returncode == 2, (mode, bad, plain.stderr, waited.stderr)
                assert one_line_error(waited) == one_line_error(plain), (mode, bad)
        status = d.cli("status", "--json")
        assert msgspec.json.decode(status.stdout)["outcomes"] == {}, status.stdout  # nothing ran


def _closed_stdout(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``turnpool ARGS`` with a stdout whose reader has gone (``| head -1`` after its line)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            daemonkit.turnpool_argv(*args),
            env=env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=BOUND * 2,
            stdin=subprocess.DEVNULL,
        )
    finally:
        os.close(write_end)


def test_a_closed_pipe_is_quiet_with_exit_141() -> None:
    """CLI-ONE-LINE: every command that prints, writing into a pipe whose reader is gone (``turnpool
    history | head -1``), ends quietly with exit 141 (128 + SIGPIPE, as a shell tool ends) and
    nothing on stderr (was: a BrokenPipeError traceback)."""
    home = daemonkit.short_dir()
    with serving(*FAST, "--journal", str(home / "j.sqlite3"), home=home) as d:
        assert d.cli("submit", "examples.agents:echo", "--wait", "--turn-id", "p-1").returncode == 0
        for args in (
            ("history",),
            ("history", "--json"),
            ("result", "p-1"),
            ("status",),
            ("submit", "examples.agents:echo", "--input", "1", "--wait"),
            ("submit", "examples.agents:echo", "--input", "2", "--follow"),
            ("submit", "examples.agents:echo"),
        ):
            out = _closed_stdout(*args, env=d.env)
            assert out.returncode == 141 and out.stderr.strip() in ("", *_ids_said(out.stderr)), (args, out)

    for args in (("--version",), ("--help",)):  # argparse drops what it cannot write: quiet, exit 0
        out = _closed_stdout(*args, env=d.env)
        assert out.returncode == 0 and out.stderr == "", (args, out)


def _ids_said(err: str) -> list[str]:
    """``submit --wait`` names its turn on stderr before waiting (CLI-INTERRUPT): allowed, nothing else."""
    lines = err.strip().splitlines()
    return [err.strip()] if lines and all("submitted; waiting" in line for line in lines) else []


def _refusal(out: subprocess.CompletedProcess[str]) -> None:
    """Exit 1 or 2 and one line on stderr; an argparse usage error (its usage, then one
    ``turnpool CMD: error: ...`` line, exit 2) counts as that line."""
    assert out.returncode in (1, 2), out
    err = out.stderr.strip()
    if err.startswith("usage:"):
        assert out.returncode == 2 and "Traceback" not in err, err
        assert err.splitlines()[-1].startswith("turnpool ") and ": error: " in err.splitlines()[-1], err
    else:
        one_line_error(out)


def test_fuzzed_cli_arguments_get_an_acknowledgement_or_one_line() -> None:
    """CLI-ONE-LINE under hypothesis: ``submit`` (plain, ``--wait``, ``--follow``) and ``cancel`` with any
    agent, input, turn id, session and timeout text (a non-UTF-8 byte included): exit 0 with the
    turn id printed, or exit 1/2 with one line on stderr, never a traceback. (Few examples: each
    is two processes.)"""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    arg = st.text(
        st.characters(exclude_characters="\x00", exclude_categories=["Cs"]) | st.sampled_from("\udcff\n/%"),
        max_size=12,
    )
    home = daemonkit.short_dir()
    with serving(*FAST, "--no-journal", home=home) as d:

        @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(
            agent=st.sampled_from(["examples.agents:echo", "nope", "__main__:x"]) | arg,
            options=st.dictionaries(st.sampled_from(["--input", "--turn-id", "--session", "--timeout"]), arg),
            wait=st.sampled_from([(), ("--wait",), ("--follow",)]),
        )
        def submit(agent: str, options: dict[str, str], wait: tuple[str, ...]) -> None:
            argv = [item for pair in options.items() for item in pair]
            out = d.cli("submit", agent, *argv, *wait)
            if out.returncode == 0:
                assert out.stdout.strip() and "Traceback" not in out.stderr, out
            else:
                _refusal(out)
            out = d.cli("cancel", options.get("--turn-id") or agent)
            if out.returncode:
                _refusal(out)

        submit()
