"""worker.agent: the agent loop's detection points, hooks, pause/resume and cancel channel.

In-process: ``ScriptedModel`` and fake tools. Waits are on events (``model.reached``, tool
``started`` events), each bounded by ``anyio.fail_after``; the only delays are the scripted
model's own (how long it takes to open or to send the next event).
"""

from __future__ import annotations

import gc
from typing import Any

import anyio
import hypothesis
import pytest
from hypothesis import given
from hypothesis import strategies as st

import wire
import worker
import worker.agent as agent
from worker.agent import (
    Abort,
    Aborted,
    AgentLoop,
    AssistantMessage,
    Cancelled,
    ClientError,
    ConfigWarnings,
    Delayed,
    Finish,
    Finished,
    FunctionCall,
    FunctionCallOutput,
    HookError,
    Pause,
    Paused,
    Response,
    ScriptedModel,
    TextDelta,
    ToolCall,
    ToolError,
    UserMessage,
    cancel_channel,
    hook,
    tool,
)

pytestmark = pytest.mark.anyio

FOREVER = 3600.0  # a scripted delay no test waits out


def reply(*texts: str, **kw: Any) -> Response:
    return Response([*(TextDelta(t) for t in texts), Finish("stop")], **kw)


def calls(*pairs: tuple[str, str, dict[str, Any]], **kw: Any) -> Response:
    return Response([*(ToolCall(cid, name, args) for cid, name, args in pairs), Finish("tool_calls")], **kw)


