"""The daemon against faults and hostile input: SIGKILL, fuzzed frames, other users, plain tcp."""

from __future__ import annotations

import os
import random
import socket
import time
from contextlib import aclosing

import anyio
import msgspec
import psutil
import pytest
import zmq
import zmq.auth
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor import Client, DaemonUnavailable
from tests.support import daemonkit
from tests.support.daemonkit import FAST, serving
from wire import client_link

pytestmark = pytest.mark.anyio


async def _first(handle):  # type: ignore[no-untyped-def]
    with anyio.fail_after(30):
        async with aclosing(handle.events()) as events:
            async for event in events:
                return event
    raise AssertionError("no event")


async def test_sigkill_of_the_daemon_leaves_no_process_behind() -> None:
    """SIGKILL of ``turnpool serve`` while turns run (grandchildren and a setsid daemon, a CPU loop
    that never awaits, one that ignores SIGTERM, a cooperative one): every worker and descendant
    exits within a few seconds."""
    served = daemonkit.start("--workers", "4", "--spares", "1", "--no-journal", "--drain", "0")
    try:
        async with Client.connect(served.endpoint) as client:
            forker = await client.submit("examples.agents:forker", {"children": 2})
            stubborn = await client.submit("examples.agents:stubborn")
            ignorer = await client.submit("examples.agents:sigterm_ignorer")
            slow = await client.submit("examples.agents:slow", {"seconds": 600})
            info = await _first(forker)
            pids = {*info["children"], info["daemon"], info["worker"]}
            for h in (stubborn, ignorer, slow):
                pids.add((await _first(h))["pid"])
        daemon = psutil.Process(served.pid)
        pids |= {p.pid for p in daemon.children(recursive=True)}
        procs = [psutil.Process(p) for p in pids]
        t0 = time.monotonic()
        served.proc.kill()
        served.proc.wait(timeout=30)
        _, alive = psutil.wait_procs(procs, timeout=15)
        elapsed = time.monotonic() - t0
        assert [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
        print(f"daemon SIGKILL -> last of {len(procs)} descendants gone: {elapsed * 1000:.0f} ms")
        assert elapsed < 15
    finally:
        daemonkit.stop_process(served.proc)


FRAMES = st.one_of(
    st.binary(max_size=256),
    st.builds(
        msgspec.msgpack.encode,
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-(2**63), 2**64 - 1)
            | st.text(max_size=20)
            | st.binary(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
            ),
            max_leaves=12,
        ),
    ),
    st.builds(
        lambda tag, rest: msgspec.msgpack.encode([tag, *rest]),
        st.sampled_from(
            ["hello", "submit", "cancel", "cancel_session", "result", "follow", "status", "when_idle", "nope"]
        ),
        st.lists(st.integers(-(2**63), 2**64 - 1) | st.text(max_size=10) | st.none(), max_size=6),
    ),
)


def test_fuzzed_frames_to_the_client_endpoint() -> None:
    """Hypothesis-made frames and random bytes at the client endpoint: the daemon never crashes,
    never changes a turn, and answers every undecodable frame with an error; real clients keep
    being served."""
    with serving(*FAST, "--no-journal") as d:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 30_000)
        sock.connect(d.endpoint)
        sent = {"n": 0}

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(frame=FRAMES)
        def fuzz(frame: bytes) -> None:
            sock.send(frame)
            sent["n"] += 1
            reply = client_link.decode_from_daemon(sock.recv())  # always one well-formed reply
            try:
                client_link.decode_to_daemon(frame)
            except msgspec.DecodeError:
                assert isinstance(reply, client_link.Error) and reply.code == "malformed"

        try:
            fuzz()
            rng = random.Random(7)
            for _ in range(200):
                sock.send(rng.randbytes(rng.randrange(1, 300)))
                sent["n"] += 1
                reply = client_link.decode_from_daemon(sock.recv())
                assert isinstance(reply, client_link.Error)
        finally:
            sock.close()
            ctx.term()

        async def check() -> None:
            async with Client.connect(d.endpoint) as client:
                with anyio.fail_after(60):
                    result = await client.run("examples.agents:echo", "still serving")
                status = await client.status()
            assert result.outcome == "completed"
            assert status["daemon"]["malformed_frames"] >= 200
            assert d.proc.poll() is None

        anyio.run(check)
        print(f"fuzz frames sent to the client endpoint: {sent['n']}")


def test_another_user_cannot_connect() -> None:
    """The daemon's ipc socket is 0600 in a 0700 directory: a process of another uid cannot even
    connect to it."""
    with serving(*FAST, "--no-journal") as d:
        path = d.endpoint[len("ipc://") :]
        assert os.stat(path).st_mode & 0o777 == 0o600
        pid = os.fork()
        if pid == 0:  # the child: become nobody, try to connect
            code = 3
            try:
                os.setgid(65534)
                os.setuid(65534)
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(path)
                    code = 0
                except PermissionError:
                    code = 13
                finally:
                    s.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 13


async def test_tcp_without_curve_is_refused_unless_insecure() -> None:
    """``serve --endpoint tcp://…`` without CURVE exits 2 with the reason; ``--insecure-tcp`` is the
    explicit opt-in."""
    with serving(*FAST, "--no-journal") as d:
        refused = d.cli("serve", "--endpoint", "tcp://127.0.0.1:0", "--no-journal")
        assert refused.returncode == 2 and "without CURVE" in refused.stderr
    allow = ("--allow-agent", "examples.agents:*")  # SEC-SHARED: tcp:// needs an allowlist too
    with serving(*FAST, "--no-journal", "--insecure-tcp", *allow, endpoint="tcp://127.0.0.1:0") as d:
        async with Client.connect(d.endpoint) as client:
            with anyio.fail_after(60):
                assert (await client.run("examples.agents:echo", 1)).output == 1


async def test_curve_client_with_an_unknown_key_cannot_submit() -> None:
    """A CURVE client whose key is not in the allowed directory never gets in."""
    home = daemonkit.short_dir()
    keys, allowed = home / "keys", home / "allowed"
    keys.mkdir()
    allowed.mkdir()
    server_pub, server_sec = zmq.auth.create_certificates(str(keys), "server")
    _, stranger_sec = zmq.auth.create_certificates(str(keys), "stranger")
    friend_pub, _ = zmq.auth.create_certificates(str(keys), "friend")
    os.rename(friend_pub, allowed / "friend.key")
    with (
        serving(
            *FAST,
            "--no-journal",
            "--curve-secret-key",
            server_sec,
            "--curve-clients",
            str(allowed),
            "--allow-agent",  # SEC-SHARED: a tcp:// endpoint needs an agent allowlist besides CURVE
            "examples.agents:*",
            home=home,
            endpoint="tcp://127.0.0.1:0",
        ) as d,
        pytest.raises(DaemonUnavailable),
    ):
        async with Client.connect(
            d.endpoint, timeout=3, curve_server_key=server_pub, curve_secret_key=stranger_sec
        ) as client:
            await client.submit("examples.agents:echo", 1)
