"""Hostile input on the worker link, from both ends.

Towards the supervisor (its private worker endpoint, ``sup.link.endpoint``): random bytes and
random multipart frames from a stranger; valid messages from a stranger (including an
``End`` for a running turn); a peer spoofing a live worker's identity; a frame above
``MAXMSGSIZE``; and a *puppet worker* — the test itself holding a worker slot's identity —
that sends undecodable frames and valid messages out of order, a ``Ready`` without the spawn
token, and a ``Ready`` in another protocol version. Nothing crashes, no turn changes, every
bad frame is counted in ``status()["bad_frames"]`` and the pool keeps serving.

Towards a worker (a worker started by hand against the test's ROUTER): undecodable frames
get a ``BadFrame`` reply each and the worker keeps serving; an oversized frame is dropped.

The number of frames tried is printed (``-s``) and recorded in ``benchmarks/SOAK.md``.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import zmq
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wire
from supervisor import Supervisor
from supervisor import lowlevel as sup_lowlevel
from wire import worker_link
from worker.lowlevel import EXIT_LINK_LOST

EXAMPLES = int(os.environ.get("TURNPOOL_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
FRAMES_TRIED: dict[str, int] = {}


class WatchedSupervisor(Supervisor):
    """A Supervisor whose ``bad_frames`` counter can be awaited (no polling, no sleeps)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._bad = 0
        self._bad_waiters: list[tuple[int, anyio.Event]] = []
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def bad_frames(self) -> int:
        return self._bad

    @bad_frames.setter
    def bad_frames(self, value: int) -> None:
        self._bad = value
        keep = []
        for n, ev in self._bad_waiters:
            if value >= n:
                ev.set()
            else:
                keep.append((n, ev))
        self._bad_waiters = keep

    async def wait_bad_frames(self, n: int) -> None:
        if self._bad >= n:
            return
        ev = anyio.Event()
        self._bad_waiters.append((n, ev))
        with anyio.fail_after(30):
            await ev.wait()


def _dealer(ctx: zmq.Context[Any], endpoint: str, identity: bytes | None = None) -> zmq.Socket[Any]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(endpoint)
    return sock


def _undecodable_from_worker(data: bytes) -> bool:
    try:
        worker_link.decode_from_worker(data)
    except msgspec.DecodeError:
        return True
    return False


class _Hosted:
    """Runs ``async with sup:`` in one task of the portal (a task group must be entered and left
    by the same task); ``entered`` resolves once ``start()`` returned, ``close()`` disposes."""

    def __init__(self, portal: BlockingPortal, sup: Supervisor) -> None:
        import concurrent.futures

        self.portal = portal
        self.entered: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.stop = portal.call(anyio.Event)
        self.task = portal.start_task_soon(self._host, sup)

    async def _host(self, sup: Supervisor) -> None:
        try:
            async with sup:
                self.entered.set_result(None)
                await self.stop.wait()
        except BaseException as exc:
            if not self.entered.done():
                self.entered.set_exception(exc)
            raise

    def close(self) -> None:
        self.portal.call(self.stop.set)
        self.task.result(timeout=60)


# Well-formed msgpack frames whose messages carry a tag no union member has, or a known tag
# with fields of the wrong shape.
_TAGS = [
    "run",
    "abort",
    "spawned",
    "shutdown",
    "ready",
    "hb",
    "started",
    "event",
    "end",
    "spawn",
    "spawn_cancel",
    "bad_frame",
]
_unknown_tags = st.tuples(
    st.text(max_size=12) | st.sampled_from(_TAGS),
    st.lists(st.integers(-5, 5) | st.text(max_size=5) | st.none(), max_size=4),
).map(lambda t: msgspec.msgpack.encode([[t[0], *t[1]]]))


@pytest.fixture
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal("asyncio") as p:
        yield p


# ---- a stranger on the worker endpoint ---------------------------------------------------