class Recorder:
    """on_abort hook that records every reason it hears."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def on_abort(self, reason: str) -> None:
        self.reasons.append(reason)


class SlowTools:
    """Tools for the cancellation tests: ``slow`` waits (cancellably) for ever; ``stubborn``
    shields itself and finishes only when ``release`` is set; both count runs and record
    whether a cancellation reached them."""

    def __init__(self) -> None:
        self.started: dict[str, anyio.Event] = {}
        self.runs: dict[str, int] = {}
        self.cancelled: set[str] = set()
        self.cancelled_events: dict[str, anyio.Event] = {}
        self.release = anyio.Event()

    def _start(self, key: str) -> None:
        self.runs[key] = self.runs.get(key, 0) + 1
        self.started.setdefault(key, anyio.Event()).set()

    async def wait_cancelled(self, key: str) -> None:
        await self.cancelled_events.setdefault(key, anyio.Event()).wait()

    async def wait_started(self, *keys: str) -> None:
        for key in keys:
            await self.started.setdefault(key, anyio.Event()).wait()

    def tools(self) -> list[agent.Tool]:
        @tool
        async def slow(key: str) -> str:
            """Waits for ever, cancellably."""
            self._start(key)
            try:
                await anyio.sleep(FOREVER)  # allowed: the tool under test blocks until cancelled
            except anyio.get_cancelled_exc_class():
                self.cancelled.add(key)
                self.cancelled_events.setdefault(key, anyio.Event()).set()
                raise
            return "unreachable"

        @tool
        async def stubborn(key: str) -> str:
            """Ignores cancellation until ``release`` is set."""
            self._start(key)
            with anyio.CancelScope(shield=True):
                await self.release.wait()
            return f"{key} done"

        @tool
        async def quick(key: str) -> str:
            self._start(key)
            return f"{key} ok"

        return [slow, stubborn, quick]


# ---- plain runs -----------------------------------------------------------------------------


async def test_run_finishes_with_text_history_and_timeline() -> None:
    """A model that answers text only: ``Finished`` with the text; history and timeline recorded."""
    model = ScriptedModel([reply("Hello, ", "world")])
    loop = AgentLoop(model)
    with anyio.fail_after(10):
        result = await loop.run("hi")
    assert result == Finished("Hello, world", 1, "stop")
    assert loop.history == [UserMessage("hi"), AssistantMessage("Hello, world")]
    assert [(b.kind, b.state, b.text) for b in loop.timeline] == [("text", "done", "Hello, world")]
    assert loop.last_run_interrupted is False
    assert model.counts.opened == 1 and model.counts.closed == 1


async def test_tools_run_in_parallel_and_results_go_back_to_the_model() -> None:
    """Two tool calls run at the same time (each waits for the other to start: run one after
    the other they would deadlock) and their outputs are in the next model request."""
    a_started, b_started = anyio.Event(), anyio.Event()

    @tool
    async def ping(me: str) -> str:
        mine, other = (a_started, b_started) if me == "a" else (b_started, a_started)
        mine.set()
        await other.wait()
        return f"pong {me}"

    model = ScriptedModel(
        [calls(("c1", "ping", {"me": "a"}), ("c2", "ping", {"me": "b"})), reply("both done")]
    )
    loop = AgentLoop(model, tools=[ping])
    with anyio.fail_after(10):
        result = await loop.run("go")
    assert isinstance(result, Finished) and result.text == "both done" and result.steps == 3
    second = model.requests[1].messages
    assert FunctionCallOutput("c1", "ping", "pong a") in second
    assert FunctionCallOutput("c2", "ping", "pong b") in second
    assert loop.pending_tool_calls() == ()
    assert [b.kind for b in loop.timeline] == ["tool_call", "tool_call", "tool_run", "text"]


async def test_sync_tool_runs_in_a_thread() -> None:
    """A plain ``def`` tool runs (in a worker thread) and its output is recorded."""

    @tool
    def add(a: int, b: int) -> int:
        return a + b

    model = ScriptedModel([calls(("c1", "add", {"a": 2, "b": 3})), reply("5")])
    loop = AgentLoop(model, tools=[add])
    with anyio.fail_after(10):
        await loop.run("add")
    assert FunctionCallOutput("c1", "add", 5) in loop.history


# ---- detection points ----------------------------------------------------------------------------


async def test_detection_point_1_head_of_step() -> None:
    """A cancel made between steps (here by an after_tool_results hook, not a detection point)
    is seen at the head of the next step: the model is never asked again."""
    tools = SlowTools()
    rec = Recorder()
    model = ScriptedModel([calls(("c1", "quick", {"key": "q"})), reply("never")])
    loop: AgentLoop

    def cancel_after_tools(outputs: Any) -> None:
        loop.cancel()

    loop = AgentLoop(model, tools=tools.tools(), hooks=[hook(after_tool_results=cancel_after_tools), rec])
    with anyio.fail_after(10), pytest.raises(Cancelled) as info:
        await loop.run("go")
    assert info.value.cause is None and str(info.value) == "Cancelled"
    assert model.counts.opened == 1
    assert rec.reasons == ["Cancelled"]
    assert loop.last_run_interrupted is True
    assert loop.is_cancelled() is False  # the token was consumed by the check


async def test_detection_point_2_while_opening_the_stream() -> None:
    """A model that takes for ever to open its stream is interrupted by ``cancel()``."""
    model = ScriptedModel([reply("never", open_delay=FOREVER)])
    rec = Recorder()
    loop = AgentLoop(model, hooks=[rec])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def cancel_when_opening() -> None:
                await model.reached("open")
                loop.cancel()

            tg.start_soon(cancel_when_opening)
            with pytest.raises(Cancelled):
                await loop.run("hi")
    assert model.counts.events == 0
    assert rec.reasons == ["Cancelled"]
    assert loop.history == [UserMessage("hi")]


async def test_detection_point_3_between_streamed_events() -> None:
    """Cancelled while waiting for the next event: the half-streamed text block is closed as
    aborted, the stream is closed, and no partial assistant message enters the history."""
    model = ScriptedModel([Response([TextDelta("par"), Delayed(TextDelta("tial"), FOREVER), Finish()])])
    rec = Recorder()
    loop = AgentLoop(model, hooks=[rec])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def cancel_mid_stream() -> None:
                await model.reached("event", 1)
                loop.cancel()

            tg.start_soon(cancel_mid_stream)
            with pytest.raises(Cancelled):
                await loop.run("hi")
    last = loop.timeline.blocks[-1]
    assert (last.kind, last.state, last.text) == ("text", "aborted", "par")
    assert loop.timeline.current is None
    assert model.counts.closed == 1
    assert loop.history == [UserMessage("hi")]
    assert rec.reasons == ["Cancelled"]


async def test_detection_point_4_parallel_tools_all_stopped() -> None:
    """Cancelled while tools run in parallel: every tool of the batch is cancelled, none has an
    output, all stay pending; the tool_run block is aborted."""
    tools = SlowTools()
    model = ScriptedModel([calls(("c1", "slow", {"key": "a"}), ("c2", "slow", {"key": "b"}))])
    rec = Recorder()
    loop = AgentLoop(model, tools=tools.tools(), hooks=[rec])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def cancel_when_both_run() -> None:
                await tools.wait_started("a", "b")
                loop.cancel()

            tg.start_soon(cancel_when_both_run)
            with pytest.raises(Cancelled):
                await loop.run("go")
    assert tools.cancelled == {"a", "b"}
    assert [c.call_id for c in loop.pending_tool_calls()] == ["c1", "c2"]
    assert not any(isinstance(i, FunctionCallOutput) for i in loop.history)
    assert (loop.timeline.blocks[-1].kind, loop.timeline.blocks[-1].state) == ("tool_run", "aborted")
    assert rec.reasons == ["Cancelled"]


async def test_tool_ignoring_cancellation_is_awaited_then_resume_runs_only_the_rest() -> None:
    """A tool that ignores cancellation keeps the batch until it finishes; the run then ends
    ``Cancelled``, the finished tool's output is kept, and ``resume()`` runs only the other call, once."""
    tools = SlowTools()
    model = ScriptedModel(
        [calls(("c1", "stubborn", {"key": "s"}), ("c2", "slow", {"key": "x"})), reply("after resume")]
    )
    loop = AgentLoop(model, tools=tools.tools())
    outcome: list[BaseException] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def runner() -> None:
                try:
                    await loop.run("go")
                except Cancelled as exc:
                    outcome.append(exc)

            tg.start_soon(runner)
            await tools.wait_started("s", "x")
            loop.cancel()
            await tools.wait_cancelled("x")  # the cancellable tool saw it ...
            assert loop.running and not outcome  # ... but the stubborn one still holds the run
            tools.release.set()
    assert len(outcome) == 1
    assert FunctionCallOutput("c1", "stubborn", "s done") in loop.history
    assert [c.call_id for c in loop.pending_tool_calls()] == ["c2"]

    # resume: the slow tool is replaced by one that returns, to let the run finish.
    @tool
    async def slow(key: str) -> str:
        tools.runs[key] = tools.runs.get(key, 0) + 1
        return f"{key} resumed"

    loop.tools["slow"] = slow
    with anyio.fail_after(10):
        result = await loop.resume()
    assert isinstance(result, Finished) and result.text == "after resume"
    assert tools.runs == {"s": 1, "x": 2}  # x: once cut, once on resume; s never again
    assert FunctionCallOutput("c2", "slow", "x resumed") in model.requests[1].messages


