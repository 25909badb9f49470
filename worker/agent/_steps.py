"""Step records of an ``AgentLoop`` bound to a turn, and the replay of them on a later attempt.

LOOP-STEP-DURABLE: a loop bound to a turn records each step through the turn's ``StepLog``
(``worker/_steps.py``): ``user`` (a run's prompt), ``model`` (a response: text, tool calls, finish
reason), ``started`` (a tool call, durable before the tool runs) and ``completed`` (its output or
error, durable before the next model call). Each record is a msgpack map with ``v`` (1), ``turn``,
``loop`` (the loop's index among the turn's loops), ``k`` (its kind) and ``step`` (the model step).

LOOP-RESUME: on a later attempt of the turn (``retry=True`` after its worker died) ``LoopSteps``
hands the loop the records of its earlier attempts in order: a recorded model response is used
instead of asking the model again, a completed call's recorded output instead of running it, and a
call that started without completing follows LOOP-UNKNOWN-CALL (``plan``). A record that does not fit
where the loop is (another turn's, another prompt, out of order, unreadable) ends the run with
``StepRecordError`` (LOOP-STEP-CORRUPT): the loop never runs blind.
"""

from __future__ import annotations

import collections
import contextvars
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._steps import StepLog, StepRecordTooLarge, StepRefused
from ._errors import StepRecordError, UnknownToolOutcome
from ._messages import FunctionCall

if TYPE_CHECKING:
    from ._tools import Tool

ON_UNKNOWN_OUTCOME = ("tell_model", "fail")
KINDS = frozenset({"user", "model", "started", "completed", "unresumable"})


@dataclass(frozen=True)
class CallInfo:
    """The tool call running now (``current_call()``): ``idempotency_key`` is derived from the
    turn id, the loop, the step and the call's index in it, and is the same on every attempt of
    the turn: pass it to the APIs that take one (payments, email, cloud APIs)."""

    call_id: str
    name: str
    step: int
    index: int
    attempt: int
    idempotency_key: str
    turn_id: str | None = None


_current: contextvars.ContextVar[CallInfo | None] = contextvars.ContextVar("turnpool_call", default=None)


def current_call() -> CallInfo:
    """The tool call this code runs in (inside a tool of an ``AgentLoop``); ``RuntimeError`` elsewhere."""
    info = _current.get()
    if info is None:
        raise RuntimeError("current_call() is only available inside a tool called by an AgentLoop")
    return info


def unknown_outcome_text(call: FunctionCall, step: int) -> str:
    return (
        f"the outcome of tool call {call.call_id!r} ({call.name!r}) is unknown: it started in an earlier "
        "attempt of this turn that crashed before it completed. It may have taken effect; do not assume "
        "it failed, and do not repeat it without checking."
    )


