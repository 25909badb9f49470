"""``Client`` and ``SyncClient`` against a real ``turnpool serve``: the Supervisor's methods over a socket,
typed errors, many clients, clients that die, idempotent submit, failing fast without a daemon."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from contextlib import aclosing, suppress

import anyio
import psutil
import pytest
import zmq
import zmq.auth

import supervisor
from supervisor import (
    Client,
    DaemonUnavailable,
    InvalidAgent,
    ProtocolError,
    QueueFull,
    SyncClient,
    TurnHandle,
    TurnIdConflict,
    TurnResult,
    UnknownTurn,
)
from tests.support import daemonkit
from tests.support.daemonkit import FAST, serving
from tests.support.events import first_event
from wire import client_link

pytestmark = pytest.mark.anyio


def test_exports() -> None:
    """``Client`` and ``SyncClient`` are public names of ``supervisor``; the protocol lives in
    ``wire.client_link``."""
    assert {"Client", "SyncClient", "DaemonUnavailable", "DaemonShuttingDown"} <= set(supervisor.__all__)
    assert {"Hello", "Welcome", "Submit", "Error", "ToDaemon", "FromDaemon"} <= set(client_link.__all__)


async def test_async_client_has_the_supervisor_methods() -> None:
    """submit/events/result, run, handle, cancel, cancel_session, status, when_idle — over the socket."""
    with serving(*FAST) as d:
        async with Client.connect(d.endpoint) as client:
            with anyio.fail_after(60):
                handle = await client.submit("examples.agents:streamer", {"count": 4})
                assert isinstance(handle, TurnHandle)
                async with aclosing(handle.events()) as events:
                    seen = [e async for e in events]
                assert [e["i"] for e in seen] == [0, 1, 2, 3]
                result = await handle.result()
                assert isinstance(result, TurnResult) and result.outcome == "completed"
                assert result.output == {"events": 4}

                echoed = await client.run("examples.agents:echo", {"text": "hi"}, session="s0")
                assert echoed.output == {"text": "hi"} and echoed.session == "s0"
                again = client.handle(echoed.turn_id)
                assert (await again.result()) == echoed
                assert await client.exists(echoed.turn_id) and not await client.exists("nope")

                slow = await client.submit("examples.agents:slow", {"seconds": 60})
                await first_event(slow)
                assert await slow.cancel() == {"kind": "user"}
                assert await client.cancel(slow.turn_id, {"kind": "parent"}) == {"kind": "user"}  # first wins
                aborted = await slow.result()
                assert aborted.outcome == "aborted" and aborted.cause == {"kind": "user"}

                running = await client.submit("examples.agents:slow", {"seconds": 60}, session="s1")
                queued = await client.submit("examples.agents:echo", 1, session="s1")
                await first_event(running)
                cancelled = await client.cancel_session("s1")
                assert set(cancelled) == {running.turn_id, queued.turn_id}
                assert (await queued.result()).started is False
                await client.when_idle()
                status = await client.status()
        assert {w["state"] for w in status["workers"]} <= {"idle", "starting"}
        assert status["queue"] == 0 and status["outcomes"]["completed"] == 2
        assert status["daemon"]["endpoint"] == d.endpoint


def test_sync_client_blocks() -> None:
    """``SyncClient.connect(ep)`` offers the same methods, blocking, with blocking handles."""
    with serving(*FAST) as d, SyncClient.connect(d.endpoint) as client:
        result = client.run("examples.agents:echo", [1, 2])
        assert result.outcome == "completed" and result.output == [1, 2]
        handle = client.submit("examples.agents:streamer", {"count": 3})
        assert [e["i"] for e in handle.events()] == [0, 1, 2]
        assert handle.result().outcome == "completed"
        slow = client.submit("examples.agents:slow", {"seconds": 60})
        next(iter(slow.events()))
        assert slow.cancel() == {"kind": "user"}
        assert slow.result().outcome == "aborted"
        assert client.handle(result.turn_id).result() == result
        assert client.cancel_session("nobody") == []
        client.when_idle()
        assert client.status()["outcomes"]["completed"] == 2
        with pytest.raises(UnknownTurn):
            client.cancel("no-such-turn")


async def test_errors_are_typed_and_validated_before_sending() -> None:
    """Bad causes, agents and inputs raise at the call (nothing sent); the daemon's refusals come
    back typed: unknown turn, queue full, protocol mismatch."""
    with serving(
        "--workers", "1", "--spares", "0", "--max-queue", "1", "--grace", "0.3", "--drain", "0"
    ) as d:
        async with Client.connect(d.endpoint) as client:
            for cause in (
                "user",
                {"kind": "user", "x": 1},
                {"kind": "nope"},
                ["user"],
                ValueError("user"),
                {"kind": 1},
            ):
                with pytest.raises((TypeError, ValueError)):
                    await client.cancel("anything", cause)
            with pytest.raises(InvalidAgent):
                await client.submit("not an agent")
            with pytest.raises(TypeError, match="not encodable"):
                await client.submit("examples.agents:echo", object())
            with pytest.raises(ValueError):
                await client.submit("examples.agents:echo", timeout=-1)
            with pytest.raises(UnknownTurn, match="no-such"):
                await client.cancel("no-such")
            with pytest.raises(UnknownTurn):
                await client.handle("no-such").result()
            with pytest.raises(UnknownTurn):
                async with aclosing(client.handle("no-such").events()) as events:
                    async for _ in events:
                        pass
            status = await client.status()
            assert status["daemon"]["malformed_frames"] == 0 and status["outcomes"] == {}
        awaited = await Client.connect(d.endpoint)  # the other form: await, then aclose
        try:
            assert awaited.daemon_pid == d.pid
            with pytest.raises(RuntimeError, match="connects once"):
                await awaited.open()
        finally:
            await awaited.aclose()
        with pytest.raises(supervisor.SupervisorClosed, match="closed"):
            await awaited.status()
        async with Client.connect(d.endpoint) as client:
            running = await client.submit("examples.agents:slow", {"seconds": 60})
            await first_event(running)
            queued = await client.submit("examples.agents:echo", 1)
            with pytest.raises(QueueFull):
                await client.submit("examples.agents:echo", 2)
            await client.cancel(queued.turn_id)
            await running.cancel()
            await client.when_idle()

        old = client_link.CLIENT_PROTOCOL_VERSION
        client_link.CLIENT_PROTOCOL_VERSION = old + 1  # type: ignore[misc]
        try:
            with pytest.raises(ProtocolError, match="protocol"):
                async with Client.connect(d.endpoint):
                    pass
        finally:
            client_link.CLIENT_PROTOCOL_VERSION = old  # type: ignore[misc]


async def test_no_daemon_fails_fast_naming_the_endpoint() -> None:
    """Against no daemon — no socket file, a stale socket file, a closed tcp port — connecting
    raises ``DaemonUnavailable`` naming the endpoint, well within the bound."""
    home = daemonkit.short_dir()
    stale = home / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    port_sock = socket.socket()
    port_sock.bind(("127.0.0.1", 0))
    port = port_sock.getsockname()[1]
    port_sock.close()
    for endpoint in (f"ipc://{home}/none.sock", f"ipc://{stale}", f"tcp://127.0.0.1:{port}"):
        t0 = time.monotonic()
        with anyio.fail_after(30):
            with pytest.raises(DaemonUnavailable, match=endpoint.replace(".", r"\.")):
                async with Client.connect(endpoint, timeout=20):
                    pass
        assert time.monotonic() - t0 < 15, endpoint  # refused: no need to wait for the timeout
    t0 = time.monotonic()
    with (
        pytest.raises(DaemonUnavailable, match=r"none\.sock"),
        SyncClient.connect(f"ipc://{home}/none.sock"),
    ):
        pass
    assert time.monotonic() - t0 < 15


async def test_lost_daemon_fails_pending_calls() -> None:
    """A client waiting on a result when the daemon dies (SIGKILL) gets ``DaemonUnavailable``
    promptly, not a hang; the daemon's workers still go away on their own."""
    with serving(*FAST) as d:
        async with Client.connect(d.endpoint) as client:
            handle = await client.submit("examples.agents:slow", {"seconds": 60})
            info = await first_event(handle)
            d.signal(signal.SIGKILL)
            with anyio.fail_after(60):
                with pytest.raises(DaemonUnavailable, match="not reachable"):
                    await handle.result()
            with pytest.raises(DaemonUnavailable):
                await client.status()
        d.wait()
        # The orphaned worker notices its supervisor's death and exits (reaped by us, its subreaper).
        with anyio.fail_after(60):
            await anyio.to_thread.run_sync(_wait_gone, info["pid"])
        assert not psutil.pid_exists(info["pid"])