# ---- the cancel channel --------------------------------------------------------------------------


async def test_stale_cancel_is_drained_when_a_run_starts() -> None:
    """A cancel made while no run is active does not reach the next run."""
    model = ScriptedModel([reply("fine")])
    loop = AgentLoop(model)
    loop.cancel()
    loop.cancel()  # capacity 1: the second one is dropped
    assert loop.is_cancelled() is True
    with anyio.fail_after(10):
        result = await loop.run("hi")
    assert isinstance(result, Finished)
    assert loop.is_cancelled() is False and loop.last_run_interrupted is False


async def test_channel_with_every_sender_gone_counts_as_cancelled() -> None:
    """With ``cancel_channel()`` the loop holds no sender: once every sender is closed the run
    is cancelled at its first step, before the model is asked; a drained run cannot undo it."""
    tx, rx = cancel_channel()
    model = ScriptedModel([reply("never")])
    rec = Recorder()
    loop = AgentLoop(model, hooks=[rec], cancel_rx=rx)
    extra = loop.cancel_sender()
    tx.close()
    assert loop.is_cancelled() is False  # one sender is left
    extra.close()
    assert loop.is_cancelled() is True
    with anyio.fail_after(10), pytest.raises(Cancelled):
        await loop.run("hi")
    assert model.counts.opened == 0 and rec.reasons == ["Cancelled"]
    with pytest.raises(anyio.ClosedResourceError):
        extra.try_send()


async def test_last_sender_going_away_mid_stream_cancels() -> None:
    """Closing the last sender while the loop waits for an event wakes it (no polling); a sender
    that is garbage collected counts as gone too."""
    tx, rx = cancel_channel()
    model = ScriptedModel([Response([TextDelta("a"), Delayed(TextDelta("b"), FOREVER)])])
    loop = AgentLoop(model, cancel_rx=rx)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def drop_sender() -> None:
                nonlocal tx
                await model.reached("event", 1)
                del tx  # dropped, not closed
                gc.collect()

            tg.start_soon(drop_sender)
            with pytest.raises(Cancelled):
                await loop.run("hi")


