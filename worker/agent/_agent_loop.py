"""``AgentLoop``: model stream → parallel tool calls → hooks → repeat, with the Rust worker
spec's cancellation detection points.

A run is a sequence of steps. Each step either runs the pending tool calls (calls in the
history with no output yet) in parallel, or opens a model stream and reads it to the end.
Cancellation is looked for at four points:

1. the head of every step (non-blocking ``try_recv``);
2. while the model stream is being opened;
3. while waiting for each streamed event;
4. while a batch of tools runs in an anyio task group (cancelling stops all of them).

Points 2–4 wait in an anyio ``CancelScope`` that a cancel token cancels directly: no polling,
no extra task per wait. Every interruption goes through ``_finalize``: the timeline's open
block is closed as aborted, ``last_run_interrupted`` is set, and the ``on_abort`` hooks run
once, shielded, with the reason (``"Cancelled"`` for cancellation).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import TurnCancelled
from .._isolated import Isolated
from .._toolerrors import ToolIsolationError, ToolKilled, failed_fields
from ._cancel import CancelReceiver, CancelSender, _Channel
from ._errors import (
    Aborted,
    AgentLoopError,
    Cancelled,
    ClientError,
    ConfigWarnings,
    HookError,
    MaxStepsExceeded,
    StepRecordError,
    ToolError,
)
from ._hooks import Abort, Action, Hook, Pause, Step, as_action, call_maybe_async
from ._messages import (
    AssistantMessage,
    Finish,
    Finished,
    FunctionCall,
    FunctionCallOutput,
    HistoryItem,
    ModelEvent,
    ModelRequest,
    Paused,
    RunResult,
    TextDelta,
    ToolCall,
    UserMessage,
)
from ._model import ModelClient, ModelStream
from ._steps import ON_UNKNOWN_OUTCOME, LoopSteps, reset_current, set_current
from ._timeline import Block, Timeline
from ._tools import Tool

if TYPE_CHECKING:
    from .._turn import CancelSignal, Turn

logger = logging.getLogger("worker.agent")

#: How long closing an interrupted model stream may take (it runs shielded).
STREAM_CLOSE_TIMEOUT = 5.0


class AgentLoop:
    """An agent loop over a ``ModelClient``, ``tools`` and ``hooks``.

    ``await run(prompt)`` / ``await resume()`` return ``Finished`` or ``Paused`` or raise an
    ``AgentLoopError`` (``Cancelled``, ``Aborted``, ``ClientError``, ``ToolError``,
    ``HookError``, ``ConfigWarnings``). ``cancel()`` and ``cancel_sender()`` stop a run at the
    next detection point; a cancel queued while no run is active is stale and dropped when the
    next run starts.

    Bound to a turn (``turn=`` or ``bind(turn)``) the loop also stops when the turn's signal
    is set (a supervisor ``Abort``), raising ``Cancelled`` (a ``worker.TurnCancelled``) with the
    turn's cause, and it streams ``delta`` / ``tool_call`` / ``tool_result`` events to the turn.

    Bound to a turn it also records each step durably through the supervisor (LOOP-STEP-DURABLE,
    ``_steps.py``), and on a later attempt of the turn (``retry=True`` after its worker died) it
    resumes from them: recorded responses and outputs are used, not asked for or run again. A
    call that started and did not complete is run again only by an ``idempotent`` tool; otherwise
    ``on_unknown_outcome`` says what happens: ``"tell_model"`` (the call's output is an error
    saying its outcome is unknown) or ``"fail"`` (``UnknownToolOutcome``).
    """

    def __init__(
        self,
        model: ModelClient,
        tools: Iterable[Tool] = (),
        hooks: Iterable[Hook] = (),
        *,
        system: str | None = None,
        settings: Mapping[str, Any] | None = None,
        turn: Turn | None = None,
        cancel_rx: CancelReceiver | None = None,
        emit_events: bool = True,
        max_steps: int = 50,
        max_tool_errors: int = 3,
        on_unknown_outcome: str = "tell_model",
    ) -> None:
        if on_unknown_outcome not in ON_UNKNOWN_OUTCOME:
            raise ValueError(f"on_unknown_outcome must be 'tell_model' or 'fail', got {on_unknown_outcome!r}")
        self.on_unknown_outcome = on_unknown_outcome
        self._steps: LoopSteps | None = None  # the step records of the turn bound now (LOOP-STEP-DURABLE)
        for name, value in (("max_steps", max_steps), ("max_tool_errors", max_tool_errors)):
            low = 1 if name == "max_steps" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        # Bounds of one run()/resume(): model requests, and tool calls the model got wrong
        # (unknown tool, unreadable or unfitting arguments) answered with the error (A-TOOLERR).
        self.max_steps = max_steps
        self.max_tool_errors = max_tool_errors
        self._model_steps = 0
        self._tool_errors = 0
        self.model = model
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self.tools:
                raise ValueError(f"two tools are named {t.name!r}")
            self.tools[t.name] = t
        self.hooks: list[Hook] = list(hooks)
        self.system = system
        self.settings: dict[str, Any] = dict(settings or {})
        self.history: list[HistoryItem] = []
        self.timeline = Timeline()
        self.emit_events = emit_events
        self._last_run_interrupted = False
        self._running = False
        # A pause that came on or after the model's Finish, with no tool calls: the answer is
        # complete, so resume() returns it instead of asking the model again.
        self._paused_answer: tuple[str, str | None] | None = None
        self._turn: Turn | None = None
        self._signal: CancelSignal | None = None
        if cancel_rx is None:
            self._chan = _Channel()
            # The loop's own sender: as in the Rust worker, the channel stays connected while
            # the loop lives, so closing handed-out senders is harmless.
            self._own_sender: CancelSender | None = CancelSender(self._chan)
        else:
            self._chan = cancel_rx._claim()
            self._own_sender = None
        if turn is not None:
            self.bind(turn)

    # ---- cancellation API ---------------------------------------------------------------

    def cancel(self) -> None:
        """Ask the current run to stop at its next detection point (the Rust ``try_send``).
        A cancel made while no run is active is drained when the next run starts.
        Safe from any task and from other threads."""
        self._chan.put()

    def cancel_sender(self) -> CancelSender:
        """A new sender on this loop's cancel channel, for a task that must not touch the loop."""
        return CancelSender(self._chan)

    def is_cancelled(self) -> bool:
        """A cancel is waiting to be seen: a queued token, a channel with no sender left,
        or the bound turn's signal set."""
        return self._cancel_ready()

    @property
    def last_run_interrupted(self) -> bool:
        """Whether the last ``run()`` / ``resume()`` ended by an error or a pause (reset when
        one starts, cleared when it finishes)."""
        return self._last_run_interrupted

    @property
    def running(self) -> bool:
        return self._running

    def bind(self, turn: Turn) -> AgentLoop:
        """Take ``turn``'s signal (its cancel stops the loop) and stream events to it.
        A loop kept across turns must be bound to each new turn: a turn's signal stays set."""
        self._turn = turn
        signal = self._signal = turn.signal

        def on_cancel(cause: Any) -> None:
            if self._signal is signal:
                self._chan.put()

        signal.add_callback(on_cancel)
        return self

    def pending_tool_calls(self) -> tuple[FunctionCall, ...]:
        """Tool calls in ``history`` that have no ``FunctionCallOutput`` yet, in call order."""
        done = {item.call_id for item in self.history if isinstance(item, FunctionCallOutput)}
        return tuple(
            item for item in self.history if isinstance(item, FunctionCall) and item.call_id not in done
        )

    # ---- running --------------------------------------------------------------------------

    async def run(self, prompt: str) -> RunResult:
        """Add ``prompt`` as a user message and run steps until the model finishes or a hook pauses."""
        self._begin()
        self._paused_answer = None
        self.history.append(UserMessage(prompt))
        return await self._finalize(self._turn_loop(resumed=False, prompt=prompt))

    async def resume(self) -> RunResult:
        """Go on after a pause (or an interruption): run exactly the pending tool calls, once,
        then continue. The first step of a resume does not ask ``before_step`` again."""
        if not self.history:
            raise RuntimeError("nothing to resume: the loop has not run")
        self._begin()
        return await self._finalize(self._turn_loop(resumed=True))

    def _begin(self) -> None:
        if self._running:
            raise RuntimeError("this AgentLoop is already running")
        self._running = True
        self._last_run_interrupted = False
        self._model_steps = 0
        self._tool_errors = 0
        self._chan.attach()
        self._chan.drain()  # stale cancels from before this run never reach it

    # LOOP-POINTS: the agent loop's abort becomes its typed Cancelled after its hooks ran.
    async def _finalize(self, steps: Any) -> RunResult:
        """The spec's ``finalize_interruption``: every result of run()/resume() passes here."""
        try:
            try:
                result: RunResult = await steps
            except AgentLoopError as err:
                await self._interrupted(err.reason)
                raise
            except TurnCancelled as exc:  # e.g. a hook awaited turn.checkpoint()
                await self._interrupted("Cancelled")
                raise Cancelled(exc.cause) from exc
            except anyio.get_cancelled_exc_class():
                # An outer cancel scope fired (the worker's, on a supervisor Abort; or the
                # caller's). When it is our own cancel (bound turn, token) the run ends with the
                # typed Cancelled; otherwise the cancellation goes on untouched.
                ours = self._cancel_ready()
                if ours:
                    await self._interrupted("Cancelled")
                    self._chan.try_recv()
                    raise Cancelled(self._cause()) from None
                try:
                    await self._interrupted("Cancelled")
                except HookError:
                    # Never replace a cancellation that is not ours: log the hook's failure.
                    logger.exception("on_abort hook failed while the run was being cancelled")
                raise
            except Exception as exc:
                await self._interrupted(f"{type(exc).__name__}: {exc}")
                raise
            except BaseException:
                self.timeline.abort_current_block()
                self._last_run_interrupted = True
                raise
            self._last_run_interrupted = isinstance(result, Paused)
            return result
        finally:
            steps.close()
            self._running = False

    async def _interrupted(self, reason: str) -> None:
        self.timeline.abort_current_block()
        self._last_run_interrupted = True
        with anyio.CancelScope(shield=True):
            await self._run_on_abort_hooks(reason)

    async def _run_on_abort_hooks(self, reason: str) -> None:
        first_error: BaseException | None = None
        for h in self.hooks:
            fn = getattr(h, "on_abort", None)
            if fn is None:
                continue
            try:
                value = await call_maybe_async(fn, reason)
            except Exception as exc:  # noqa: BLE001 - every hook hears the reason once
                if first_error is None:
                    first_error = exc
                continue
            if isinstance(value, str):
                reason = value
        if first_error is not None:
            raise HookError(f"on_abort hook failed: {first_error!r}", phase="on_abort") from first_error

    # ---- the step loop ----------------------------------------------------------------------

    def _recorder(self) -> LoopSteps:
        """This run's step records: the bound turn's (made when the loop first runs in it)."""
        steps = self._steps
        turn_id = self._turn.id if self._turn is not None else None
        if steps is None or steps.turn_id != turn_id:
            steps = self._steps = LoopSteps(self._turn._steps() if self._turn is not None else None)
        return steps

    async def _turn_loop(self, *, resumed: bool, prompt: str | None = None) -> RunResult:
        self._check_settings()
        steps = self._recorder()
        if prompt is not None:
            steps.begin_run(prompt)
        index = 0
        first = True
        answer, self._paused_answer = self._paused_answer, None
        while True:
            # Detection point 1: the head of every step.
            if self._try_cancelled():
                self.timeline.abort_current_block()
                raise Cancelled(self._cause())
            pending = self.pending_tool_calls()
            if resumed and first and answer is not None and not pending:
                return Finished(answer[0], 0, answer[1])
            if not (resumed and first):
                action = await self._hooks_action("before_step", Step(index, pending, resumed))
                if isinstance(action, Pause):
                    return Paused(action.reason, pending)
            first = False
            index += 1
            if pending:
                outputs = await self._run_tools(pending)
                action = await self._hooks_action("after_tool_results", outputs)
                if isinstance(action, Pause):
                    return Paused(action.reason, self.pending_tool_calls())
                continue
            if self._model_steps >= self.max_steps:
                raise MaxStepsExceeded(self.max_steps)
            self._model_steps += 1
            outcome = await self._model_step()
            if isinstance(outcome, Paused):
                return outcome
            text, calls, finish = outcome
            if not calls:
                await steps.durable()  # LOOP-STEP-DURABLE: the answer is recorded before the agent acts on it
                return Finished(text, index, finish)

    def _check_settings(self) -> None:
        supported = getattr(self.model, "supported_settings", None)
        if supported is None:
            return
        unknown = sorted(set(self.settings) - set(supported))
        if unknown:
            raise ConfigWarnings(
                [f"{type(self.model).__name__} does not support setting {k!r}" for k in unknown]
            )

    async def _hooks_action(self, phase: str, arg: Any) -> Action | None:
        for h in self.hooks:
            fn = getattr(h, phase, None)
            if fn is None:
                continue
            try:
                value = await call_maybe_async(fn, arg)
                action = as_action(value, phase)
            except (AgentLoopError, TurnCancelled):
                raise
            except Exception as exc:
                raise HookError(f"{phase} hook {h!r} failed: {exc!r}", phase=phase) from exc
            if isinstance(action, Abort):
                raise Aborted(action.reason)
            if isinstance(action, Pause):
                return action
        return None

    # ---- detection points 2-4 ------------------------------------------------------------

    def _cancel_ready(self) -> bool:
        return self._chan.ready() or (self._signal is not None and self._signal.cancelled)

    def _try_cancelled(self) -> bool:
        if self._chan.try_recv():
            return True
        return self._signal is not None and self._signal.cancelled

    def _cause(self) -> Any:
        return self._signal.cause if self._signal is not None else None

    def _cancelled_here(self) -> Cancelled:
        self._chan.try_recv()  # the token that woke us is consumed, as recv() does
        self.timeline.abort_current_block()
        return Cancelled(self._cause())

    @contextlib.contextmanager
    def _detect(self) -> Iterator[None]:
        """Run the body until it is done or a cancel arrives, whichever is first (``select!``)."""
        if self._cancel_ready():
            raise self._cancelled_here()
        scope = anyio.CancelScope()
        self._chan.scopes.add(scope)
        try:
            with scope:
                yield
        except Exception as exc:
            if scope.cancel_called and not isinstance(exc, TurnCancelled):
                raise self._cancelled_here() from exc  # the body failed because we cut it
            raise
        finally:
            self._chan.scopes.discard(scope)
        if scope.cancel_called:
            raise self._cancelled_here()

    # ---- the model step -------------------------------------------------------------------

    async def _model_step(self) -> tuple[str, list[FunctionCall], str | None] | Paused:
        steps = self._recorder()
        recorded = steps.next_model_step()
        if recorded is not None:  # LOOP-RESUME: an earlier attempt has this response: not asked again
            return self._replayed_response(recorded)
        await steps.durable()  # LOOP-STEP-DURABLE: the completed calls' records first
        request = ModelRequest(
            messages=tuple(self.history),
            tools=tuple(t.spec for t in self.tools.values()),
            system=self.system,
            settings=dict(self.settings),
        )
        with self._detect():  # detection point 2: opening the stream
            try:
                stream = await self.model.open(request)
            except AgentLoopError:
                raise
            except Exception as exc:
                raise ClientError(f"opening the model stream failed: {exc!r}") from exc
        text: list[str] = []
        calls: list[FunctionCall] = []
        finish: str | None = None
        paused: Pause | None = None
        try:
            while True:
                event = await self._next_event(stream)
                if event is None:
                    break
                if isinstance(event, TextDelta):
                    text.append(event.text)
                    self.timeline.text_delta(event.text)
                    await self._emit({"type": "delta", "text": event.text})
                elif isinstance(event, ToolCall):
                    call = FunctionCall(event.call_id, event.name, dict(event.arguments), event.invalid)
                    calls.append(call)
                    self.timeline.add_closed(Block("tool_call", calls=[call]))
                    await self._emit(
                        {
                            "type": "tool_call",
                            "call_id": call.call_id,
                            "name": call.name,
                            "arguments": call.arguments,
                        }
                    )
                elif isinstance(event, Finish):
                    finish = event.reason
                action = await self._hooks_action("on_event", event)
                if isinstance(action, Pause):
                    paused = action
                    break
        finally:
            await self._close_stream(stream)
        self.timeline.close_current()
        joined = "".join(text)
        if joined:
            self.history.append(AssistantMessage(joined))
        self.history.extend(calls)
        if paused is not None:
            if finish is not None and not calls:
                self._paused_answer = (joined, finish)
            return Paused(paused.reason, self.pending_tool_calls())
        steps.record_model(joined, calls, finish)
        return joined, calls, finish

    def _replayed_response(self, recorded: dict[str, Any]) -> tuple[str, list[FunctionCall], str | None]:
        text = recorded.get("text") or ""
        try:
            calls = [FunctionCall(c[0], c[1], dict(c[2]), c[3]) for c in recorded.get("calls") or ()]
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise StepRecordError(f"a recorded model response cannot be read: {exc!r}") from None
        if text:
            self.history.append(AssistantMessage(text))
        self.history.extend(calls)
        return text, calls, recorded.get("finish")

    async def _next_event(self, stream: ModelStream) -> ModelEvent | None:
        with self._detect():  # detection point 3: between streamed events
            try:
                return await stream.__anext__()
            except StopAsyncIteration:
                return None
            except AgentLoopError:
                raise
            except Exception as exc:
                raise ClientError(f"the model stream failed: {exc!r}") from exc

    async def _close_stream(self, stream: ModelStream) -> None:
        with anyio.move_on_after(STREAM_CLOSE_TIMEOUT, shield=True):
            with contextlib.suppress(Exception):  # a failing close must not hide why we closed
                await stream.aclose()

    # ---- tools (detection point 4) -----------------------------------------------------------

    async def _run_tools(self, calls: Sequence[FunctionCall]) -> tuple[FunctionCallOutput, ...]:
        block = self.timeline.open("tool_run")
        block.calls = list(calls)
        outputs: dict[str, FunctionCallOutput] = {}
        failures: dict[str, BaseException] = {}
        turn_cancelled: list[TurnCancelled] = []
        steps = self._recorder()
        # LOOP-RESUME, LOOP-UNKNOWN-CALL: outputs the records already hold; the other calls are recorded
        # ``started`` (durable) before any of them runs.
        known, replayed = steps.plan(calls, self.tools, self.on_unknown_outcome)
        await steps.started(
            [
                c
                for c in calls
                if c.call_id not in known and not self._model_mistake(c, self.tools.get(c.name))
            ]
        )

        async def run_one(call: FunctionCall, group: anyio.abc.TaskGroup) -> None:
            if call.call_id in known:
                outputs[call.call_id] = FunctionCallOutput(call.call_id, call.name, known[call.call_id])
                block.results[call.call_id] = known[call.call_id]
                return
            t = self.tools.get(call.name)
            mistake = self._model_mistake(call, t)
            if mistake is not None:
                # A-TOOLERR: the model's mistake goes back to it as the call's output, as
                # OpenAI-style loops do, a bounded number of times per run.
                self._tool_errors += 1
                if self._tool_errors > self.max_tool_errors:
                    failures[call.call_id] = LookupError(
                        f"{mistake} (more than max_tool_errors={self.max_tool_errors} such calls in this run)"
                    )
                    group.cancel_scope.cancel()
                    return
                value: Any = {"error": mistake}
                outputs[call.call_id] = FunctionCallOutput(call.call_id, call.name, value)
                block.results[call.call_id] = value
                return
            assert t is not None
            token = set_current(steps.call_info(call))
            try:
                value = await t(call.arguments)
            except ToolIsolationError as exc:
                # TOOL-TOLD: a tool stopped by its own limits (or dead) is told to the model, bounded
                # by max_tool_errors like the model's mistakes; the turn goes on.
                await self._emit(_failed_update(call, exc))
                self._tool_errors += 1
                if self._tool_errors > self.max_tool_errors:
                    failures[call.call_id] = exc
                    group.cancel_scope.cancel()
                    return
                value = {"error": str(exc)}
                await self._not_recorded(call, steps.completed(call, value))
                outputs[call.call_id] = FunctionCallOutput(call.call_id, call.name, value)
                block.results[call.call_id] = value
                return
            except anyio.get_cancelled_exc_class():
                if isinstance(t.fn, Isolated):  # its ladder has run: say which call was stopped
                    with anyio.move_on_after(1.0, shield=True):
                        await self._emit(_failed_update(call, ToolKilled("cancelled")))
                raise
            except TurnCancelled as exc:  # e.g. the tool awaited turn.checkpoint(): a cancel, not a failure
                turn_cancelled.append(exc)
                group.cancel_scope.cancel()
                return
            except Exception as exc:  # noqa: BLE001 - reported as ToolError below
                steps.completed(call, None, error=f"{type(exc).__name__}: {exc}")
                failures[call.call_id] = exc
                group.cancel_scope.cancel()  # one failure ends the batch
                return
            finally:
                reset_current(token)
            # LOOP-STEP-DURABLE: posted at once (durable before the next model call, ``_model_step``).
            await self._not_recorded(call, steps.completed(call, value))
            outputs[call.call_id] = FunctionCallOutput(call.call_id, call.name, value)
            block.results[call.call_id] = value

        try:
            with self._detect():  # detection point 4: tools running in parallel
                async with anyio.create_task_group() as group:
                    for call in calls:
                        group.start_soon(run_one, call, group)
        finally:
            # Tools that did finish keep their output, even when the batch was cut: resume()
            # then runs only the others, so no tool runs twice.
            for call in calls:
                if call.call_id in outputs:
                    self.history.append(outputs[call.call_id])
        if turn_cancelled:
            self.timeline.abort_current_block()
            raise Cancelled(turn_cancelled[0].cause) from turn_cancelled[0]
        for call in calls:
            if call.call_id in failures:
                exc = failures[call.call_id]
                raise ToolError(
                    f"tool {call.name!r} failed: {exc!r}", name=call.name, call_id=call.call_id
                ) from exc
        self.timeline.close_current()
        done = tuple(outputs[c.call_id] for c in calls)
        for out in done:
            if out.call_id in replayed:
                continue  # its followers saw it in the attempt that ran it
            await self._emit(
                {"type": "tool_result", "call_id": out.call_id, "name": out.name, "output": out.output}
            )
        return done

    def _model_mistake(self, call: FunctionCall, t: Tool | None) -> str | None:
        """Why the model's call cannot be run (unknown tool, unreadable or unfitting arguments)."""
        if t is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return f"unknown tool {call.name!r}: the tools are {known}"
        if call.invalid is not None:
            return f"tool {call.name!r}: {call.invalid}"
        return t.check_arguments(call.arguments)

    async def _not_recorded(self, call: FunctionCall, why: str | None) -> None:
        """LOOP-STEP-SIZE: a call's output that could not be recorded still reaches the model in this
        attempt; the turn is told, and cannot be resumed past it."""
        if why is not None:
            logger.warning("%s", why)
            await self._emit(
                {"type": "step_not_recorded", "call_id": call.call_id, "name": call.name, "error": why}
            )

    # ---- turn events -----------------------------------------------------------------------

    async def _emit(self, event: dict[str, Any]) -> None:
        if self._turn is not None and self.emit_events:
            await self._turn.emit(event)


def _failed_update(call: FunctionCall, exc: ToolIsolationError) -> dict[str, Any]:
    """The ``tool_call_update`` event of a call stopped by its isolation (editors show it failed)."""
    return {
        "type": "tool_call_update",
        "id": call.call_id,  # ACP's key
        "call_id": call.call_id,  # the loop's tool_call / tool_result key
        "name": call.name,
        **failed_fields(exc),
    }
