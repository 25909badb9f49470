"""``turnpool acp``: a real subprocess driven by the ``agent-client-protocol`` package's client side."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import psutil
import pytest

acp = pytest.importorskip("acp", reason="the acp extra is not installed")
from acp.schema import AgentMessageChunk, ToolCallProgress, ToolCallStart  # noqa: E402

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
TURNPOOL = Path(sys.executable).with_name("turnpool")
LIMIT = 64 * 1024 * 1024
ONE = ("--workers", "1", "--spares", "0")  # one worker, no spare: pids tell workers apart


class Recorder:
    """The editor's side: records every ``session/update`` and lets a test wait for one."""

    def __init__(self) -> None:
        self.updates: list[Any] = []
        self._changed = anyio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)
        self._changed.set()
        self._changed = anyio.Event()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise acp.RequestError.method_not_found("session/request_permission")

    async def wait_for(self, pred: Callable[[Any], bool]) -> Any:
        """The first update (already received or still to come) matching ``pred``."""
        seen = 0
        while True:
            for update in self.updates[seen:]:
                if pred(update):
                    return update
            seen = len(self.updates)
            await self._changed.wait()

    def text(self) -> str:
        return "".join(u.content.text for u in self.updates if isinstance(u, AgentMessageChunk))


@contextlib.asynccontextmanager
async def acp_agent(
    tmp_path: Path, agent: str, *extra: str, ends_by_eof: bool = True, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Any, Recorder, str, Any]]:
    """Spawn ``turnpool acp --agent AGENT``, initialize, open a session; yields the connection,
    the recorder, the session id and the process; closes and reaps it on exit.

    With ``ends_by_eof`` (default) the agent must still run when the block ends, then exit 0
    by itself once its stdin is closed. ``env`` adds to the agent's environment."""
    recorder = Recorder()
    stderr = open(tmp_path / "acp-stderr.log", "wb")  # noqa: ASYNC230, SIM115 (a local file, closed below)
    env = {"PYTHONPATH": str(ROOT), **(env or {})}
    try:
        async with acp.spawn_agent_process(
            recorder,
            str(TURNPOOL),
            "acp",
            "--agent",
            agent,
            *extra,
            env=env,
            cwd=ROOT,
            transport_kwargs={"stderr": stderr, "limit": LIMIT, "shutdown_timeout": 30.0},
        ) as (conn, proc):
            with anyio.fail_after(60):
                init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
                assert init.protocol_version == acp.PROTOCOL_VERSION
                session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            yield conn, recorder, session.session_id, proc
            if ends_by_eof:
                assert proc.returncode is None, "the acp agent died during the test"
        if ends_by_eof:
            # spawn_agent_process closed stdin and waited: the agent exits by itself on EOF.
            assert proc.returncode == 0, (tmp_path / "acp-stderr.log").read_text()
    finally:
        stderr.close()


async def test_prompt_streams_updates_and_ends_turn(tmp_path: Path) -> None:
    """A prompt streams message chunks and a tool call (start → completed) and answers ``end_turn``."""
    async with acp_agent(tmp_path, "examples.acp_agents:chat", *ONE) as (conn, rec, sid, _):
        with anyio.fail_after(60):
            response = await conn.prompt(session_id=sid, prompt=[acp.text_block("one two three")])
    assert response.stop_reason == "end_turn"
    assert response.field_meta["turnpool"]["outcome"] == "completed"
    assert rec.text() == "Counting your words. You wrote 3 words. "
    starts = [u for u in rec.updates if isinstance(u, ToolCallStart)]
    progress = [u for u in rec.updates if isinstance(u, ToolCallProgress)]
    assert [(s.tool_call_id, s.title, s.status) for s in starts] == [
        ("count-1", "count_words", "in_progress")
    ]
    assert [(p.tool_call_id, p.status, p.raw_output) for p in progress] == [
        ("count-1", "completed", {"words": 3})
    ]
    # Updates arrive in the order the agent emitted them, all before the answer.
    kinds = [type(u).__name__ for u in rec.updates]
    assert kinds == ["AgentMessageChunk", "ToolCallStart", "ToolCallProgress"] + ["AgentMessageChunk"] * 4


