"""Security of the embedded supervisor's worker link, without the daemon.

The private worker endpoint lives in a 0700 directory owned by the supervisor's user;
another user cannot connect to it (tested with a real second uid); each worker proves itself
with a per-spawn token that agent code and its children never see; every socket carries
``MAXMSGSIZE`` and payloads above the limit are refused where they are made; the queue, the
per-turn event buffer and the result store are bounded.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import anyio
import pytest
import zmq

import wire
from supervisor import QueueFull, Supervisor, UnknownTurn
from supervisor.lowlevel import private_dir, runtime_dir

pytestmark = pytest.mark.anyio

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by any user (the venv may live in a private home)

CONNECT_AS_OTHER_USER = r"""
import socket, sys, os
path = sys.argv[1]
results = []
try:
    os.listdir(os.path.dirname(path))
    results.append("listed")
except PermissionError:
    results.append("list-refused")
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(path)
    s.sendall(b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f")  # a ZMTP greeting start
    results.append("connected")
except PermissionError:
    results.append("connect-refused")
print(" ".join(results))
"""


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


async def test_worker_endpoint_directory_is_private() -> None:
    """The runtime directory and the supervisor's private directory are 0700 and ours; the worker
    socket lives inside; a runtime directory left 0755 is tightened back to 0700."""
    base = runtime_dir()
    assert _mode(base) == 0o700 and os.lstat(base).st_uid == os.getuid()
    async with Supervisor(workers=1, spares=0) as sup:
        path = sup.link.endpoint.removeprefix("ipc://")
        directory = os.path.dirname(path)
        assert _mode(directory) == 0o700 and os.lstat(directory).st_uid == os.getuid()
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        assert Path(directory).parent == base


def test_runtime_dir_is_tightened_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime directory found with a looser mode is reset to 0700; one owned by another user is refused."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    loose = tmp_path / "turnpool"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    assert runtime_dir() == loose and _mode(loose) == 0o700
    assert _mode(private_dir(loose)) == 0o700
    if os.getuid() != 0:
        pytest.skip("needs root to hand a directory to another user")
    os.chown(loose, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match="not a directory owned by this user"):
        runtime_dir()


@pytest.mark.skipif(
    os.getuid() != 0 or not os.path.exists(SYSTEM_PYTHON), reason="needs root and a system python"
)
async def test_another_user_cannot_connect_to_the_worker_endpoint() -> None:
    """A process running as another uid (nobody) can neither list the private directory nor
    connect to the worker socket: the kernel refuses it, so it cannot send a single frame."""
    async with Supervisor(workers=1, spares=0) as sup:
        path = sup.link.endpoint.removeprefix("ipc://")
        with anyio.fail_after(30):
            proc = await anyio.run_process(
                [SYSTEM_PYTHON, "-c", CONNECT_AS_OTHER_USER, path],
                user=NOBODY,
                group=NOBODY,
                extra_groups=[],
                cwd="/",
            )
        assert proc.stdout.decode().split() == ["list-refused", "connect-refused"]
        # As root (the owner), the same connection succeeds: the refusal is the permission, not the path.
        proc = await anyio.run_process([SYSTEM_PYTHON, "-c", CONNECT_AS_OTHER_USER, path])
        assert proc.stdout.decode().split() == ["listed", "connected"]
        with anyio.fail_after(30):
            assert (await sup.run("examples.agents:echo", "still fine")).outcome == "completed"


async def test_spawn_tokens_are_per_spawn_and_hidden_from_agents() -> None:
    """Each worker gets its own token; it is not on any command line, and neither agent code nor
    the agent's child processes can read it from their environment."""
    async with Supervisor(workers=2, spares=1) as sup:
        # The block opens once ``workers`` are ready; the spare may still be starting (pid 0 until
        # the zygote reports it: CI read /proc/0/cmdline under load). Wait for it, bounded.
        with anyio.fail_after(60):
            while True:
                if all(w["pid"] for w in (await sup.status())["workers"]):
                    break
                await anyio.sleep(0.02)  # allowed: pacing a bounded poll of the pool (no public event)
        slots = list(sup.pool.slots.values())
        tokens = {s.token for s in slots}
        assert len(tokens) == len(slots) == 3 and all(len(t) == 32 for t in tokens)
        for s in slots:
            with open(f"/proc/{s.pid}/cmdline", "rb") as f:  # noqa: ASYNC230 - /proc, instant
                assert s.token.encode() not in f.read()
        with anyio.fail_after(30):
            probe = await sup.run("tests.agents.faults:env_probe")
    assert probe.output == {"in_environ": False, "in_child": False}


async def test_every_socket_carries_maxmsgsize() -> None:
    """The supervisor's ROUTER and the worker's DEALER both refuse frames above ``MAX_MESSAGE_SIZE``."""
    async with Supervisor(workers=1, spares=0) as sup:
        assert sup.link.socket.getsockopt(zmq.MAXMSGSIZE) == wire.MAX_MESSAGE_SIZE  # type: ignore[union-attr]
        with anyio.fail_after(30):
            result = await sup.run("tests.agents.faults:socket_options")
    assert result.output["maxmsgsize"] == wire.MAX_MESSAGE_SIZE


async def test_oversized_payloads_are_refused_where_they_are_made() -> None:
    """An input above ``MAX_PAYLOAD_SIZE`` raises at ``submit``; an oversized output or event fails
    its turn (``PayloadTooLarge``) and the worker keeps serving: no frame ever hits MAXMSGSIZE."""
    big = "x" * (wire.MAX_PAYLOAD_SIZE + 1)
    async with Supervisor(workers=1, spares=0) as sup:
        with pytest.raises(wire.PayloadTooLarge, match="turn input is"):
            await sup.submit("examples.agents:echo", big)
        assert (await sup.status())["queue"] == 0 and (await sup.status())["outcomes"] == {}
        with anyio.fail_after(60):
            out = await sup.run("tests.agents.faults:big_output")
            ev = await sup.run("tests.agents.faults:big_event")
            after = await sup.run("examples.agents:echo", "fine")
    assert out.outcome == "failed" and out.error and out.error.type == "PayloadTooLarge"
    assert ev.outcome == "failed" and ev.error and ev.error.type == "PayloadTooLarge"
    assert after.outcome == "completed" and after.worker_pid == out.worker_pid == ev.worker_pid


async def test_queue_is_bounded() -> None:
    """Beyond ``max_queue`` queued turns, ``submit`` raises ``QueueFull`` and changes nothing."""
    async with Supervisor(workers=1, spares=0, max_queue=3, grace=5) as sup:
        blocker = await sup.submit("tests.agents:wait_signal")
        async for _ in blocker.events():
            break
        queued = [await sup.submit("examples.agents:echo", i) for i in range(3)]
        with pytest.raises(QueueFull):
            await sup.submit("examples.agents:echo", "one too many")
        assert (await sup.status())["queue"] == 3
        await blocker.cancel()
        with anyio.fail_after(30):
            results = [await h.result() for h in queued]
        assert [r.output for r in results] == [0, 1, 2]
        with anyio.fail_after(30):
            assert (await sup.run("examples.agents:echo", "room again")).outcome == "completed"


async def test_event_buffer_is_bounded_and_a_slow_follower_skips() -> None:
    """At most ``max_events`` events are kept per turn: a follower that falls behind (or comes
    late) skips the dropped ones — the sequence numbers show the gap — and still sees the newest
    events in order and the end of the turn; the turn itself is unaffected."""
    async with Supervisor(workers=1, spares=0, max_events=10) as sup:
        handle = await sup.submit("tests.agents.faults:stream_when_told", {"count": 100})
        follower = sup.follow_raw(handle.turn_id)
        with anyio.fail_after(30):
            first = await follower.__anext__()  # a follower that reads one event, then stalls
        await handle.cancel()  # tells the agent to emit the other 99
        with anyio.fail_after(30):
            result = await handle.result()
        rest = [seq async for seq, _ in follower]
        late = [wire.decode_payload(raw)["i"] async for _, raw in sup.follow_raw(handle.turn_id)]
    assert result.outcome == "completed" and result.output == {"events": 100}
    assert first[0] == 0
    assert rest and rest[0] > 1 and rest == list(range(rest[0], 100))  # a gap, then in order to the end
    assert 1 <= len(late) <= 10 and late == list(range(100 - len(late), 100))


async def test_result_store_is_bounded() -> None:
    """Only the last ``keep_results`` ended turns are kept: older ids become unknown."""
    async with Supervisor(workers=1, spares=0, keep_results=5) as sup:
        with anyio.fail_after(30):
            ids = [(await sup.run("examples.agents:echo", i)).turn_id for i in range(8)]
        for old in ids[:3]:
            with pytest.raises(UnknownTurn):
                sup.handle(old)
        for kept in ids[3:]:
            assert (await sup.handle(kept).result()).outcome == "completed"
        assert len(sup.table) == 5
