"""Step records: what an agent loop made durable of a running turn, and its resume after a crash.

``StepRecords`` keeps each live turn's step records (``worker_link.Step``, in ``seq`` order) in memory and
answers each with ``worker_link.StepAck`` once it is durable (LOOP-STEP-DURABLE): at once when embedded, once
the journal committed it when a sink is set (a daemon's journal, ``set_sink``). A turn submitted with
``retry=True`` whose worker died without its turn being escalated runs again as ``attempts + 1`` (LOOP-RESUME,
``requeue``), up to ``MAX_ATTEMPTS``: its followers get a ``resumed`` event, and its next ``Run`` carries the
records (``for_run``), so the loop resumes from its last recorded step. Ended turns' records are kept
(bounded) for inspection (``view``, LOOP-STEP-INSPECT).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

import wire
from wire import worker_link

from .states import move

if TYPE_CHECKING:
    from .book import TurnBook
    from .hooks import Hooks
    from .pool import WorkerSlot
    from .turns import TurnRecord

log = logging.getLogger("turnpool.supervisor")

# LOOP-RESUME: a retry=True turn whose worker died runs at most this many times in all, then ends
# ``crashed`` (a turn that kills its worker every time does not loop through the pool forever).
MAX_ATTEMPTS = 5
# LOOP-STEP-SIZE: the largest record kept (the worker refuses bigger ones itself; this is the boundary's
# check).
MAX_RECORD_BYTES = 4 * 1024 * 1024 + 4096
# LOOP-STEP-SIZE: the most a live turn's records may hold here (the worker stops at 24 MiB; a worker that
# does not is refused past this, so no agent can grow the supervisor's memory without bound).
MAX_TURN_BYTES = 24 * 1024 * 1024 + 65536
# Ended turns whose records stay readable (LOOP-STEP-INSPECT), and their bytes in all; the oldest go first.
KEEP_TURNS = 10_000
KEEP_BYTES = 64 * 1024 * 1024

# The kinds of the framework recorders' records (LOOP-STEP-INSPECT reads their model steps from them).
_FRAMEWORK_KINDS = frozenset({"lg_put", "lg_writes", "pa_msg"})

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.decode


class StepSink(Protocol):
    """Where step records are made durable (a daemon's journal): ``write`` calls ``done`` on the
    supervisor's event loop once the record is committed."""

    def write(
        self, turn_id: str, seq: int, step: int, kind: str, record: bytes, done: Callable[[], None]
    ) -> None: ...


class _Steps:
    __slots__ = ("bytes", "kinds", "records")

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.kinds: list[str] = []
        self.bytes = 0


class StepRecords:
    """Every live turn's step records, their acknowledgement, and resume; see the module docstring."""

    def __init__(
        self,
        book: TurnBook,
        send: Callable[[WorkerSlot, Any], None],
        hooks: Hooks,
        bad_frame: Callable[[], None],
    ) -> None:
        self.book = book
        self.send = send
        self.hooks = hooks
        self.bad_frame = bad_frame
        self.live: dict[str, _Steps] = {}
        self.kept: collections.OrderedDict[str, _Steps] = collections.OrderedDict()
        self.kept_bytes = 0
        self.sink: StepSink | None = None
        self.recorded = 0  # records taken (a figure for status and benchmarks)
        self.resumed = 0  # attempts begun again after a crash

    def set_sink(self, sink: StepSink | None) -> None:
        """LOOP-STEP-DURABLE: records are acknowledged only once ``sink`` committed them (set it before the
        first turn)."""
        self.sink = sink

    # ---- recording ------------------------------------------------------------------------

    def on_step(self, slot: WorkerSlot, msg: worker_link.Step) -> None:
        turn = slot.turn
        if turn is None or turn.id != msg.turn_id:
            self.bad_frame()  # not the turn this worker runs (out of order): ignored
            return
        steps = self.live.get(turn.id)
        if steps is None:
            steps = self.live[turn.id] = _Steps()
        data = bytes(msg.record)
        error = None
        if msg.seq != len(steps.records):
            error = f"step record {msg.seq} is out of order (the turn has {len(steps.records)})"
        elif len(data) > MAX_RECORD_BYTES:
            error = f"a step record of {len(data)} bytes is over the limit of {MAX_RECORD_BYTES}"
        elif steps.bytes + len(data) > MAX_TURN_BYTES:
            error = f"the turn's step records would hold over {MAX_TURN_BYTES} bytes"
        if error is not None:
            self.send(slot, worker_link.StepAck(turn.id, msg.seq, error))
            return
        steps.records.append(data)
        steps.kinds.append(msg.kind)
        steps.bytes += len(data)
        self.recorded += 1
        sink = self.sink
        if sink is None:
            self.send(slot, worker_link.StepAck(turn.id, msg.seq))
            return
        sink.write(turn.id, msg.seq, msg.step, msg.kind, data, lambda: self._durable(slot, turn, msg.seq))

    def _durable(self, slot: WorkerSlot, turn: TurnRecord, seq: int) -> None:
        if slot.turn is turn and slot.state != "dead":
            self.send(slot, worker_link.StepAck(turn.id, seq))

    def restore(self, turn_id: str, records: list[tuple[str, bytes]]) -> None:
        """A daemon's journal gives back a turn's records at restart (before the turn runs again)."""
        steps = self.live[turn_id] = _Steps()
        for kind, data in records:
            try:
                _decode(data)
            except (msgspec.DecodeError, RecursionError) as exc:
                # LOOP-STEP-CORRUPT: one that cannot be read must not break the Run frame it travels in:
                # the worker is handed why, and its loop refuses to resume.
                data = _encode({"unreadable": f"a step record in the journal cannot be read: {exc}"})
            steps.records.append(data)
            steps.kinds.append(kind)
            steps.bytes += len(data)

    def for_run(self, turn: TurnRecord) -> msgspec.Raw:
        """LOOP-RESUME: the records a ``Run`` of ``turn`` carries (NIL: none, the first attempt)."""
        steps = self.live.get(turn.id)
        if steps is None or not steps.records or turn.attempts <= 1:
            return wire.NIL
        if steps.bytes + len(turn.input) > wire.MAX_PAYLOAD_SIZE:
            # LOOP-STEP-SIZE: a Run over the link's frame limit would cost the worker its link; the loop
            # is told why it cannot resume instead.
            why = f"the turn's step records ({steps.bytes} bytes) and input do not fit in one message"
            return msgspec.Raw(_encode([{"unreadable": why}]))
        return msgspec.Raw(_encode([msgspec.Raw(r) for r in steps.records]))

    def from_step(self, turn_id: str) -> int:
        """How many model responses the turn's records hold (a resumed attempt does not ask the
        model for them again)."""
        steps = self.live.get(turn_id)
        if steps is None:
            return 0
        if not any(k in _FRAMEWORK_KINDS for k in steps.kinds):
            return steps.kinds.count("model")  # an AgentLoop's: one record per model response
        # A framework's records (LangGraph, pydantic-ai) hold model responses among other data.
        return sum(1 for s in describe(steps.records) if "calls" in s)

    # ---- resume ---------------------------------------------------------------------------

    def requeue(self, turn: TurnRecord) -> bool:
        """LOOP-RESUME: ``turn``'s worker died while it ran (not escalated, not cancelled). With
        ``retry=True`` it is queued again at the front as ``attempts + 1`` and its followers get a
        ``resumed`` event; False (it ends ``crashed``) otherwise, or past ``MAX_ATTEMPTS``."""
        book = self.book
        if not turn.retry or turn.cause is not None or turn.escalation or book.phase in ("closing", "closed"):
            return False
        records = book.table.records
        if any(c in records and records[c].state != "ended" for c in turn.children):
            return False
        if turn.attempts >= MAX_ATTEMPTS:
            log.warning("turn %s: its worker died in each of %d attempts; crashed", turn.id, turn.attempts)
            return False
        if turn.timer is not None:
            turn.timer.cancel()
            turn.timer = None
        book.running -= 1
        move(turn, "queued")
        turn.worker = None
        turn.started = False  # the next start arms its deadline and runs the start hooks again
        turn.attempts += 1
        self.resumed += 1
        self.announce(turn)
        book.queue.push(turn, front=True)
        return True

    def announce(self, turn: TurnRecord) -> None:
        """The ``resumed`` event between two attempts of ``turn`` (its followers see both)."""
        event = {"type": "resumed", "attempt": turn.attempts, "from_step": self.from_step(turn.id)}
        data = msgspec.Raw(wire.encode_payload(event, what="event"))
        self.book.table.add_event(turn, data)
        for hook in self.hooks.event:
            hook(turn, data)

    # ---- retention and inspection ----------------------------------------------------------

    def ended(self, turn: TurnRecord, result: Any) -> None:
        """A result hook: the turn's records move to the bounded set kept for inspection."""
        steps = self.live.pop(turn.id, None)
        if steps is None:
            return
        self.kept[turn.id] = steps
        self.kept_bytes += steps.bytes
        while self.kept and (len(self.kept) > KEEP_TURNS or self.kept_bytes > KEEP_BYTES):
            _, old = self.kept.popitem(last=False)
            self.kept_bytes -= old.bytes

    def records(self, turn_id: str) -> list[bytes] | None:
        steps = self.live.get(turn_id) or self.kept.get(turn_id)
        return None if steps is None else list(steps.records)

    def view(self, turn_id: str) -> list[dict[str, Any]] | None:
        """LOOP-STEP-INSPECT: the turn's steps as ``describe`` shows them; ``None`` if none are held here."""
        records = self.records(turn_id)
        return None if records is None else describe(records)


def describe(records: list[bytes]) -> list[dict[str, Any]]:
    """LOOP-STEP-INSPECT: records as steps: ``{"loop", "step", "text", "finish", "calls": [{"call_id",
    "name", "arguments", "state", "output", "error"}]}`` (a LangGraph step also names its
    ``node``), each call's ``state`` one of ``not_started``, ``started`` (its outcome unknown if the
    turn crashed then), ``completed``, ``not_recorded`` (its output was too large to record). Every
    recorder's records are read: ``worker.agent.AgentLoop``'s (``model``, ``started``,
    ``completed``, ``unresumable``), LangGraph's ``TurnCheckpointer``'s (``lg_writes`` /
    ``lg_put``, by their plain ``view``) and pydantic-ai ``durable``'s (``pa_msg`` with the
    ``started`` / ``completed`` records around its tools). A record that cannot be read is shown as
    ``{"unreadable": why}``."""
    view = _View()
    for data in records:
        try:
            r = _decode(data)
            loop, step, kind = r["loop"], r["step"], r["k"]
        except (msgspec.DecodeError, KeyError, TypeError) as exc:
            view.out.append({"unreadable": str(exc)})
            continue
        try:
            view.take(r, loop, step, kind)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            view.out.append({"unreadable": f"a {kind} step record cannot be shown: {exc!r}"})
    return view.out


class _View:
    """``describe``'s state: the steps so far, each call by ``(loop, call_id)``."""

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []
        self.calls: dict[tuple[Any, Any], dict[str, Any]] = {}
        self.last: dict[str, Any] | None = None  # the last step a framework recorder made

    def step(self, loop: Any, step: Any, text: Any, finish: Any, calls: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "loop": loop,
            "step": step,
            "text": text or "",
            "finish": finish,
            "calls": [],
        }
        self.out.append(entry)
        for c in calls or ():
            call = {"call_id": c[0], "name": c[1], "arguments": c[2], "state": "not_started"}
            entry["calls"].append(call)
            self.calls[(loop, c[0])] = call
        return entry

    def framework_step(self, text: Any, finish: Any, calls: Any) -> dict[str, Any]:
        n = sum(1 for s in self.out if "calls" in s)
        self.last = self.step(0, n, text, finish, calls)
        return self.last

    def take(self, r: dict[str, Any], loop: Any, step: Any, kind: str) -> None:
        calls = self.calls
        if kind == "model":
            self.step(loop, step, r.get("text", ""), r.get("finish"), r.get("calls"))
        elif kind in ("started", "completed", "unresumable") and (loop, r.get("call")) in calls:
            call = calls[(loop, r.get("call"))]
            if kind == "started" and call["state"] == "not_started":
                call["state"] = "started"
            elif kind == "completed":
                call.update(state="completed", output=r.get("output"), error=r.get("error"))
            elif kind == "unresumable":
                call.update(state="not_recorded", error=r.get("reason"))
        elif kind == "unresumable":
            self.out.append({"loop": loop, "step": step, "not_recorded": r.get("reason")})
        elif kind in ("lg_writes", "lg_put"):
            self.langgraph(kind, r.get("view") or {})
        elif kind == "pa_msg":
            self.pydantic_ai(r.get("messages") or ())

    def langgraph(self, kind: str, view: dict[str, Any]) -> None:
        """``TurnCheckpointer``: a model's message is a step (its calls ``not_started``); a
        checkpoint that starts a tool node starts the last step's calls; a tool's answer
        completes its call."""
        for msg in view.get("messages") or ():
            if "ai" in msg:
                entry = self.framework_step(msg["ai"], None, msg.get("calls"))
                entry["node"] = view.get("node")
            elif "tool" in msg and (0, msg["tool"]) in self.calls:
                output = msg.get("output")
                error = (output if isinstance(output, str) else str(output)) if msg.get("error") else None
                self.calls[(0, msg["tool"])].update(state="completed", output=output, error=error)
        if kind == "lg_put" and view.get("tools") and self.last is not None:
            for call in self.last["calls"]:
                if call["state"] == "not_started":
                    call["state"] = "started"

    def pydantic_ai(self, messages: Any) -> None:
        """``durable``: each model response is a step (its tool calls); the ``started`` /
        ``completed`` records around each tool give its state, a tool's return in the next
        request completes a call those records did not."""
        for msg in messages:
            parts = msg.get("parts") or ()
            if msg.get("kind") == "response":
                text = "".join(p.get("content", "") for p in parts if p.get("part_kind") == "text")
                calls = [
                    (p.get("tool_call_id"), p.get("tool_name"), p.get("args"))
                    for p in parts
                    if p.get("part_kind") == "tool-call"
                ]
                self.framework_step(text, msg.get("finish_reason"), calls)
                continue
            for p in parts:
                call = self.calls.get((0, p.get("tool_call_id")))
                if call is None or call["state"] == "completed":
                    continue
                if p.get("part_kind") == "tool-return":
                    call.update(state="completed", output=p.get("content"), error=None)
                elif p.get("part_kind") == "retry-prompt":
                    call.update(state="completed", output=None, error=str(p.get("content")))