async def test_cancel_cooperative_turn_answers_cancelled_quickly(tmp_path: Path) -> None:
    """``session/cancel`` of a cooperative turn: ``cancelled`` well before the grace, the open
    tool call reported ended and marked cancelled, no error; the next prompt works normally."""
    grace = 20.0
    async with acp_agent(tmp_path, "examples.acp_agents:slow", *ONE, "--grace", str(grace)) as (
        conn,
        rec,
        sid,
        _,
    ):
        async with anyio.create_task_group() as tg:
            answers: list[Any] = []

            async def ask() -> None:
                answers.append(await conn.prompt(session_id=sid, prompt=[acp.text_block("60")]))

            tg.start_soon(ask)
            with anyio.fail_after(60):
                await rec.wait_for(lambda u: isinstance(u, ToolCallStart))
            t0 = time.monotonic()
            await conn.cancel(session_id=sid)
        elapsed = time.monotonic() - t0
        (first,) = answers
        assert first.stop_reason == "cancelled"
        assert first.field_meta["turnpool"]["outcome"] == "aborted"
        assert first.field_meta["turnpool"]["cause"] == "user"
        assert elapsed < grace / 2
        closing = [u for u in rec.updates if isinstance(u, ToolCallProgress)]
        assert [(u.tool_call_id, u.status, u.field_meta) for u in closing] == [
            ("sleep-1", "failed", {"turnpool": {"cancelled": True}})
        ]
        with anyio.fail_after(60):
            again = await conn.prompt(session_id=sid, prompt=[acp.text_block("0")])
        assert again.stop_reason == "end_turn"
        assert again.field_meta["turnpool"]["worker_pid"] == first.field_meta["turnpool"]["worker_pid"]


async def test_cancel_stubborn_turn_kills_and_replaces_the_worker(tmp_path: Path) -> None:
    """A turn that ignores the cancel: answered ``cancelled`` (not an error) only after the grace,
    its worker killed and reaped, its tool call reported ended; a new worker (new pid) serves the
    session's next prompt."""
    grace = 0.5
    async with acp_agent(
        tmp_path, "tests.agents.acp:by_prompt", *ONE, "--grace", str(grace), "--kill-after", "1"
    ) as (conn, rec, sid, _):
        async with anyio.create_task_group() as tg:
            answers: list[Any] = []

            async def ask() -> None:
                answers.append(await conn.prompt(session_id=sid, prompt=[acp.text_block("spin")]))

            tg.start_soon(ask)
            with anyio.fail_after(60):
                await rec.wait_for(lambda u: isinstance(u, ToolCallStart))
            t0 = time.monotonic()
            await conn.cancel(session_id=sid)
        elapsed = time.monotonic() - t0
        (first,) = answers
        meta = first.field_meta["turnpool"]
        old_pid = meta["worker_pid"]
        assert first.stop_reason == "cancelled"
        assert meta["outcome"] == "killed" and meta["cause"] == "user"
        assert elapsed >= grace * 0.9
        assert not psutil.pid_exists(old_pid)  # killed and reaped before the answer
        closing = [u for u in rec.updates if isinstance(u, ToolCallProgress)]
        assert [(u.tool_call_id, u.status) for u in closing] == [("spin-1", "failed")]
        with anyio.fail_after(60):
            second = await conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])
        assert second.stop_reason == "end_turn"
        new_pid = second.field_meta["turnpool"]["worker_pid"]
        assert new_pid != old_pid and psutil.pid_exists(new_pid)
        assert rec.text().endswith("hello")