async def test_closing_handed_out_senders_of_a_default_loop_is_harmless() -> None:
    """The default loop keeps its own sender (as the Rust worker does): closing every sender it
    handed out does not cancel it."""
    model = ScriptedModel([reply("ok")])
    loop = AgentLoop(model)
    with loop.cancel_sender() as s, s.clone():
        pass
    assert loop.is_cancelled() is False
    with anyio.fail_after(10):
        assert isinstance(await loop.run("hi"), Finished)


async def test_cancel_sender_from_another_task() -> None:
    """A task that holds only a ``CancelSender`` (never the loop) cancels a run mid-stream."""
    model = ScriptedModel([Response([TextDelta("a"), Delayed(TextDelta("b"), FOREVER)])])
    loop = AgentLoop(model)
    sender = loop.cancel_sender()

    async def canceller(sender: agent.CancelSender) -> None:
        await model.reached("event", 1)
        await sender.send()
        sender.close()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(canceller, sender)
            with pytest.raises(Cancelled):
                await loop.run("hi")
    assert sender.closed


# ---- on_abort and last_run_interrupted -------------------------------------------------------------


def _interrupting_setups() -> list[Any]:
    boom = RuntimeError("boom")

    @tool
    async def bad() -> None:
        raise boom

    def raising(step: Any) -> None:
        if step.index == 0:
            raise ValueError("hook broke")

    return [
        pytest.param(
            ScriptedModel([reply("x", open_error=ConnectionError("refused"))]),
            [],
            [],
            {},
            ClientError,
            "ClientError",
            id="client-open",
        ),
        pytest.param(
            ScriptedModel([Response([TextDelta("x"), OSError("reset")])]),
            [],
            [],
            {},
            ClientError,
            "ClientError",
            id="client-stream",
        ),
        pytest.param(
            ScriptedModel([calls(("c1", "bad", {}))]), [bad], [], {}, ToolError, "ToolError", id="tool"
        ),
        pytest.param(
            # An unknown tool is answered to the model (A-TOOLERR) up to max_tool_errors (3) times.
            ScriptedModel([calls((f"c{i}", "nope", {})) for i in range(4)]),
            [],
            [],
            {},
            ToolError,
            "ToolError",
            id="unknown-tool",
        ),
        pytest.param(
            ScriptedModel([reply("x")]),
            [],
            [hook(before_step=raising)],
            {},
            HookError,
            "HookError",
            id="hook",
        ),
        pytest.param(
            ScriptedModel([reply("x")]),
            [],
            [hook(on_event=lambda e: Abort("policy says no"))],
            {},
            Aborted,
            "Aborted",
            id="hook-abort",
        ),
        pytest.param(
            ScriptedModel([reply("x")], supported_settings=frozenset({"temperature"})),
            [],
            [],
            {"temperature": 0, "top_k": 3},
            ConfigWarnings,
            "ConfigWarnings",
            id="config",
        ),
    ]


@pytest.mark.parametrize(("model", "tools", "hooks", "settings", "error", "kind"), _interrupting_setups())
async def test_on_abort_runs_once_with_the_reason(
    model: ScriptedModel, tools: list[Any], hooks: list[Any], settings: dict[str, Any], error: type, kind: str
) -> None:
    """Every kind of interruption raises its error, runs every on_abort hook exactly once with
    the error's reason, and sets ``last_run_interrupted``."""
    first, second = Recorder(), Recorder()
    loop = AgentLoop(model, tools=tools, hooks=[*hooks, first, second], settings=settings)
    with anyio.fail_after(10), pytest.raises(error) as info:
        await loop.run("go")
    assert type(info.value).__name__ == kind
    assert first.reasons == second.reasons == [info.value.reason]
    if kind == "Aborted":
        assert info.value.reason == "policy say no".replace("say", "says")
    if kind == "ConfigWarnings":
        assert info.value.warnings == ("ScriptedModel does not support setting 'top_k'",)
    assert loop.last_run_interrupted is True and not loop.running


