"""``durable(agent)``: a ``pydantic_ai.Agent`` run as a turn on turnpool's step records.

``myapp.agents:trip = durable(Agent(...), idempotent_tools=("reserve",))`` is a turnpool agent (name it
in ``submit``): it runs the pydantic-ai agent node by node (``agent.iter``) and records, through the
turn (LOOP-STEP-DURABLE), every message of the run as it is made (``pa_msg``: the user's request, each model
response, each request carrying tool returns), and around each tool call a ``started`` record, durable
before the tool runs, and a ``completed`` one with its return value, durable before the next model
request. When the turn (``retry=True``) runs again after its worker died, the run continues from the
recorded messages (``message_history``): a recorded response is not asked for again; pydantic-ai then
runs the tool calls of the last response that have no return, and each goes through the same wrapper:
a completed call returns its recorded value without running, a call that started without completing
runs again only if its tool is in ``idempotent_tools`` (with the same ``current_call()`` key), else is
answered as unknown (``on_unknown_outcome="tell_model"``) or ends the turn (``"fail"``:
``UnknownToolOutcome``). Followers get ``tool_call`` / ``tool_call_update`` events and the final text.
Input: a ``str`` prompt. The output: the run's output, encodable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai import messages as m
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_core import to_jsonable_python

from .._steps import StepLog, StepRefused
from .._toolerrors import ToolIsolationError, failed_fields
from .._turn import Turn
from ..agent._errors import StepRecordError, UnknownToolOutcome
from ..agent._steps import ON_UNKNOWN_OUTCOME, CallInfo, reset_current, set_current
from . import TurnThreads

__all__ = ["durable"]


def unknown_text(call_id: str, name: str) -> str:
    return (
        f"the outcome of tool call {call_id!r} ({name!r}) is unknown: it started in an earlier attempt "
        "of this turn that crashed before it completed. It may have taken effect; do not assume it "
        "failed, and do not repeat it without checking."
    )


@dataclass
class _Run:
    """One attempt's state: the turn's log, what the records say of each call, the last seq."""

    turn: Turn
    log: StepLog
    idempotent: frozenset[str]
    on_unknown: str
    completed: dict[str, Any]
    started: set[str]
    last: int = -1
    steps: int = 0  # model responses so far (a call's step)

    def post(self, kind: str, **body: Any) -> int:
        record = {"v": 1, "turn": self.turn.id, "loop": 0, "k": kind, "step": self.steps, **body}
        self.last = self.log.record(self.steps, kind, record)
        return self.last

    async def durable(self) -> None:
        if self.last >= 0:
            try:
                await self.log.durable(self.last)
            except StepRefused as exc:
                raise StepRecordError(f"a step record could not be made durable: {exc}") from None


class _Recording(WrapperToolset[Any]):
    """Each tool call: its records, and the rule for a call the records say started (LOOP-UNKNOWN-CALL)."""

    def __init__(self, wrapped: AbstractToolset[Any], run: _Run) -> None:
        super().__init__(wrapped)
        self.run = run

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: Any) -> Any:
        run, call_id = self.run, ctx.tool_call_id or name
        if call_id in run.completed:
            return run.completed[call_id]  # LOOP-RESUME: its recorded return, not run again
        if call_id in run.started and name not in run.idempotent:
            if run.on_unknown == "fail":
                raise UnknownToolOutcome(name=name, call_id=call_id, step=run.steps)
            value = unknown_text(call_id, name)
            run.post("completed", call=call_id, name=name, output=value, error=None)
            return value
        if call_id not in run.started:
            run.post("started", call=call_id, name=name, index=0)
            await run.durable()  # LOOP-STEP-DURABLE: before the tool runs
        await run.turn.emit(
            {"type": "tool_call", "id": call_id, "title": name, "input": _jsonable(tool_args)}
        )
        scope = f"{run.turn.id}\0pydantic-ai\0{call_id}"
        key = "tp-" + hashlib.sha256(scope.encode()).hexdigest()[:32]
        token = set_current(CallInfo(call_id, name, run.steps, 0, run.turn.attempt, key, run.turn.id))
        try:
            value = await self.wrapped.call_tool(name, tool_args, ctx, tool)
        except (
            ToolIsolationError
        ) as exc:  # TOOL-TOLD-FOLLOWERS: pydantic-ai tells its model; followers see it
            await run.turn.emit({"type": "tool_call_update", "id": call_id, **failed_fields(exc)})
            raise
        finally:
            reset_current(token)
        run.post("completed", call=call_id, name=name, output=_jsonable(value), error=None)
        await run.turn.emit(
            {"type": "tool_call_update", "id": call_id, "status": "completed", "output": _jsonable(value)}
        )
        return value


def _jsonable(value: Any) -> Any:
    return to_jsonable_python(value, fallback=str)


def durable(
    agent: Agent[Any, Any],
    *,
    idempotent_tools: Sequence[str] = (),
    on_unknown_outcome: str = "tell_model",
) -> Any:
    """A turnpool agent running ``agent`` on step records (see the module docstring)."""
    if on_unknown_outcome not in ON_UNKNOWN_OUTCOME:
        raise ValueError(f"on_unknown_outcome must be 'tell_model' or 'fail', got {on_unknown_outcome!r}")
    idempotent = frozenset(idempotent_tools)

    async def run_turn(turn: Turn) -> Any:
        if not isinstance(turn.input, str):
            raise TypeError(
                f"a durable pydantic-ai agent takes a str prompt, got {type(turn.input).__name__}"
            )
        log = turn._steps()
        if log.corrupt is not None:
            raise StepRecordError(log.corrupt)
        history: list[m.ModelMessage] = []
        run = _Run(turn, log, idempotent, on_unknown_outcome, {}, set())
        for record in log.recorded:
            if not isinstance(record, dict) or record.get("turn") != turn.id:
                raise StepRecordError(f"a step record of turn {turn.id!r} belongs to another turn: refused")
            kind = record.get("k")
            try:
                if kind == "pa_msg":
                    history.extend(m.ModelMessagesTypeAdapter.validate_python(record["messages"]))
                elif kind == "started":
                    run.started.add(record["call"])
                elif kind == "completed":
                    run.completed[record["call"]] = record.get("output")
            except (KeyError, ValueError) as exc:
                raise StepRecordError(f"a step record of turn {turn.id!r} cannot be read: {exc}") from None
        run.steps = sum(isinstance(msg, m.ModelResponse) for msg in history)
        recorded = len(history)
        toolsets = [_Recording(ts, run) for ts in agent.toolsets]
        prompt = None if history else turn.input
        async with TurnThreads() as threads:
            # The agent's own tools come wrapped among ``toolsets``: none left to register twice.
            with Agent.using_thread_executor(threads), agent.override(tools=[], toolsets=toolsets):
                async with agent.iter(prompt, message_history=history or None) as graph_run:
                    async for node in graph_run:
                        messages = graph_run.all_messages()
                        if len(messages) > recorded:
                            new = messages[recorded:]
                            recorded = len(messages)
                            run.steps += sum(isinstance(msg, m.ModelResponse) for msg in new)
                            run.post(
                                "pa_msg", messages=m.ModelMessagesTypeAdapter.dump_python(new, mode="json")
                            )
                        if Agent.is_model_request_node(node):
                            # LOOP-STEP-DURABLE: the calls' records before the next request
                            await run.durable()
                    result = graph_run.result
        await run.durable()
        assert result is not None
        return _jsonable(result.output)

    return run_turn