async def test_cancel_right_after_prompt_still_cancels(tmp_path: Path) -> None:
    """A cancel sent right behind its prompt (before the turn can have started) is not lost:
    the prompt answers ``cancelled``, and the session serves the next one."""
    async with acp_agent(tmp_path, "examples.acp_agents:slow", *ONE, "--grace", "20") as (conn, _rec, sid, _):
        answers: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def ask() -> None:
                answers.append(await conn.prompt(session_id=sid, prompt=[acp.text_block("60")]))

            with anyio.fail_after(60):
                tg.start_soon(ask)
                await anyio.lowlevel.checkpoint()  # let the prompt go out first, as an editor would
                await conn.cancel(session_id=sid)
        with anyio.fail_after(60):
            again = await conn.prompt(session_id=sid, prompt=[acp.text_block("0")])
    (first,) = answers
    assert first.stop_reason == "cancelled"
    assert first.field_meta["turnpool"]["outcome"] == "aborted"
    assert again.stop_reason == "end_turn"


async def test_editor_gone_mid_turn_stops_everything(tmp_path: Path) -> None:
    """The editor closes stdin while a stubborn turn runs: the agent kills the turn's worker
    tree after the grace and exits 0 with nothing left behind."""
    async with (
        acp_agent(tmp_path, "tests.agents.acp:by_prompt", *ONE, "--grace", "0.3", "--kill-after", "1") as (
            conn,
            rec,
            sid,
            _,
        ),
        anyio.create_task_group() as tg,
    ):

        async def ask() -> None:
            with contextlib.suppress(ConnectionError):
                await conn.prompt(session_id=sid, prompt=[acp.text_block("spin")])

        tg.start_soon(ask)
        with anyio.fail_after(60):
            await rec.wait_for(lambda u: isinstance(u, ToolCallStart))
        tg.cancel_scope.cancel()
    # acp_agent checked the exit status; the autouse fixture checks that no process is left.


async def test_sigterm_disposes_and_exits_zero(tmp_path: Path) -> None:
    """SIGTERM while a stubborn turn runs: the agent stops the turn (escalating), reaps every
    worker and exits 0."""
    async with (
        acp_agent(
            tmp_path,
            "tests.agents.acp:by_prompt",
            *ONE,
            "--grace",
            "0.3",
            "--kill-after",
            "1",
            ends_by_eof=False,
        ) as (conn, rec, sid, proc),
        anyio.create_task_group() as tg,
    ):

        async def ask() -> None:
            with contextlib.suppress(ConnectionError):
                await conn.prompt(session_id=sid, prompt=[acp.text_block("spin")])

        tg.start_soon(ask)
        with anyio.fail_after(60):
            await rec.wait_for(lambda u: isinstance(u, ToolCallStart))
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0, (tmp_path / "acp-stderr.log").read_text()
        tg.cancel_scope.cancel()


async def test_cancel_without_a_prompt_is_harmless(tmp_path: Path) -> None:
    """``session/cancel`` with nothing running (and for an unknown session) changes nothing:
    the next prompt runs normally and is not cancelled."""
    async with acp_agent(tmp_path, "examples.acp_agents:echo", *ONE) as (conn, rec, sid, _):
        await conn.cancel(session_id=sid)
        await conn.cancel(session_id="no-such-session")
        with anyio.fail_after(60):
            response = await conn.prompt(session_id=sid, prompt=[acp.text_block("still here")])
    assert response.stop_reason == "end_turn"
    assert rec.text() == "still here"


async def test_one_mebibyte_prompt_round_trips(tmp_path: Path) -> None:
    """A 1 MiB prompt reaches the agent and comes back as one 1 MiB update, intact."""
    big = "".join(chr(ord("a") + i % 26) for i in range(1 << 20))
    async with acp_agent(tmp_path, "examples.acp_agents:echo", *ONE) as (conn, rec, sid, _):
        with anyio.fail_after(120):
            response = await conn.prompt(session_id=sid, prompt=[acp.text_block(big)])
    assert response.stop_reason == "end_turn"
    assert len(rec.updates) == 1
    assert rec.text() == big