async def test_on_abort_reason_can_be_rewritten_and_a_failing_hook_is_a_hook_error() -> None:
    """An on_abort hook may return a new reason for the hooks after it; one that raises makes
    the run end in ``HookError`` after every hook has heard the reason once."""
    later = Recorder()

    def failing(reason: str) -> None:
        raise RuntimeError("cleanup failed")

    model = ScriptedModel([reply("x", open_delay=FOREVER)])
    loop = AgentLoop(model, hooks=[hook(on_abort=lambda r: f"{r} (by user)"), hook(on_abort=failing), later])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def cancel() -> None:
                await model.reached("open")
                loop.cancel()

            tg.start_soon(cancel)
            with pytest.raises(HookError) as info:
                await loop.run("hi")
    assert later.reasons == ["Cancelled (by user)"]
    assert info.value.phase == "on_abort" and isinstance(info.value.__context__, Cancelled)


async def test_last_run_interrupted_rules() -> None:
    """Reset when a run starts, set on a pause and on an error, cleared when a run finishes."""
    seen: list[bool] = []
    loop: AgentLoop

    def before(step: Any) -> Any:
        seen.append(loop.last_run_interrupted)
        return Pause("wait") if step.index == 0 and len(seen) == 1 else None

    model = ScriptedModel([reply("a"), reply("b", open_error=OSError("down")), reply("c")])
    loop = AgentLoop(model, hooks=[hook(before_step=before)])
    with anyio.fail_after(10):
        assert isinstance(await loop.run("1"), Paused)
        assert loop.last_run_interrupted is True
        assert isinstance(await loop.resume(), Finished)
        assert loop.last_run_interrupted is False
        with pytest.raises(ClientError):
            await loop.run("2")
        assert loop.last_run_interrupted is True
        assert isinstance(await loop.run("3"), Finished)
    assert loop.last_run_interrupted is False
    assert seen == [False, False, False]  # each run began with the flag reset


# ---- hooks: pause, abort, resume -------------------------------------------------------------------


async def test_pause_before_tools_then_resume_runs_pending_calls_exactly_once() -> None:
    """A before_step hook pauses a step that would run tools (an approval point). ``Paused``
    lists them; nothing ran. ``resume()`` runs exactly those calls, once, without asking the
    hook again for that step, then continues to the model's final answer."""
    runs: list[str] = []

    @tool
    async def act(what: str) -> str:
        runs.append(what)
        return f"did {what}"

    asked: list[int] = []

    def approve(step: Any) -> Any:
        asked.append(step.index)
        return Pause("needs approval") if step.pending else None

    model = ScriptedModel(
        [calls(("c1", "act", {"what": "x"}), ("c2", "act", {"what": "y"})), reply("all done")]
    )
    loop = AgentLoop(model, tools=[act], hooks=[hook(before_step=approve)])
    with anyio.fail_after(10):
        paused = await loop.run("go")
    assert isinstance(paused, Paused) and paused.reason == "needs approval"
    assert [c.call_id for c in paused.pending] == ["c1", "c2"] and runs == []
    with anyio.fail_after(10):
        result = await loop.resume()
    assert isinstance(result, Finished) and result.text == "all done"
    assert sorted(runs) == ["x", "y"]
    assert loop.pending_tool_calls() == ()
    outputs = [i for i in loop.history if isinstance(i, FunctionCallOutput)]
    assert [o.call_id for o in outputs] == ["c1", "c2"]
    assert asked == [0, 1, 1]  # run: model step, tool step (paused); resume: its model step only


async def test_stream_hook_pause_keeps_what_arrived_and_resume_runs_it() -> None:
    """An on_event hook answering ``Pause`` on a tool call stops reading the stream there: the
    call is committed as pending, the rest of the stream is never read, the stream is closed."""
    runs: list[str] = []

    @tool
    async def act(what: str) -> str:
        runs.append(what)
        return "ok"

    def gate(event: Any) -> Any:
        return Pause("review tool call") if isinstance(event, ToolCall) else None

    model = ScriptedModel(
        [
            Response(
                [
                    TextDelta("Let me act."),
                    ToolCall("c1", "act", {"what": "x"}),
                    TextDelta("unread"),
                    Finish(),
                ]
            ),
            reply("done"),
        ]
    )
    loop = AgentLoop(model, tools=[act], hooks=[hook(on_event=gate)])
    with anyio.fail_after(10):
        paused = await loop.run("go")
    assert isinstance(paused, Paused) and [c.call_id for c in paused.pending] == ["c1"]
    assert loop.history[1:] == [AssistantMessage("Let me act."), FunctionCall("c1", "act", {"what": "x"})]
    assert model.counts.events == 2 and model.counts.closed == 1
    loop.hooks.clear()
    with anyio.fail_after(10):
        assert isinstance(await loop.resume(), Finished)
    assert runs == ["x"]