def test_stranger_frames_are_counted_and_change_nothing(portal: BlockingPortal) -> None:
    """Random bytes, random multipart frames, valid messages (even an ``End`` naming the running
    turn, a ``Ready`` with a guessed token), a spoofed live identity and an oversized frame, sent
    to the worker endpoint by a stranger: no crash, the running turn is untouched (it is still
    running and later ends ``completed`` by its own worker), each frame is counted."""
    sup = WatchedSupervisor(workers=1, spares=0, grace=5)
    hosted = _Hosted(portal, sup)
    hosted.entered.result(timeout=60)
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        handle = portal.call(sup.submit, "tests.agents:wait_signal")
        portal.call(_first, handle)
        turn_id = handle.turn_id
        slot = next(iter(sup.pool.slots.values()))
        stranger = _dealer(ctx, sup.link.endpoint)
        sent = 0

        @FUZZ
        @given(parts=st.lists(st.binary(max_size=300), min_size=1, max_size=4))
        def fuzz(parts: list[bytes]) -> None:
            nonlocal sent
            stranger.send_multipart(parts)
            sent += 1
            portal.call(sup.wait_bad_frames, sent)

        fuzz()
        valid = [
            worker_link.End(turn_id, "completed", wire.encode_payload("forged")),
            worker_link.Started(turn_id),
            worker_link.Event(turn_id, wire.encode_payload({"forged": True})),
            worker_link.Ready(slot.pid, "0" * 32, worker_link.PROTOCOL_VERSION),
            worker_link.Ready(
                slot.pid, slot.token, worker_link.PROTOCOL_VERSION
            ),  # even the right token: wrong peer
            worker_link.Spawn(1, turn_id, "examples.agents:echo", wire.encode_payload(1)),
        ]
        for msg in valid:
            stranger.send(worker_link.encode_frame([msg]))
            sent += 1
        portal.call(sup.wait_bad_frames, sent)
        # A frame above MAXMSGSIZE: the socket drops it and the peer; the supervisor never sees it.
        stranger.send(b"\x91" + b"\x00" * (wire.MAX_MESSAGE_SIZE + 1))
        # A peer that takes a live worker's identity: ZeroMQ refuses the duplicate identity.
        spoof = _dealer(ctx, sup.link.endpoint, identity=slot.ident)
        spoof.send(
            worker_link.encode_frame([worker_link.End(turn_id, "completed", wire.encode_payload("spoofed"))])
        )
        FRAMES_TRIED["stranger"] = sent + 2
        print(f"stranger frames tried: {sent + 2}")

        record = sup.record(turn_id)
        assert record.state == "running" and record.result is None and record.cause is None
        assert len(record.events) == 1  # only the worker's own event
        assert portal.call(sup.status)["outcomes"] == {}
        portal.call(handle.cancel)
        result = portal.call(_result, handle)
        assert result.outcome == "completed" and result.output == {"saw": "user"}
        assert result.worker_pid == slot.pid
        assert portal.call(_run_echo, sup).outcome == "completed"
        assert sup.bad_frames >= sent
        spoof.close()
        stranger.close()
    finally:
        ctx.term()
        hosted.close()


async def _first(handle: Any) -> Any:
    with anyio.fail_after(30):
        async for event in handle.events():
            return event


async def _result(handle: Any) -> Any:
    with anyio.fail_after(30):
        return await handle.result()


async def _run_echo(sup: Supervisor) -> Any:
    with anyio.fail_after(30):
        return await sup.run("examples.agents:echo", "after")


# ---- a puppet worker: the test holds a real slot's identity and token ---------------------


class _Puppet:
    """A worker slot whose process is ``sleep`` and whose socket is the test's DEALER."""

    def __init__(self, portal: BlockingPortal, tmp: Path, **kwargs: Any) -> None:
        wrapper = tmp / "puppet"
        wrapper.write_text("#!/bin/sh\nexec sleep 600 </dev/null >/dev/null 2>&1\n")
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
        self.portal = portal
        self.sup = WatchedSupervisor(workers=1, spares=0, python=str(wrapper), stop_timeout=0.2, **kwargs)
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.sock: zmq.Socket[Any] | None = None

    def slot(self) -> Any:
        return next(s for s in self.sup.pool.slots.values() if s.state == "starting")

    def connect(self, slot: Any) -> zmq.Socket[Any]:
        self.sock = _dealer(self.ctx, self.sup.link.endpoint, identity=slot.ident)
        return self.sock

    def send(self, *msgs: Any) -> None:
        assert self.sock is not None
        self.sock.send(worker_link.encode_frame(list(msgs)))

    def recv(self) -> list[Any]:
        assert self.sock is not None
        assert self.sock.poll(30_000), "the supervisor sent nothing"
        return worker_link.decode_to_worker(self.sock.recv())

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.ctx.term()