class LoopSteps:
    """One loop's records in one turn (``log`` None: not bound to a turn, nothing recorded)."""

    def __init__(self, log: StepLog | None) -> None:
        self.log = log
        self.turn_id = log.turn_id if log is not None else None
        self.scope = log.turn_id if log is not None else secrets.token_hex(16)
        self.attempt = log.attempt if log is not None else 1
        self.loop = 0
        self.step = -1  # the model step running (or last run); its calls carry it
        self.calls: dict[str, tuple[int, int]] = {}  # call id -> (step, index in its response)
        self.last = -1  # seq of the last record posted
        self.replay: collections.deque[dict[str, Any]] = collections.deque()
        if log is not None:
            self.loop = log.loops
            log.loops += 1
            if log.corrupt is not None:
                raise StepRecordError(log.corrupt)
            for record in log.recorded:
                self._check(record)
                if record["loop"] == self.loop:
                    self.replay.append(record)

    def _check(self, record: Any) -> None:
        if isinstance(record, dict) and "unreadable" in record:
            raise StepRecordError(
                f"the step records of turn {self.turn_id!r} cannot be read: {record['unreadable']}"
            )
        ok = (
            isinstance(record, dict)
            and record.get("v") == 1
            and record.get("k") in KINDS
            and type(record.get("loop")) is int
            and type(record.get("step")) is int
        )
        if not ok:
            raise StepRecordError(
                f"a step record of turn {self.turn_id!r} is not one this loop wrote: {record!r:.200}"
            )
        if record.get("turn") != self.turn_id:
            raise StepRecordError(
                f"a step record of turn {self.turn_id!r} belongs to turn {record.get('turn')!r}: refused"
            )

    @property
    def replaying(self) -> bool:
        return bool(self.replay)

    def key(self, step: int, index: int) -> str:
        digest = hashlib.sha256(f"{self.scope}\0{self.loop}\0{step}\0{index}".encode()).hexdigest()
        return f"tp-{digest[:32]}"

    def call_info(self, call: FunctionCall) -> CallInfo:
        step, index = self.calls.get(call.call_id, (self.step, 0))
        return CallInfo(
            call.call_id, call.name, step, index, self.attempt, self.key(step, index), self.turn_id
        )

    # ---- recording ----------------------------------------------------------------------

    def _post(self, kind: str, step: int, **body: Any) -> int:
        assert self.log is not None
        record = {"v": 1, "turn": self.turn_id, "loop": self.loop, "k": kind, "step": step, **body}
        self.last = self.log.record(step, kind, record)
        return self.last

    async def durable(self) -> None:
        """LOOP-STEP-DURABLE: every record posted so far is durable (before the next model call)."""
        if self.log is None or self.last < 0:
            return
        try:
            await self.log.durable(self.last)
        except StepRefused as exc:
            raise StepRecordError(f"a step record could not be made durable: {exc}") from None

    def begin_run(self, prompt: str) -> None:
        if self.log is None:
            return
        if self.replay:
            head = self.replay[0]
            if head["k"] != "user" or head.get("text") != prompt:
                raise StepRecordError(
                    f"the step records of turn {self.turn_id!r} were made by another run (recorded "
                    f"{head['k']!r} record, this run starts with another prompt): refused"
                )
            self.replay.popleft()
            return
        self._post("user", max(self.step, 0), text=prompt)

    def next_model_step(self) -> dict[str, Any] | None:
        """Start model step ``step + 1``; its recorded response, if an earlier attempt recorded it."""
        self.step += 1
        if not self.replay:
            return None
        head = self._head("model")
        self.replay.popleft()
        self.note_calls(head.get("calls") or [])
        return head

    def _head(self, kind: str) -> dict[str, Any]:
        head = self.replay[0]
        if head["k"] == "unresumable":
            raise StepRecordError(
                f"turn {self.turn_id!r} cannot be resumed past step {head['step']}: {head.get('reason')}"
            )
        if head["k"] != kind or head["step"] != self.step:
            raise StepRecordError(
                f"the step records of turn {self.turn_id!r} do not fit this run: expected a {kind!r} "
                f"record for step {self.step}, found {head['k']!r} for step {head['step']}"
            )
        return head

    def note_calls(self, calls: Sequence[Any]) -> None:
        for index, call in enumerate(calls):
            call_id = call[0] if isinstance(call, (list, tuple)) else call.call_id
            self.calls[call_id] = (self.step, index)

    def record_model(self, text: str, calls: Sequence[FunctionCall], finish: str | None) -> None:
        self.note_calls(calls)
        if self.log is None:
            return
        encoded = [[c.call_id, c.name, c.arguments, c.invalid] for c in calls]
        try:
            self._post("model", self.step, text=text, calls=encoded, finish=finish)
        except StepRecordTooLarge as exc:
            self._post("unresumable", self.step, reason=f"the model's response was not recorded: {exc}")

    # ---- tools ------------------------------------------------------------------------------

    def plan(
        self, calls: Sequence[FunctionCall], tools: dict[str, Tool], on_unknown: str
    ) -> tuple[dict[str, Any], set[str]]:
        """LOOP-UNKNOWN-CALL: for a batch of calls, the outputs known from the records (completed calls;
        calls whose outcome is unknown, told to the model), and the ids of the calls whose output
        was recorded in an earlier attempt (not told to followers again). The others run."""
        known: dict[str, Any] = {}
        replayed: set[str] = set()
        if not self.replay:
            return known, replayed
        ids = {c.call_id for c in calls}
        states: dict[str, dict[str, Any]] = {}
        while self.replay and self.replay[0]["k"] in ("started", "completed", "unresumable"):
            head = self.replay[0]
            if head.get("call") not in ids:
                break
            self.replay.popleft()
            if head["k"] == "unresumable":
                raise StepRecordError(
                    f"turn {self.turn_id!r} cannot be resumed past tool call {head.get('call')!r}: "
                    f"{head.get('reason')}"
                )
            if head["k"] == "completed" or head["call"] not in states:
                states[head["call"]] = head
        for call in calls:
            state = states.get(call.call_id)
            if state is None:
                continue
            if state["k"] == "completed":
                known[call.call_id] = state.get("output")
                replayed.add(call.call_id)
                continue
            t = tools.get(call.name)
            if t is not None and t.idempotent:
                continue  # run again, with the same idempotency key
            step = self.calls.get(call.call_id, (self.step, 0))[0]
            if on_unknown == "fail":
                raise UnknownToolOutcome(name=call.name, call_id=call.call_id, step=step)
            value = {"error": unknown_outcome_text(call, step)}
            known[call.call_id] = value
            self.completed(call, value)
        return known, replayed

    async def started(self, calls: Sequence[FunctionCall]) -> None:
        """LOOP-STEP-DURABLE: a ``started`` record per call, durable before any of them runs."""
        if self.log is None or not calls:
            return
        for call in calls:
            step, index = self.calls.get(call.call_id, (self.step, 0))
            self._post("started", step, call=call.call_id, name=call.name, index=index)
        await self.durable()

    def completed(self, call: FunctionCall, output: Any, error: str | None = None) -> str | None:
        """Post a call's ``completed`` record; the reason it could not be, if so (LOOP-STEP-SIZE: marked
        ``unresumable`` instead, the output still reaches the model in this attempt)."""
        if self.log is None:
            return None
        step = self.calls.get(call.call_id, (self.step, 0))[0]
        try:
            self._post("completed", step, call=call.call_id, name=call.name, output=output, error=error)
        except StepRecordTooLarge as exc:
            why = f"the output of tool call {call.call_id!r} ({call.name!r}) was not recorded: {exc}"
            self._post("unresumable", step, call=call.call_id, reason=why)
            return why
        except TypeError as exc:  # an output msgpack cannot encode: the same, said so
            why = f"the output of tool call {call.call_id!r} ({call.name!r}) cannot be recorded: {exc}"
            self._post("unresumable", step, call=call.call_id, reason=why)
            return why
        return None


def set_current(info: CallInfo) -> contextvars.Token[CallInfo | None]:
    return _current.set(info)


def reset_current(token: contextvars.Token[CallInfo | None]) -> None:
    _current.reset(token)