async def test_after_tool_results_hook_pauses_and_aborts() -> None:
    """after_tool_results sees the outputs; ``Pause`` returns with nothing pending (resume asks
    the model next), ``Abort`` ends the run ``Aborted`` with its reason."""
    tools = SlowTools()
    seen: list[Any] = []

    def after(outputs: Any) -> Any:
        seen.append(outputs)
        return Pause("look at results") if len(seen) == 1 else Abort("enough")

    model = ScriptedModel([calls(("c1", "quick", {"key": "a"})), calls(("c2", "quick", {"key": "b"}))])
    rec = Recorder()
    loop = AgentLoop(model, tools=tools.tools(), hooks=[hook(after_tool_results=after), rec])
    with anyio.fail_after(10):
        paused = await loop.run("go")
        assert isinstance(paused, Paused) and paused.pending == ()
        assert seen[0] == (FunctionCallOutput("c1", "quick", "a ok"),)
        with pytest.raises(Aborted) as info:
            await loop.resume()
    assert info.value.reason == "enough" and rec.reasons == ["enough"]
    assert model.counts.opened == 2


# ---- outer cancellation and turns ---------------------------------------------------------------


async def test_outer_cancel_scope_passes_through_untouched() -> None:
    """A cancel scope of the caller (not the loop's cancel) interrupts the run: on_abort hears
    "Cancelled", but the cancellation itself goes on unwrapped and the caller's scope catches it."""
    model = ScriptedModel([reply("x", open_delay=FOREVER)])
    rec = Recorder()
    loop = AgentLoop(model, hooks=[rec])
    with anyio.fail_after(10):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cut() -> None:
                    await model.reached("open")
                    scope.cancel()

                tg.start_soon(cut)
                await loop.run("hi")
    assert scope.cancelled_caught
    assert rec.reasons == ["Cancelled"] and loop.last_run_interrupted


class FakeConn:
    """Stands in for the worker's connection: records emitted events."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, turn_id: str, event: Any) -> None:
        self.events.append(event)


async def test_bound_turn_abort_like_the_worker_does_it() -> None:
    """Bound to a turn, the loop streams events to it; an Abort delivered the way the worker
    delivers it (signal set, then the agent's cancel scope cancelled) ends the run with
    ``Cancelled`` — a ``worker.TurnCancelled`` carrying the turn's cause."""
    conn = FakeConn()
    turn = worker.Turn("t1", None, None, None, conn)  # type: ignore[arg-type]
    model = ScriptedModel([Response([TextDelta("a"), Delayed(TextDelta("b"), FOREVER)])])
    rec = Recorder()
    loop = AgentLoop(model, hooks=[rec], turn=turn)
    worker_scope = anyio.CancelScope()  # the scope the worker puts around an async agent

    async def abort() -> None:
        await model.reached("event", 1)
        turn.signal._set(wire.Cause("user"))
        worker_scope.cancel()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(abort)
            with pytest.raises(worker.TurnCancelled) as info, worker_scope:
                await loop.run("hi")
    assert isinstance(info.value, Cancelled) and info.value.cause == {"kind": "user"}
    assert not worker_scope.cancelled_caught
    assert conn.events == [{"type": "delta", "text": "a"}]
    assert rec.reasons == ["Cancelled"]


async def test_bound_turn_already_cancelled_stops_at_the_first_step() -> None:
    """The turn's signal is a level, not a token: a loop bound to a cancelled turn stops at the
    head of its first step even though the run start drained the channel."""
    turn = worker.Turn("t1", None, None, None, FakeConn())  # type: ignore[arg-type]
    turn.signal._set(wire.Cause("deadline"))
    model = ScriptedModel([reply("never")])
    loop = AgentLoop(model).bind(turn)
    with anyio.fail_after(10), pytest.raises(Cancelled) as info:
        await loop.run("hi")
    assert info.value.cause == {"kind": "deadline"} and model.counts.opened == 0


# ---- small rules -----------------------------------------------------------------------------------


async def test_a_loop_runs_one_run_at_a_time() -> None:
    """A second ``run()`` while one is active raises at once; ``resume()`` before any run raises."""
    model = ScriptedModel([reply("x", open_delay=FOREVER)])
    loop = AgentLoop(model)
    with pytest.raises(RuntimeError, match="nothing to resume"):
        await loop.resume()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop.run, "a")
            await model.reached("open")
            with pytest.raises(RuntimeError, match="already running"):
                await loop.run("b")
            tg.cancel_scope.cancel()