async def test_crashed_and_failed_turns_answer_an_error(tmp_path: Path) -> None:
    """A turn whose worker dies answers a JSON-RPC error saying it crashed; one whose agent
    raises, an error saying it failed (type and message); the session still serves."""
    async with acp_agent(tmp_path, "tests.agents.acp:by_prompt", *ONE) as (conn, _rec, sid, _):
        with anyio.fail_after(60):
            with pytest.raises(acp.RequestError) as crashed:
                await conn.prompt(session_id=sid, prompt=[acp.text_block("crash")])
            with pytest.raises(acp.RequestError) as failed:
                await conn.prompt(session_id=sid, prompt=[acp.text_block("fail")])
            ok = await conn.prompt(session_id=sid, prompt=[acp.text_block("fine")])
    assert "crashed" in str(crashed.value) and "exit code 3" in str(crashed.value)
    assert crashed.value.data["outcome"] == "crashed"
    assert "failed" in str(failed.value) and "ValueError: asked to fail" in str(failed.value)
    assert ok.stop_reason == "end_turn"


async def test_cancelled_turn_that_then_fails_still_answers_cancelled(tmp_path: Path) -> None:
    """A cancelled turn whose agent raises on the way out ends ``failed``, yet the prompt answers
    ``cancelled`` and no error: the editor asked to stop, and it stopped."""
    async with (
        acp_agent(tmp_path, "tests.agents.acp:by_prompt", *ONE, "--grace", "20") as (
            conn,
            rec,
            sid,
            _,
        ),
        anyio.create_task_group() as tg,
    ):
        answers: list[Any] = []

        async def ask() -> None:
            answers.append(await conn.prompt(session_id=sid, prompt=[acp.text_block("fail-on-cancel")]))

        tg.start_soon(ask)
        with anyio.fail_after(60):
            await rec.wait_for(lambda u: isinstance(u, AgentMessageChunk))
        await conn.cancel(session_id=sid)
    (answer,) = answers
    assert answer.stop_reason == "cancelled"
    assert answer.field_meta["turnpool"]["outcome"] == "failed"


async def test_plain_def_agent_returning_text_replies(tmp_path: Path) -> None:
    """A plain ``def`` agent that returns a string: the string is the reply, then ``end_turn``."""
    async with acp_agent(tmp_path, "examples.acp_agents:sync_reply", *ONE) as (conn, rec, sid, _):
        with anyio.fail_after(60):
            response = await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
    assert response.stop_reason == "end_turn"
    assert rec.text() == "you said: hi"


async def test_agent_output_never_reaches_the_channel(tmp_path: Path) -> None:
    """An agent that prints, writes fd 1, has a child print and reads stdin cannot corrupt or
    steal the stdio channel: its reply arrives intact and it read nothing."""
    async with acp_agent(tmp_path, "examples.acp_agents:noisy", *ONE) as (conn, rec, sid, _):
        with anyio.fail_after(60):
            response = await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
            again = await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
    assert response.stop_reason == "end_turn" and again.stop_reason == "end_turn"
    assert rec.text() == "still clean (read 0 bytes from stdin)" * 2
    log = (tmp_path / "acp-stderr.log").read_text()
    assert "agent print() on stdout" in log and "child says hi on stdout" in log


