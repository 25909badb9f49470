"""The serve daemon end to end: endpoint ownership, bad frames, shutdown with drain, metrics, config."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import urllib.request
from contextlib import aclosing
from typing import Any

import anyio
import msgspec
import psutil
import pytest
import zmq
import zmq.asyncio

import wire
from supervisor import Client, Daemon, DaemonShuttingDown
from tests.support import daemonkit
from tests.support.daemonkit import FAST, serving
from tests.support.events import first_event
from wire import client_link

pytestmark = pytest.mark.anyio


def test_default_endpoint_is_private() -> None:
    """Without TURNPOOL_ENDPOINT the daemon binds ``$XDG_RUNTIME_DIR/turnpool/supervisor.sock``:
    the directory is 0700 and the socket file 0600; it is removed at exit."""
    home = daemonkit.short_dir()
    with serving(*FAST, home=home, endpoint=None) as d:
        path = home / "turnpool" / "supervisor.sock"
        assert d.endpoint == f"ipc://{path}"
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        d.signal(signal.SIGTERM)
        assert d.wait() == 0
        assert not path.exists()


def test_second_daemon_on_the_same_endpoint_is_refused() -> None:
    """A second ``serve`` on a live daemon's endpoint exits 1 naming the endpoint and the pid;
    the first keeps serving."""
    with serving(*FAST) as d:
        second = d.cli("serve", *FAST)
        assert second.returncode == 1
        assert "already serving" in second.stderr
        assert d.endpoint in second.stderr and str(d.pid) in second.stderr
        status = d.cli("status", "--json")
        assert status.returncode == 0, status.stderr


def test_stale_socket_file_is_replaced() -> None:
    """A socket file left by a dead daemon (nobody listening) is replaced at start."""
    home = daemonkit.short_dir()
    path = home / "s.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens
    assert path.exists()
    with serving(*FAST, home=home) as d:
        result = d.cli("submit", "examples.agents:echo", "--input", '"x"', "--wait")
        assert result.returncode == 0, result.stderr
        assert msgspec.json.decode(result.stdout)["output"] == "x"


async def test_garbage_frames_get_error_replies() -> None:
    """Frames that do not decode (bytes, wrong shape, several frames, unknown cause) each get
    ``Error(malformed)`` and are counted; the daemon keeps serving normally."""
    with serving(*FAST) as d:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 30_000)
        sock.connect(d.endpoint)
        try:
            garbage: list[list[bytes]] = [
                [b"\xff\x00garbage"],
                [msgspec.msgpack.encode({"not": "a request"})],
                [b"two", b"frames"],
                [msgspec.msgpack.encode(["cancel", 5, "t", {"kind": "bogus"}])],
                [msgspec.msgpack.encode(["submit", 6, "a:b"])],  # missing input
            ]
            for frames in garbage:
                sock.send_multipart(frames)
                reply = client_link.decode_from_daemon(sock.recv())
                assert isinstance(reply, client_link.Error) and reply.code == "malformed" and reply.req == 0
        finally:
            sock.close()
            ctx.term()
        async with Client.connect(d.endpoint) as client:
            with anyio.fail_after(60):
                result = await client.run("examples.agents:echo", {"ok": True})
            status = await client.status()
        assert result.outcome == "completed" and result.output == {"ok": True}
        assert status["daemon"]["malformed_frames"] == len(garbage)


async def test_sigterm_drains_then_disposes_a_stubborn_turn() -> None:
    """SIGTERM: new submits get ``shutting down``; a turn that ignores Abort runs through the drain,
    is then disposed (ends ``killed`` with cause ``disposed``); the daemon exits 0 and its worker
    tree is gone."""
    with serving(
        "--workers", "1", "--spares", "0", "--grace", "0.3", "--kill-after", "1", "--drain", "0.5"
    ) as d:
        async with Client.connect(d.endpoint) as client:
            handle = await client.submit("examples.agents:stubborn")
            info = await first_event(handle)
            worker = psutil.Process(info["pid"])
            results: list[Any] = []

            async def wait_result() -> None:
                results.append(await handle.result())

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_result)
                d.signal(signal.SIGTERM)
                with anyio.fail_after(60):
                    while (await client.status())["daemon"]["accepting"]:
                        await anyio.lowlevel.checkpoint()  # each status call is a round trip
                with pytest.raises(DaemonShuttingDown, match="shutting down"):
                    await client.submit("examples.agents:echo", 1)
        with anyio.fail_after(60):
            code = await anyio.to_thread.run_sync(d.wait)
    assert code == 0, d.stderr()
    (result,) = results
    assert result.outcome == "killed" and result.cause == {"kind": "disposed"}
    assert result.exit_code in (-signal.SIGTERM, -signal.SIGKILL)
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE


async def test_drain_lets_a_running_turn_finish() -> None:
    """Within the drain a running turn completes normally, then the daemon exits 0."""
    with serving("--workers", "1", "--spares", "0", "--drain", "120") as d:
        async with Client.connect(d.endpoint) as client:
            handle = await client.submit("examples.agents:slow", {"seconds": 1.0})
            await first_event(handle)
            d.signal(signal.SIGTERM)
            with anyio.fail_after(60):
                result = await handle.result()
        with anyio.fail_after(60):
            code = await anyio.to_thread.run_sync(d.wait)
    assert result.outcome == "completed" and result.cause is None
    assert code == 0


async def test_second_signal_skips_the_drain() -> None:
    """With a long drain, a second SIGTERM ends the drain at once: the stubborn turn is disposed."""
    with serving(
        "--workers", "1", "--spares", "0", "--grace", "0.2", "--kill-after", "0.5", "--drain", "600"
    ) as d:
        async with Client.connect(d.endpoint) as client:
            handle = await client.submit("examples.agents:stubborn")
            await first_event(handle)
            d.signal(signal.SIGTERM)
            with anyio.fail_after(60):
                while (await client.status())["daemon"]["accepting"]:
                    await anyio.lowlevel.checkpoint()
            d.signal(signal.SIGINT)
            with anyio.fail_after(120):
                result = await handle.result()
        with anyio.fail_after(60):
            code = await anyio.to_thread.run_sync(d.wait)
    assert result.outcome == "killed" and result.cause == {"kind": "disposed"}
    assert code == 0


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def test_metrics_over_http_show_the_counts() -> None:
    """``--metrics-port 0`` serves Prometheus text on 127.0.0.1: turns by outcome and cause,
    queue depth, workers by state, escalations, restarts, cancel latency, malformed frames."""
    with serving(*FAST, "--metrics-port", "0") as d:
        assert d.metrics_url.startswith("http://127.0.0.1:")
        async with Client.connect(d.endpoint) as client:
            with anyio.fail_after(60):
                for i in range(3):
                    assert (await client.run("examples.agents:echo", i)).outcome == "completed"
                assert (await client.run("examples.agents:failing")).outcome == "failed"
                slow = await client.submit("examples.agents:slow", {"seconds": 60})
                await first_event(slow)
                await slow.cancel()
                assert (await slow.result()).outcome == "aborted"
                stubborn = await client.submit("examples.agents:stubborn")
                await first_event(stubborn)
                await stubborn.cancel()
                assert (await stubborn.result()).outcome == "killed"
                await client.when_idle()
        ctx = zmq.Context()
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.RCVTIMEO, 30_000)
        raw.connect(d.endpoint)
        raw.send(b"junk")
        assert client_link.decode_from_daemon(raw.recv()).code == "malformed"  # type: ignore[union-attr]
        raw.close()
        ctx.term()
        m = await anyio.to_thread.run_sync(_scrape, d.metrics_url)
    assert m['turnpool_turns_total{cause="none",outcome="completed"}'] == 3
    assert m['turnpool_turns_total{cause="none",outcome="failed"}'] == 1
    assert m['turnpool_turns_total{cause="user",outcome="aborted"}'] == 1
    assert m['turnpool_turns_total{cause="user",outcome="killed"}'] == 1
    assert m["turnpool_turns_accepted_total"] == 6
    assert m["turnpool_queue_depth"] == 0
    assert m['turnpool_workers{state="busy"}'] == 0
    assert m['turnpool_workers{state="idle"}'] + m['turnpool_workers{state="starting"}'] == 2
    assert m['turnpool_escalations_total{step="sigterm"}'] == 1
    assert m["turnpool_worker_restarts_total"] == 1
    assert m["turnpool_worker_endpoint_rebinds_total"] == 0 and m["turnpool_worker_start_failures"] == 0
    assert m["turnpool_cancel_to_end_seconds_count"] == 2
    assert m['turnpool_malformed_frames_total{link="client"}'] == 1


def test_config_file_with_flags_overriding() -> None:
    """``--config`` TOML sets options; a flag overrides the file; an unknown key exits 2."""
    home = daemonkit.short_dir()
    config = home / "serve.toml"
    config.write_text("workers = 3\nspares = 0\ngrace = 1\nkill-after = 1\ndrain = 0\n")
    with serving("--config", str(config), "--workers", "1", home=home) as d:
        status = d.cli("status", "--json")
        assert status.returncode == 0, status.stderr
        workers = msgspec.json.decode(status.stdout)["workers"]
        assert len(workers) == 1
    bad = daemonkit.short_dir()
    (bad / "bad.toml").write_text("wokers = 2\n")
    proc = daemonkit.start("--config", str(bad / "bad.toml"), home=bad, check_ready=False)
    assert proc.wait() == 2
    assert "unknown option 'wokers'" in proc.stderr()
    assert proc.proc.stdout is not None
    proc.proc.stdout.close()


async def test_hook_sites_and_programmatic_stop() -> None:
    """In-process ``Daemon``: accept, start and end hooks run in order for each new turn (not for an
    idempotent resubmit); an awaitable from an accept hook holds the submit's acknowledgement until
    it is done; ``stop()`` drains and disposes like SIGTERM."""
    home = daemonkit.short_dir()
    endpoint = f"ipc://{home}/hooks.sock"
    options = {"workers": 1, "spares": 0, "grace": 0.5, "kill_after": 0.5}
    daemon = Daemon(endpoint, supervisor=options, drain=0)
    calls: list[tuple[str, str]] = []
    gate = anyio.Event()

    def on_accept(turn: Any) -> Any:
        calls.append(("accept", turn.id))
        return gate.wait() if turn.id == "gated" else None

    daemon.accept_hooks.append(on_accept)
    daemon.start_hooks.append(lambda turn, pid: calls.append(("start", turn.id)))
    daemon.end_hooks.append(lambda turn, result: calls.append(("end", f"{turn.id}:{result.outcome}")))
    ready = anyio.Event()
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: daemon.serve(ready=lambda line: ready.set()))
            await ready.wait()
            async with Client.connect(endpoint) as client:
                assert (await client.run("examples.agents:echo", 1, turn_id="plain")).outcome == "completed"
                await client.submit("examples.agents:echo", 1, turn_id="plain")  # known: no hook
                acked: list[str] = []

                async def submit_gated() -> None:
                    acked.append((await client.submit("examples.agents:echo", 3, turn_id="gated")).turn_id)

                tg.start_soon(submit_gated)
                while ("accept", "gated") not in calls:
                    await client.status()  # a round trip: the daemon has read the submit before it
                assert acked == []
                gate.set()
                result = await client.handle("gated").result()
                assert acked == ["gated"] and result.outcome == "completed"
            daemon.stop()
    assert calls == [
        ("accept", "plain"),
        ("start", "plain"),
        ("end", "plain:completed"),
        ("accept", "gated"),
        ("start", "gated"),
        ("end", "gated:completed"),
    ]
    assert not (home / "hooks.sock").exists()
    shutil.rmtree(home, ignore_errors=True)


async def test_oversized_requests_are_refused() -> None:
    """A request above the size the daemon announced is refused by the client before sending
    (``ValueError`` naming the limit); a raw frame above ``MAXMSGSIZE`` is dropped by the socket
    and the daemon keeps serving."""
    with serving(*FAST) as d:
        async with Client.connect(d.endpoint) as client:
            assert client.max_message_size == wire.MAX_MESSAGE_SIZE
            with pytest.raises(ValueError, match="limit"):
                await client.submit("examples.agents:echo", b"x" * (wire.MAX_MESSAGE_SIZE + 1))
            ctx = zmq.Context()
            raw = ctx.socket(zmq.DEALER)
            raw.setsockopt(zmq.LINGER, 0)
            raw.connect(d.endpoint)
            raw.send(b"\x00" * (wire.MAX_MESSAGE_SIZE + 1))
            with anyio.fail_after(60):
                assert (await client.run("examples.agents:echo", "still here")).output == "still here"
            raw.close()
            ctx.term()


def test_bad_serve_options_exit_2() -> None:
    """Options the Supervisor refuses (zero workers, negative grace), a bad log level or an endpoint
    of another transport make ``serve`` exit 2 with the reason, before binding anything."""
    home = daemonkit.short_dir()
    for args, needle in (
        (("--workers", "0"), "workers must be >= 1"),
        (("--grace", "-1"), "grace must be"),
        (("--log-level", "LOUD"), "--log-level"),
        (("--endpoint", "inproc://x"), "unknown scheme 'inproc'"),
    ):
        out = subprocess.run(
            daemonkit.turnpool_argv("serve", *args),
            env=daemonkit.env_for(home, None),
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert out.returncode == 2, (args, out)
        assert needle in out.stderr, (args, out.stderr)
    assert not (home / "turnpool" / "supervisor.sock").exists()
    shutil.rmtree(home, ignore_errors=True)


async def test_follow_flow_control_holds_events_until_credit() -> None:
    """A follow with a window gets that many events and no more until it grants credit, even when
    the turn has long ended (the Result of a later request overtakes the held events); credit
    releases the rest, then ``FollowEnd``."""
    with serving(*FAST) as d:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(d.endpoint)

        async def ask(msg: Any) -> None:
            await sock.send(wire.encode(msg))

        held: list[Any] = []

        async def reply() -> Any:
            # Version 3 packs several replies into one frame (a batch): hand them out one by one.
            while not held:
                held.extend(client_link.decode_from_daemon_frame(await sock.recv()))
            return held.pop(0)

        try:
            with anyio.fail_after(60):
                await ask(client_link.Hello(1, client_link.CLIENT_PROTOCOL_VERSION))
                assert isinstance(await reply(), client_link.Welcome)
                await ask(
                    client_link.Submit(
                        2, "examples.agents:streamer", msgspec.Raw(wire.encode({"count": 50})), wait=True
                    )
                )
                accepted = await reply()
                assert isinstance(accepted, client_link.Accepted)
                assert isinstance(await reply(), client_link.Result)  # the turn has ended: all 50 retained
                await ask(client_link.Follow(3, accepted.turn_id, window=5))
                await ask(client_link.GetResult(4, accepted.turn_id))
                got: list[int] = []
                result_seen = False
                while not (result_seen and len(got) >= 5):
                    msg = await reply()
                    if isinstance(msg, client_link.Result):  # answered at once (the turn has ended)
                        result_seen = True
                        continue
                    assert isinstance(msg, client_link.Events)
                    got.extend(msgspec.msgpack.decode(raw)["i"] for raw in msg.data)
                assert got == [0, 1, 2, 3, 4]  # and nothing more until the client grants credit
                await ask(client_link.Credit(3, 45))
                while len(got) < 50:
                    msg = await reply()
                    assert isinstance(msg, client_link.Events)
                    got.extend(msgspec.msgpack.decode(raw)["i"] for raw in msg.data)
                assert got == list(range(50))
                await ask(client_link.Credit(3, 1))
                assert isinstance(await reply(), client_link.FollowEnd)
        finally:
            sock.close()
            ctx.term()
        async with Client.connect(d.endpoint, follow_window=8) as client:
            with anyio.fail_after(60):
                handle = await client.submit("examples.agents:streamer", {"count": 300})
                async with aclosing(handle.events()) as events:
                    seen = [e["i"] async for e in events]
        assert seen == list(range(300))


def test_workers_that_cannot_start_make_serve_exit_1() -> None:
    """A pool that cannot start (the worker interpreter exits at once) makes ``serve`` exit 1 with
    the reason, leaving no socket file and no process."""
    home = daemonkit.short_dir()
    argv = daemonkit.turnpool_argv("serve", "--python", "/bin/false", "--workers", "1", "--spares", "0")
    out = subprocess.run(
        argv,
        env=daemonkit.env_for(home, f"ipc://{home}/s.sock"),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 1, out
    assert "workers could not be started" in out.stderr
    assert not (home / "s.sock").exists()
    shutil.rmtree(home, ignore_errors=True)


async def test_journal_records_what_clients_saw() -> None:
    """``serve --journal PATH`` records each accepted turn (acknowledged after commit), its start and
    its end: ``turnpool result`` prints what the client saw, ``history`` lists them; a second daemon
    on the same journal is refused."""
    home = daemonkit.short_dir()
    journal = home / "journal.sqlite3"
    with serving(*FAST, "--journal", str(journal), "--journal-events", home=home) as d:
        async with Client.connect(d.endpoint) as client:
            with anyio.fail_after(60):
                done = await client.run("examples.agents:streamer", {"count": 2}, turn_id="j-1")
                failed = await client.run("examples.agents:failing", turn_id="j-2")
        other = daemonkit.start(
            *FAST, "--journal", str(journal), home=daemonkit.short_dir(), check_ready=False
        )
        assert other.wait() == 1 and "locked" in other.stderr()
        assert other.proc.stdout is not None
        other.proc.stdout.close()
        shutil.rmtree(other.home, ignore_errors=True)
        d.signal(signal.SIGTERM)
        assert d.wait() == 0
        for result in (done, failed):
            out = d.cli("result", result.turn_id, "--journal", str(journal))
            assert out.returncode == 0, out.stderr
            assert msgspec.json.decode(out.stdout, type=wire.TurnResult) == result
        history = d.cli("history", "--journal", str(journal), "--json")
        rows = [msgspec.json.decode(line) for line in history.stdout.splitlines()]
        con = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
        try:
            events = [
                msgspec.msgpack.decode(row[0])
                for row in con.execute("SELECT data FROM events WHERE turn_id='j-1' ORDER BY seq")
            ]
        finally:
            con.close()
    assert [e["i"] for e in events] == [0, 1]
    assert {(r["turn_id"], r["outcome"]) for r in rows} == {("j-1", "completed"), ("j-2", "failed")}