def test_timeline_abort_current_block() -> None:
    """``abort_current_block`` closes the open block as aborted and is harmless with none open."""
    tl = agent.Timeline()
    assert tl.abort_current_block() is None
    tl.text_delta("a")
    tl.text_delta("b")
    block = tl.abort_current_block()
    assert block is not None and (block.text, block.state) == ("ab", "aborted") and tl.current is None
    tl.open("tool_run")
    tl.close_current()
    assert [b.state for b in tl] == ["aborted", "done"]


def test_public_names_are_pinned() -> None:
    """``worker.agent`` re-exports exactly its public API; the loop's cancellation is a TurnCancelled."""
    assert set(agent.__all__) == {
        "CONTINUE",
        "Abort",
        "Aborted",
        "AgentLoop",
        "AgentLoopError",
        "AssistantMessage",
        "Block",
        "CallInfo",
        "CancelReceiver",
        "CancelSender",
        "Cancelled",
        "ClientError",
        "ConfigWarnings",
        "Continue",
        "Delayed",
        "Finish",
        "Finished",
        "FunctionCall",
        "FunctionCallOutput",
        "Hook",
        "HookError",
        "MaxStepsExceeded",
        "ModelClient",
        "ModelRequest",
        "ModelStream",
        "OpenAIModel",
        "Pause",
        "Paused",
        "Response",
        "ScriptedModel",
        "Step",
        "StepRecordError",
        "TextDelta",
        "Timeline",
        "Tool",
        "ToolCall",
        "ToolError",
        "ToolSpec",
        "UnknownToolOutcome",
        "UserMessage",
        "cancel_channel",
        "current_call",
        "hook",
        "tool",
    }
    for name in agent.__all__:
        assert getattr(agent, name) is not None
    assert issubclass(agent.Cancelled, worker.TurnCancelled)
    for cls in (
        agent.Cancelled,
        agent.Aborted,
        agent.ClientError,
        agent.ToolError,
        agent.HookError,
        agent.ConfigWarnings,
    ):
        assert issubclass(cls, agent.AgentLoopError) and issubclass(cls, worker.WorkerError)
    assert isinstance(ScriptedModel([]), agent.ModelClient)


async def test_tool_raising_turn_cancelled_is_a_cancel_not_a_tool_error() -> None:
    """A tool that bails out with ``worker.TurnCancelled`` (say it awaited ``turn.checkpoint()``)
    ends the run ``Cancelled`` with that cause, and stops the rest of the batch."""
    tools = SlowTools()

    @tool
    async def checkpointing() -> None:
        await tools.wait_started("other")
        raise worker.TurnCancelled(wire.Cause("parent"))

    model = ScriptedModel([calls(("c1", "checkpointing", {}), ("c2", "slow", {"key": "other"}))])
    rec = Recorder()
    loop = AgentLoop(model, tools=[checkpointing, *tools.tools()], hooks=[rec])
    with anyio.fail_after(10), pytest.raises(Cancelled) as info:
        await loop.run("go")
    assert info.value.cause == {"kind": "parent"} and rec.reasons == ["Cancelled"]
    assert tools.cancelled == {"other"}


# ---- property: any interruption point leaves a consistent loop ----------------------------------


_event = st.one_of(
    st.builds(TextDelta, st.sampled_from(["a", "bc", " "])),
    st.just(ToolCall("placeholder", "quick", {})),
)