async def test_stdio_may_be_files_and_dev_null(tmp_path: Path) -> None:
    """ACP-FILES: ``turnpool acp < in.jsonl > out.jsonl`` answers every request of the file into the
    file (asyncio's pipe transports refuse regular files: this was "Pipe transport is for
    pipes/sockets only"), and ``< /dev/null`` exits 0 at once (this was an asyncio traceback)."""
    import json

    frames = [
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}},
        },
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "session/new",
            "params": {"cwd": str(tmp_path), "mcpServers": []},
        },
    ]
    given = tmp_path / "in.jsonl"
    given.write_text("".join(json.dumps(frame) + "\n" for frame in frames))
    command = [str(TURNPOOL), "acp", "--agent", "examples.acp_agents:echo", *ONE]
    with anyio.fail_after(60):
        with given.open("rb") as stdin, (tmp_path / "out.jsonl").open("wb") as stdout:
            answered = await anyio.run_process(command, check=False, stdin=stdin, stdout=stdout, cwd=ROOT)
        idle = await anyio.run_process(command, check=False, stdin=subprocess.DEVNULL, cwd=ROOT)
    replies = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert answered.returncode == 0, answered.stderr.decode()
    assert [reply["id"] for reply in replies] == [0, 1] and all("result" in reply for reply in replies)
    assert replies[1]["result"]["sessionId"]
    assert idle.returncode == 0 and b"Traceback" not in idle.stderr, idle.stderr.decode()
    assert b"Traceback" not in answered.stderr


async def test_command_line_errors_are_clear() -> None:
    """A malformed ``--agent`` exits 2 naming the expected syntax; ``--connect`` on a build
    without ``supervisor.Client`` exits 1 saying what is missing; stdout stays empty."""
    import supervisor

    with anyio.fail_after(60):
        bad = await anyio.run_process(
            [str(TURNPOOL), "acp", "--agent", "no-colon"], check=False, stdin=subprocess.DEVNULL
        )
    assert bad.returncode == 2 and b"package.module:attr" in bad.stderr and bad.stdout == b""
    if hasattr(supervisor, "Client"):
        return
    with anyio.fail_after(60):
        lone = await anyio.run_process(
            [str(TURNPOOL), "acp", "--agent", "examples.acp_agents:echo", "--connect", "ipc:///nonexistent"],
            check=False,
            stdin=subprocess.DEVNULL,
        )
    assert lone.returncode == 1 and b"supervisor.Client" in lone.stderr and lone.stdout == b""


async def test_connect_runs_turns_on_the_daemon(tmp_path: Path) -> None:
    """``--connect E``: prompts run as turns of the serve daemon at E — streamed, cancelled
    (a stubborn one killed by the daemon after the grace given to ``acp``) and served again."""
    rundir = Path(tempfile.mkdtemp(prefix="tp-acp-", dir="/tmp"))  # short: ipc paths are limited
    endpoint = f"ipc://{rundir}/daemon.sock"
    log = open(tmp_path / "daemon-stderr.log", "wb")  # noqa: ASYNC230, SIM115 - the daemon's stderr, closed below
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    daemon = await anyio.open_process(
        [str(TURNPOOL), "serve", "--endpoint", endpoint, "--workers", "1", "--spares", "0"],
        stdout=subprocess.PIPE,
        stderr=log,
        cwd=ROOT,
        env=env,
    )
    try:
        assert daemon.stdout is not None
        with anyio.fail_after(60):
            seen = b""
            async for chunk in daemon.stdout:  # the daemon announces readiness on stdout
                seen += chunk
                if b"ready on" in seen:
                    break
        async with acp_agent(
            tmp_path,
            "tests.agents.acp:by_prompt",
            "--connect",
            endpoint,
            "--grace",
            "0.5",
            "--kill-after",
            "1",
        ) as (conn, rec, sid, _):
            with anyio.fail_after(60):
                hello = await conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])
            async with anyio.create_task_group() as tg:
                answers: list[Any] = []

                async def ask() -> None:
                    answers.append(await conn.prompt(session_id=sid, prompt=[acp.text_block("spin")]))

                tg.start_soon(ask)
                with anyio.fail_after(60):
                    await rec.wait_for(lambda u: isinstance(u, ToolCallStart))
                await conn.cancel(session_id=sid)
            with anyio.fail_after(60):
                again = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
    finally:
        with anyio.CancelScope(shield=True):
            if daemon.returncode is None:
                daemon.send_signal(signal.SIGTERM)
            with anyio.fail_after(60):
                await daemon.wait()
            await daemon.aclose()
            log.close()
            shutil.rmtree(rundir, ignore_errors=True)
    assert daemon.returncode == 0, (tmp_path / "daemon-stderr.log").read_text()
    assert hello.stop_reason == "end_turn" and again.stop_reason == "end_turn"
    (cancelled,) = answers
    assert cancelled.stop_reason == "cancelled"
    assert cancelled.field_meta["turnpool"]["outcome"] == "killed"
    assert again.field_meta["turnpool"]["worker_pid"] != cancelled.field_meta["turnpool"]["worker_pid"]
    assert rec.text().startswith("hello") and rec.text().endswith("again")