def _wait_gone(pid: int) -> None:
    with suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout=50)


async def test_fifty_clients_twenty_turns_each() -> None:
    """50 clients at once, 20 turns each (echo, failing, cancelled slow): every one of the 1000
    turns ends with exactly one outcome, the expected one, and the daemon's counts agree."""
    clients, per_client = 50, 20
    with serving("--workers", "2", "--spares", "0", "--grace", "5", "--drain", "0") as d:
        results: dict[str, TurnResult] = {}
        expected: dict[str, str] = {}

        async def one_client(c: int) -> None:
            async with Client.connect(d.endpoint, timeout=60) as client:
                handles = []
                for i in range(per_client):
                    if i % 10 == 9:
                        h = await client.submit("examples.agents:slow", {"seconds": 60})
                        await client.cancel(h.turn_id)
                        expected[h.turn_id] = "aborted"
                    elif i % 5 == 0:
                        h = await client.submit("examples.agents:failing", {"message": f"{c}-{i}"})
                        expected[h.turn_id] = "failed"
                    else:
                        h = await client.submit("examples.agents:echo", {"c": c, "i": i})
                        expected[h.turn_id] = "completed"
                    handles.append(h)
                for h in handles:
                    r = await h.result()
                    assert h.turn_id not in results
                    results[h.turn_id] = r

        with anyio.fail_after(300):
            async with anyio.create_task_group() as tg:
                for c in range(clients):
                    tg.start_soon(one_client, c)
            async with Client.connect(d.endpoint) as client:
                status = await client.status()
    assert len(results) == clients * per_client
    for turn_id, r in results.items():
        assert r.turn_id == turn_id and r.outcome == expected[turn_id], r
        if r.outcome == "completed":
            assert r.output["i"] % 5 != 0
    counts = status["outcomes"]
    assert sum(counts.values()) == clients * per_client
    assert counts == {
        "completed": clients * 14,
        "failed": clients * 4,
        "aborted": clients * 2,
    }