@hypothesis.settings(max_examples=100, deadline=None)
@given(
    scripts=st.lists(st.lists(_event, max_size=5), min_size=1, max_size=4),
    stop_at=st.integers(0, 30),
    how=st.sampled_from(["cancel", "abort", "pause", "none"]),
)
def test_any_interruption_point_leaves_a_consistent_loop(
    scripts: list[list[Any]], stop_at: int, how: str
) -> None:
    """Whatever the script and wherever a cancel / hook abort / pause lands (counted in stream
    events), the run ends once: ``on_abort`` heard exactly one reason for an error and none
    otherwise (a pause is resumed to the end), ``last_run_interrupted`` matches, no timeline
    block is left open, every output answers a call made before it, and no tool ran twice."""
    responses = []
    for i, events in enumerate(scripts):
        # unique call ids across the whole script
        evs = [
            ToolCall(f"r{i}-{j}", e.name, {"key": f"r{i}-{j}"}) if isinstance(e, ToolCall) else e
            for j, e in enumerate(events)
        ]
        responses.append(Response([*evs, Finish()]))
    # A pause mid-stream is resumed by asking the model again: give it answers to give.
    responses += [reply("end"), reply("again"), reply("and again")]
    tools = SlowTools()
    rec = Recorder()
    seen = 0
    loop: AgentLoop

    def on_event(event: Any) -> Any:
        nonlocal seen
        seen += 1
        if seen == stop_at and how == "cancel":
            loop.cancel()
        if seen == stop_at and how == "abort":
            return Abort("stop here")
        if seen == stop_at and how == "pause":
            return Pause("hold")
        return None

    async def main() -> Any:
        nonlocal loop
        loop = AgentLoop(ScriptedModel(responses), tools=tools.tools(), hooks=[hook(on_event=on_event), rec])
        with anyio.fail_after(10):
            try:
                result = await loop.run("go")
            except (Cancelled, Aborted) as exc:
                return exc
            if isinstance(result, Paused):
                assert loop.last_run_interrupted
                result = await loop.resume()  # runs what was pending, once, and goes on
                assert isinstance(result, Finished) and loop.pending_tool_calls() == ()
            return result

    outcome = anyio.run(main)
    if isinstance(outcome, Cancelled | Aborted):
        assert rec.reasons == [outcome.reason] and loop.last_run_interrupted
    else:
        assert rec.reasons == [] and isinstance(outcome, Finished)
        assert loop.last_run_interrupted is False
    assert loop.timeline.current is None
    assert all(b.state != "open" for b in loop.timeline)
    called: set[str] = set()
    for item in loop.history:
        if isinstance(item, FunctionCall):
            called.add(item.call_id)
        elif isinstance(item, FunctionCallOutput):
            assert item.call_id in called
    assert all(n == 1 for n in tools.runs.values())  # no tool ran twice


async def test_cancel_sender_from_another_thread() -> None:
    """A plain thread (not an anyio worker thread) holding a sender cancels a run mid-stream:
    the token is handed to the loop's event loop, which wakes the waiting detection point."""
    import threading

    model = ScriptedModel([Response([TextDelta("a"), Delayed(TextDelta("b"), FOREVER)])])
    loop = AgentLoop(model)
    sender = loop.cancel_sender()
    sent: list[bool] = []
    thread = threading.Thread(target=lambda: sent.append(sender.try_send()))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def start_thread() -> None:
                await model.reached("event", 1)
                thread.start()

            tg.start_soon(start_thread)
            with pytest.raises(Cancelled):
                await loop.run("hi")
    thread.join(10)
    assert sent == [True]
    sender.close()


async def test_failing_on_abort_hook_never_replaces_a_foreign_cancellation(caplog: Any) -> None:
    """When the caller's scope cancels the run and an on_abort hook raises, the cancellation
    still reaches the caller's scope (logged, not turned into a ``HookError``)."""

    def failing(reason: str) -> None:
        raise RuntimeError("cleanup failed")

    model = ScriptedModel([reply("x", open_delay=FOREVER)])
    loop = AgentLoop(model, hooks=[hook(on_abort=failing)])
    with anyio.fail_after(10):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cut() -> None:
                    await model.reached("open")
                    scope.cancel()

                tg.start_soon(cut)
                await loop.run("hi")
    assert scope.cancelled_caught
    assert "on_abort hook failed" in caplog.text


async def test_pause_on_the_final_finish_resumes_to_that_answer() -> None:
    """A pause that lands on the model's ``Finish`` with no tool calls keeps the complete answer:
    ``resume()`` returns it without asking the model again. A pause mid-text asks again."""
    model = ScriptedModel([reply("final answer"), reply("part"), reply("continued")])
    pause_on = [Finish]
    loop = AgentLoop(model, hooks=[hook(on_event=lambda e: Pause("look") if type(e) in pause_on else None)])
    with anyio.fail_after(10):
        assert isinstance(await loop.run("q1"), Paused)
        assert await loop.resume() == Finished("final answer", 0, "stop")
        assert model.counts.opened == 1
        pause_on[:] = [TextDelta]
        assert isinstance(await loop.run("q2"), Paused)
        pause_on[:] = []
        assert await loop.resume() == Finished("continued", 1, "stop")
    assert model.counts.opened == 3