def _start_in_background(portal: BlockingPortal, sup: Supervisor, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Start ``sup`` without waiting for Ready; returns (future of start(), event per spawn)."""
    spawned: list[Any] = []
    real = sup_lowlevel.procs.spawn_worker

    def spawn(**kwargs: Any) -> int:
        pid = real(**kwargs)
        count[0] += 1
        for ev in spawned:
            ev.set()
        spawned.clear()
        return pid

    monkeypatch.setattr(sup_lowlevel.procs, "spawn_worker", spawn)

    count = [0]

    async def wait_spawn(n: int = 1) -> None:
        """Wait until the ``n``-th worker was spawned."""
        while count[0] < n:
            ev = anyio.Event()
            spawned.append(ev)
            with anyio.fail_after(30):
                await ev.wait()

    hosted = _Hosted(portal, sup)
    return hosted, wait_spawn


def test_puppet_without_the_token_is_ignored(
    portal: BlockingPortal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that holds a worker's identity but not its spawn token (or lies about its pid) is
    ignored and counted; a ``Ready`` in another protocol version gets the worker killed and the
    reason reported; the real handshake then works."""
    puppet = _Puppet(portal, tmp_path, start_timeout=30)
    sup = puppet.sup
    hosted, wait_spawn = _start_in_background(portal, sup, monkeypatch)
    fut = hosted.entered
    try:
        portal.call(wait_spawn)
        slot = puppet.slot()
        puppet.connect(slot)
        puppet.send(worker_link.Ready(slot.pid, "f" * 32, worker_link.PROTOCOL_VERSION))
        puppet.send(worker_link.Ready(slot.pid + 1, slot.token, worker_link.PROTOCOL_VERSION))
        puppet.send(worker_link.Ready(slot.pid, "", worker_link.PROTOCOL_VERSION))
        portal.call(sup.wait_bad_frames, 3)
        assert slot.state == "starting" and not fut.done()
        # The right token in a protocol version we do not speak: refused, killed, reported.
        puppet.send(worker_link.Ready(slot.pid, slot.token, worker_link.PROTOCOL_VERSION + 1))
        portal.call(sup.wait_bad_frames, 4)
        portal.call(wait_spawn, 2)  # the killed slot was replaced (after a back-off)
        assert "protocol" in (portal.call(sup.status)["last_start_error"] or "")
        puppet.sock.close()  # type: ignore[union-attr]
        second = puppet.slot()
        assert second.token != slot.token  # per-spawn tokens
        puppet.connect(second)
        puppet.send(worker_link.Ready(second.pid, second.token, worker_link.PROTOCOL_VERSION))
        fut.result(timeout=30)
        assert second.state == "idle"
    finally:
        puppet.close()
        hosted.close()


def test_puppet_out_of_order_messages_change_nothing(
    portal: BlockingPortal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker (with a valid token) sending undecodable frames and valid messages out of order
    — ``Started``/``Event``/``End`` for other turns, a second ``Ready``, spawns for a turn it does
    not run, unknown spawn cancels — while it runs a turn: the turn's state is unchanged, no other
    turn appears or ends, each bad message is counted; its real ``End`` then completes the turn
    and the pool keeps serving."""
    puppet = _Puppet(portal, tmp_path)
    sup = puppet.sup
    hosted, wait_spawn = _start_in_background(portal, sup, monkeypatch)
    fut = hosted.entered
    try:
        portal.call(wait_spawn)
        slot = puppet.slot()
        puppet.connect(slot)
        puppet.send(worker_link.Ready(slot.pid, slot.token, worker_link.PROTOCOL_VERSION))
        fut.result(timeout=30)
        handle = portal.call(sup.submit, "examples.agents:echo", "payload")
        (run,) = puppet.recv()
        assert isinstance(run, worker_link.Run) and run.turn_id == handle.turn_id
        tid = run.turn_id
        puppet.send(worker_link.Started(tid))
        record = sup.record(tid)
        n_turns = len(sup.table)
        state = {"bad": sup.bad_frames, "seq": 0, "tried": 0}
        other_ids = st.text(min_size=0, max_size=12).filter(lambda s: s != tid)
        payload = st.builds(wire.encode_payload, st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20))
        counted = st.one_of(
            st.binary(max_size=200).filter(_undecodable_from_worker).map(lambda b: ("raw", b)),
            _unknown_tags.filter(_undecodable_from_worker).map(lambda b: ("raw", b)),
            st.builds(worker_link.Started, other_ids),
            st.builds(worker_link.Event, other_ids, payload),
            st.builds(worker_link.End, other_ids, st.sampled_from(["completed", "failed", "aborted"])),
            st.builds(worker_link.Ready, st.integers(0, 2**31), st.text(max_size=40), st.integers(0, 5)),
        )
        uncounted = st.one_of(
            st.builds(worker_link.Heartbeat, st.integers(0, 2**31)),
            st.builds(worker_link.SpawnCancel, st.integers(-(2**31), 2**31)),
            st.builds(worker_link.BadFrame, st.text(max_size=40)),
            st.builds(
                worker_link.Spawn,
                st.integers(0, 2**31),
                other_ids,
                st.just("examples.agents:echo"),
                payload,
            ),
            st.just(worker_link.Started(tid)),  # a repeat of the real Started: harmless
        )

        def is_bad(msg: Any) -> bool:
            if isinstance(msg, tuple):
                return True  # undecodable bytes
            if isinstance(msg, (worker_link.Started, worker_link.Event, worker_link.End)):
                return msg.turn_id != tid
            return isinstance(msg, worker_link.Ready)  # this worker is past its handshake

        @FUZZ
        @given(msgs=st.lists(counted | uncounted, min_size=1, max_size=8))
        def fuzz(msgs: list[Any]) -> None:
            for msg in msgs:
                if isinstance(msg, tuple):
                    puppet.sock.send(msg[1])  # type: ignore[union-attr]
                else:
                    puppet.send(msg)
            expected = sum(is_bad(m) for m in msgs)
            state["tried"] += len(msgs)
            # A sentinel event of the running turn: once it is seen, every frame before it was handled.
            state["seq"] += 1
            puppet.send(worker_link.Event(tid, wire.encode_payload({"sentinel": state["seq"]})))
            portal.call(_wait_events, sup, tid, state["seq"])
            state["bad"] += expected
            assert sup.bad_frames == state["bad"]
            assert record.state == "running" and record.result is None and record.cause is None
            assert len(sup.table) == n_turns and portal.call(sup.status)["outcomes"] == {}
            while puppet.sock.poll(0):  # type: ignore[union-attr]
                for reply in worker_link.decode_to_worker(puppet.sock.recv()):  # type: ignore[union-attr]
                    assert isinstance(reply, worker_link.SpawnReply) and reply.error is not None

        fuzz()
        FRAMES_TRIED["puppet"] = state["tried"]
        print(f"puppet frames tried: {state['tried']}")
        puppet.send(worker_link.End(tid, "completed", wire.encode_payload("real")))
        result = portal.call(_result, handle)
        assert result.outcome == "completed" and result.output == "real"
        h2 = portal.call(sup.submit, "examples.agents:echo", 2)
        (run2,) = puppet.recv()
        puppet.send(
            worker_link.Started(run2.turn_id),
            worker_link.End(run2.turn_id, "completed", wire.encode_payload(2)),
        )
        assert portal.call(_result, h2).outcome == "completed"
    finally:
        puppet.close()
        hosted.close()


async def _wait_events(sup: Supervisor, turn_id: str, n: int) -> None:
    """Wait until the turn has ``n`` events after its first (the sentinels)."""
    with anyio.fail_after(30):
        async for seq, _ in sup.follow_raw(turn_id):
            if seq >= n - 1:
                return


# ---- a fake supervisor in front of a real worker ------------------------------------------


def _start_worker_by_hand(endpoint: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, TURNPOOL_SPAWN_TOKEN="t0k3n", PYTHONPATH=os.pathsep.join([os.getcwd(), *sys.path]))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker",
            "--endpoint",
            endpoint,
            "--id",
            "w1",
            "--parent-pid",
            str(os.getpid()),
            "--heartbeat",
            "0",
        ],
        env=env,
        start_new_session=True,
    )


def test_worker_answers_bad_frames_and_keeps_serving() -> None:
    """A worker started by hand against the test's ROUTER: every undecodable frame gets a
    ``BadFrame`` reply and the worker still runs a turn; an oversized frame makes the socket drop
    the connection for good, so the worker exits (``EXIT_LINK_LOST``) instead of staying up deaf."""
    short = tempfile.mkdtemp(prefix="tp-", dir="/tmp")
    ctx: zmq.Context[Any] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    endpoint = f"ipc://{short}/w.sock"
    router.bind(endpoint)
    proc = _start_worker_by_hand(endpoint)

    def recv() -> list[Any]:
        assert router.poll(30_000), "the worker sent nothing"
        ident, frame = router.recv_multipart()
        assert ident == b"w1"
        return worker_link.decode_from_worker(frame)

    try:
        (ready,) = recv()
        assert isinstance(ready, worker_link.Ready) and ready.token == "t0k3n" and ready.pid == proc.pid
        tried = 0

        @FUZZ
        @given(data=st.binary(max_size=300) | _unknown_tags)
        def fuzz(data: bytes) -> None:
            nonlocal tried
            try:
                worker_link.decode_to_worker(data)
                return  # decodes (e.g. an empty list): not a bad frame
            except msgspec.DecodeError:
                pass
            tried += 1
            router.send_multipart([b"w1", data])
            (reply,) = recv()
            assert isinstance(reply, worker_link.BadFrame)

        fuzz()
        FRAMES_TRIED["to_worker"] = tried
        print(f"frames to the worker tried: {tried}")
        run = worker_link.Run("t1", "examples.agents:echo", wire.encode_payload("still here"))
        router.send_multipart([b"w1", worker_link.encode_frame([run])])
        msgs: list[Any] = []
        while not any(isinstance(m, worker_link.End) for m in msgs):
            msgs += recv()
        end = next(m for m in msgs if isinstance(m, worker_link.End))
        assert end.outcome == "completed" and wire.decode_payload(end.output) == "still here"
        # Oversized: the worker's socket drops the frame and the connection, and ZeroMQ does not
        # reconnect it. A worker that can never report again must not stay up deaf: it exits
        # with EXIT_LINK_LOST (its supervisor sees a crash and replaces it).
        router.send_multipart([b"w1", b"\x91" + b"\x00" * (wire.MAX_MESSAGE_SIZE + 1)])
        assert proc.wait(timeout=30) == EXIT_LINK_LOST
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        router.close()
        ctx.term()
        shutil.rmtree(short, ignore_errors=True)


def test_worker_exits_cleanly_on_shutdown() -> None:
    """The same hand-started worker leaves on ``Shutdown`` with exit code 0 (its guardian-free
    start: no life pipe given)."""
    short = tempfile.mkdtemp(prefix="tp-", dir="/tmp")
    ctx: zmq.Context[Any] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{short}/w.sock"
    router.bind(endpoint)
    proc = _start_worker_by_hand(endpoint)
    try:
        assert router.poll(30_000)
        ident, _ready = router.recv_multipart()
        router.send_multipart([ident, worker_link.encode_frame([worker_link.Shutdown()])])
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        router.close()
        ctx.term()
        shutil.rmtree(short, ignore_errors=True)


async def _next_monitor_event(mon: Any) -> None:
    with anyio.fail_after(30):
        await mon.recv_multipart()


def test_unreachable_worker_is_replaced_and_its_turn_requeued(
    portal: BlockingPortal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose connection is gone (here: the puppet closes its socket) cannot be handed a
    turn: the failed send gets it killed, the turn goes back to the queue unharmed and runs on the
    replacement (``attempts`` 2) — it does not wait forever on a worker that will never answer."""
    puppet = _Puppet(portal, tmp_path)
    sup = puppet.sup
    hosted, wait_spawn = _start_in_background(portal, sup, monkeypatch)
    try:
        portal.call(wait_spawn)
        first = puppet.slot()
        puppet.connect(first)
        puppet.send(worker_link.Ready(first.pid, first.token, worker_link.PROTOCOL_VERSION))
        hosted.entered.result(timeout=30)
        mon = portal.call(lambda: sup.link.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED))  # type: ignore[union-attr]
        puppet.sock.close()  # type: ignore[union-attr]
        portal.call(_next_monitor_event, mon)  # the supervisor's socket saw the peer go
        portal.call(lambda: (sup.link.socket.disable_monitor(), mon.close()))  # type: ignore[union-attr]
        handle = portal.call(sup.submit, "examples.agents:echo", "again")
        portal.call(wait_spawn, 2)
        second = puppet.slot()
        puppet.connect(second)
        puppet.send(worker_link.Ready(second.pid, second.token, worker_link.PROTOCOL_VERSION))
        (run,) = puppet.recv()
        assert isinstance(run, worker_link.Run) and run.turn_id == handle.turn_id
        puppet.send(
            worker_link.Started(run.turn_id),
            worker_link.End(run.turn_id, "completed", wire.encode_payload("again")),
        )
        result = portal.call(_result, handle)
        assert result.outcome == "completed" and result.attempts == 2 and result.worker_pid == second.pid
        assert first.state == "dead" and first.exit_code == -9
    finally:
        puppet.close()
        hosted.close()