_KILLED_CLIENT = r"""
import sys, anyio
from supervisor import Client

async def main():
    async with Client.connect(sys.argv[1]) as client:
        handle = await client.submit("examples.agents:slow", {"seconds": 1.5}, turn_id=sys.argv[2])
        async for event in handle.events():
            print("event", event["type"], flush=True)
        await handle.result()

anyio.run(main)
"""


async def test_client_killed_mid_turn_and_a_new_client_fetches_the_result() -> None:
    """A client process killed (SIGKILL) while following its turn cancels nothing: the turn
    completes and a new client fetches its result by id."""
    with serving(*FAST) as d:
        async with await anyio.open_process(
            [sys.executable, "-c", _KILLED_CLIENT, d.endpoint, "orphan-1"], env=d.env, stderr=None
        ) as proc:
            try:
                assert proc.stdout is not None
                line = b""
                with anyio.fail_after(60):
                    while not line.endswith(b"\n"):
                        line += await proc.stdout.receive(1)
                assert line.strip() == b"event started"
            finally:
                proc.kill()
                killed_at = time.time()
                await proc.wait()
        assert proc.returncode == -signal.SIGKILL
        async with Client.connect(d.endpoint) as client:
            with anyio.fail_after(60):
                result = await client.handle("orphan-1").result()
        assert result.outcome == "completed" and result.cause is None
        assert result.output == {"slept": 1.5}
        assert result.started_at is not None and result.started_at < killed_at < result.ended_at