class GatedBackend:
    """A ``Supervisor`` whose ``submit`` waits at a gate, as a daemon ``Client``'s round trip
    would: lets a test put a ``session/cancel`` exactly between the prompt and its turn."""

    def __init__(self, sup: Any) -> None:
        self.sup = sup
        self.entered = anyio.Event()
        self.release = anyio.Event()

    async def submit(self, agent: str, input: Any = None, **kwargs: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        return await self.sup.submit(agent, input, **kwargs)


@contextlib.asynccontextmanager
async def in_process(agent: Any) -> AsyncIterator[tuple[Any, Recorder, str]]:
    """An ACP client connected to ``agent`` through an in-process message pipe; yields the
    client connection, its recorder and an open session id."""
    from acp._transport import memory_transport_pair  # in-process pair of ACP message pipes
    from acp.agent.connection import AgentSideConnection
    from acp.client.connection import ClientSideConnection

    agent_end, client_end = memory_transport_pair()
    agent_conn = AgentSideConnection(agent, agent_end)
    rec = Recorder()
    client = ClientSideConnection(rec, client_end)
    try:
        with anyio.fail_after(60):
            await client.initialize(protocol_version=acp.PROTOCOL_VERSION)
            sid = (await client.new_session(cwd="/", mcp_servers=[])).session_id
        yield client, rec, sid
    finally:
        await client.close()
        await agent_conn.close()


async def test_cancel_while_the_turn_is_being_submitted_is_not_lost() -> None:
    """A ``session/cancel`` handled while the prompt's turn is still being submitted cancels
    that turn as soon as it exists: the prompt answers ``cancelled``, never ``end_turn``."""
    from supervisor import Supervisor
    from supervisor.acp.agent import TurnpoolAgent

    cancel_handled = anyio.Event()

    class Agent(TurnpoolAgent):
        async def cancel(self, session_id: str, **kwargs: Any) -> None:
            await super().cancel(session_id, **kwargs)
            cancel_handled.set()

    async with Supervisor(workers=1, spares=0, grace=20) as sup:
        backend = GatedBackend(sup)
        async with in_process(Agent(backend, "examples.acp_agents:slow")) as (client, _rec, sid):
            answers: list[Any] = []
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:

                    async def ask() -> None:
                        answers.append(await client.prompt(session_id=sid, prompt=[acp.text_block("60")]))

                    tg.start_soon(ask)
                    await backend.entered.wait()
                    await client.cancel(session_id=sid)
                    await cancel_handled.wait()
                    backend.release.set()
    (answer,) = answers
    assert answer.stop_reason == "cancelled"
    assert answer.field_meta["turnpool"]["outcome"] == "aborted"
    assert answer.field_meta["turnpool"]["cause"] == "user"


async def test_turn_stopped_by_its_deadline_answers_an_error() -> None:
    """A turn turnpool stopped on its own account (its deadline) was not cancelled by the editor:
    the prompt answers an error naming the cause, not ``cancelled``."""
    from supervisor import Supervisor
    from supervisor.acp.agent import TurnpoolAgent

    async with (
        Supervisor(workers=1, spares=0, grace=20, timeout=0.2) as sup,
        in_process(TurnpoolAgent(sup, "examples.acp_agents:slow")) as (client, rec, sid),
    ):
        with anyio.fail_after(60), pytest.raises(acp.RequestError) as stopped:
            await client.prompt(session_id=sid, prompt=[acp.text_block("60")])
    assert "cause deadline" in str(stopped.value) and "aborted" in str(stopped.value)
    assert [(u.tool_call_id, u.status) for u in rec.updates if isinstance(u, ToolCallProgress)] == [
        ("sleep-1", "failed")
    ]


# ---- ACP-SCREEN: whatever the editor sends ---------------------------------------------------------


class _Lines:
    """The agent's stdout as lines, read with a bound (a hang fails the test)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.buffer = b""

    def until(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 60.0) -> list[dict[str, Any]]:
        import json
        import select

        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.buffer:
                line, _, self.buffer = self.buffer.partition(b"\n")
                message = json.loads(line)
                seen.append(message)
                if pred(message):
                    return seen
            left = deadline - time.monotonic()
            assert left > 0, f"no answer within {timeout} s; got {seen}"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                assert chunk, f"the acp agent closed its stdout (exit {self.proc.poll()}); got {seen}"
                self.buffer += chunk


def test_fuzzed_frames_are_answered_and_the_agent_stays_up(tmp_path: Path) -> None:
    """ACP-SCREEN: random bytes, JSON that is not an object (``[1, 2]``, which ended the agent), a line
    nested 100,000 deep and hypothesis-made JSON-RPC messages: a line that is not a JSON object
    gets a ``-32700``/``-32600`` error with ``id`` null, a request gets its answer, and after
    each line the agent still answers ``initialize``; it exits 0 at EOF."""
    import json

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    proc = subprocess.Popen(
        [str(TURNPOOL), "acp", "--agent", "examples.agents:echo", *ONE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    lines = _Lines(proc)
    assert proc.stdin is not None
    probes = iter(range(1, 1_000_000))

    def send(line: bytes) -> list[dict[str, Any]]:
        """Send ``line`` then a probe; every message until the probe's answer."""
        probe = f"probe-{next(probes)}"
        init = {"jsonrpc": "2.0", "id": probe, "method": "initialize", "params": {"protocolVersion": 1}}
        assert proc.stdin is not None
        proc.stdin.write(line.replace(b"\n", b" ") + b"\n" + json.dumps(init).encode() + b"\n")
        proc.stdin.flush()
        seen = lines.until(lambda m: m.get("id") == probe)
        assert "result" in seen[-1], seen
        return seen[:-1]

    def refused(seen: list[dict[str, Any]], code: int) -> None:
        assert [(m["id"], m["error"]["code"]) for m in seen] == [(None, code)], seen

    json_value = st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)  # (infinity is not JSON: a parse error, rightly)
        | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=10,
    )
    methods = st.sampled_from(
        ["initialize", "session/new", "session/prompt", "session/cancel", "session/load", "nope", ""]
    )
    request = st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "method": methods | json_value},
        optional={"id": st.integers(0, 10**6) | st.text(max_size=8) | json_value, "params": json_value},
    )

    try:
        refused(send(b"[1, 2]"), -32600)
        refused(send(b"3"), -32600)
        refused(send(b"[" * 100_000 + b"]" * 100_000), -32600)
        refused(send(b"garbage"), -32700)
        refused(send(b"\xff\xfe{"), -32700)

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(message=request)
        def requests(message: dict[str, Any]) -> None:
            seen = send(json.dumps(message).encode())
            assert all(m.get("id") is not None or "error" in m for m in seen), seen

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(value=json_value | st.binary(max_size=30))
        def anything(value: Any) -> None:
            line = value if isinstance(value, bytes) else json.dumps(value).encode()
            seen = send(line)
            if not isinstance(value, (bytes, dict)):
                refused(seen, -32600)

        requests()
        anything()
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