async def test_idempotent_submit_by_turn_id() -> None:
    """Submitting a known ``turn_id`` again with the same request (from any client) returns that
    turn and never runs it twice; another input under it is ``TurnIdConflict``."""
    with serving(*FAST) as d:
        async with Client.connect(d.endpoint) as a, Client.connect(d.endpoint) as b:
            with anyio.fail_after(60):
                first = await a.submit("examples.agents:echo", {"n": 1}, turn_id="job-7")
                second = await b.submit("examples.agents:echo", {"n": 1}, turn_id="job-7")
                assert first.turn_id == second.turn_id == "job-7"
                with pytest.raises(TurnIdConflict, match="input"):
                    await b.submit("examples.agents:echo", {"n": 2}, turn_id="job-7")
                r1 = await first.result()
                r3 = await a.run("examples.agents:echo", {"n": 1}, turn_id="job-7")
                assert r1 == await second.result() == r3
                assert r1.output == {"n": 1}
                status = await a.status()
    assert status["outcomes"] == {"completed": 1}


async def test_several_followers_of_one_turn() -> None:
    """Two clients follow one turn while it runs; a third follows after it ended: all see every
    event in order."""
    with serving(*FAST) as d:
        async with Client.connect(d.endpoint) as a, Client.connect(d.endpoint) as b:
            handle = await a.submit("examples.agents:streamer", {"count": 20, "delay": 0.01})
            seen: dict[str, list[int]] = {}

            async def follow(name: str, client: Client) -> None:
                async with aclosing(client.handle(handle.turn_id).events()) as events:
                    seen[name] = [e["i"] async for e in events]

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(follow, "a", a)
                    tg.start_soon(follow, "b", b)
                await handle.result()
                async with Client.connect(d.endpoint) as late:
                    await follow("late", late)
    assert seen == {name: list(range(20)) for name in ("a", "b", "late")}


async def test_early_stop_of_a_follow_leaves_the_turn_running() -> None:
    """Leaving an ``events()`` loop early stops the stream only; the turn goes on."""
    with serving(*FAST) as d:
        async with Client.connect(d.endpoint) as client:
            handle = await client.submit("examples.agents:streamer", {"count": 10, "delay": 0.01})
            assert (await first_event(handle))["i"] == 0
            with anyio.fail_after(60):
                result = await handle.result()
                status = await client.status()
    assert result.outcome == "completed"
    assert status["daemon"]["streams"] == 0


async def test_curve_over_tcp() -> None:
    """With ``--curve-secret-key`` and ``--curve-clients`` a tcp daemon admits only clients whose
    public key is in the directory; a client without keys cannot get in."""
    home = daemonkit.short_dir()
    keys, allowed = home / "keys", home / "allowed"
    keys.mkdir()
    allowed.mkdir()
    server_pub, server_sec = zmq.auth.create_certificates(str(keys), "server")
    client_pub, client_sec = zmq.auth.create_certificates(str(keys), "client")
    os.rename(client_pub, allowed / "client.key")
    with serving(
        *FAST,
        "--curve-secret-key",
        server_sec,
        "--curve-clients",
        str(allowed),
        "--allow-agent",  # SEC-SHARED: a tcp:// endpoint needs an agent allowlist besides CURVE
        "examples.agents:*",
        home=home,
        endpoint="tcp://127.0.0.1:0",
    ) as d:
        assert d.endpoint.startswith("tcp://127.0.0.1:")
        keys = {"curve_server_key": server_pub, "curve_secret_key": client_sec}
        async with Client.connect(d.endpoint, **keys) as client:
            with anyio.fail_after(60):
                assert (await client.run("examples.agents:echo", "secret")).output == "secret"
        with pytest.raises(DaemonUnavailable, match=d.endpoint.replace(".", r"\.")):
            async with Client.connect(d.endpoint, timeout=3):
                pass


def test_a_refused_submit_raises_on_the_client_what_refused_it_on_the_daemon() -> None:
    """The daemon turns a refused submit into an error code and the client turns the code back into
    an exception, from one table read both ways (``supervisor.lowlevel.SUBMIT_ERROR_CODES``): each
    refusal comes back as an instance of the class that refused it, with its message."""
    from supervisor.client.client import _error
    from supervisor.lowlevel import SUBMIT_ERROR_CODES

    for kind, _ in SUBMIT_ERROR_CODES:
        refused = kind("no")
        code = next(code for k, code in SUBMIT_ERROR_CODES if isinstance(refused, k))
        raised = _error(client_link.Error(1, code, "no"), None, "ipc://x")
        assert isinstance(raised, kind) and str(raised) == "no", (kind, code, raised)
