"""``TurnCheckpointer``: a LangGraph ``BaseCheckpointSaver`` backed by turnpool's step records.

Compile a graph with ``checkpointer=TurnCheckpointer()`` and run it as a turn (the LangGraph
adapter): every checkpoint and every task's writes LangGraph saves are recorded durably through the
supervisor (a daemon: its journal), each acknowledged before LangGraph goes on (LOOP-STEP-DURABLE). When
the turn, submitted with ``retry=True``, runs again after its worker died, the adapter loads the
records back and resumes the graph from its last checkpoint (``astream(None, config)``): a node
whose writes were recorded does not run again.

Tool nodes follow the rule of ``worker.agent`` (LOOP-UNKNOWN-CALL): a task of a node named in
``tool_nodes`` (default: ``"tools"``, the prebuilt ``ToolNode``'s name) that the last checkpoint
started and whose writes were not recorded is run again only if its node is in
``idempotent_nodes``; otherwise ``on_unknown_outcome="tell_model"`` answers each of its tool calls
with a ``ToolMessage`` error saying the outcome is unknown, and ``"fail"`` ends the turn with
``UnknownToolOutcome``. LangGraph starts a step's tasks right after saving the checkpoint before
them, so a crash between the two is also reported as unknown: never run twice, at worst reported
although it had not run.

Outside a turn (a graph run directly) it is a plain in-memory checkpointer. The records' kinds
are ``lg_put`` and ``lg_writes``; the thread is the config's ``thread_id``, else the turn's id.
Beside LangGraph's own serialized data, each record carries a plain ``view`` an operator's tools
read without LangGraph (LOOP-STEP-INSPECT): a task's writes name its node and the messages it wrote (a
model's text and tool calls, a tool's answer), a checkpoint the nodes it starts and whether a tool
node is among them (its calls have then started).
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

from .._steps import StepLog, StepRefused
from .._turn import Turn
from ..agent._errors import StepRecordError, UnknownToolOutcome
from ..agent._steps import ON_UNKNOWN_OUTCOME
from ._langgraph import jsonable

__all__ = ["TurnCheckpointer"]

_TURN: contextvars.ContextVar[Turn | None] = contextvars.ContextVar("turnpool_lg_turn", default=None)


def unknown_text(call_id: str, name: str) -> str:
    return (
        f"the outcome of tool call {call_id!r} ({name!r}) is unknown: it started in an earlier attempt "
        "of this turn that crashed before it completed. It may have taken effect; do not assume it "
        "failed, and do not repeat it without checking."
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else ()
    return "".join(
        b if isinstance(b, str) else str(b.get("text", "")) for b in parts if isinstance(b, (str, dict))
    )


def _messages_view(messages: Any) -> list[dict[str, Any]]:
    """LOOP-STEP-INSPECT: a model's messages (text, tool calls) and tools' answers, plain."""
    out: list[dict[str, Any]] = []
    for msg in messages if isinstance(messages, list) else [messages]:
        kind = getattr(msg, "type", None)
        if kind == "ai":
            calls = [[c.get("id"), c.get("name"), jsonable(c.get("args"))] for c in msg.tool_calls]
            out.append({"ai": _text(msg.content), "calls": calls})
        elif kind == "tool":
            error = getattr(msg, "status", None) == "error"
            out.append({"tool": msg.tool_call_id, "output": jsonable(msg.content), "error": error})
    return out


def _node(task_path: str) -> str:
    """The node of a task path (``~__pregel_pull, tools``: ``tools``)."""
    return task_path.rsplit(", ", 1)[-1] if task_path.startswith("~__pregel_pull") else task_path


def _keys(config: Any) -> dict[str, Any]:
    """What of a run's config a checkpoint is stored under (the rest holds callbacks and the like)."""
    configurable = config.get("configurable", {})
    keys = ("thread_id", "checkpoint_ns", "checkpoint_id")
    return {"configurable": {k: configurable[k] for k in keys if k in configurable}}


class TurnCheckpointer(InMemorySaver):
    """See the module docstring."""

    def __init__(
        self,
        *,
        tool_nodes: Sequence[str] = ("tools",),
        idempotent_nodes: Sequence[str] = (),
        on_unknown_outcome: str = "tell_model",
    ) -> None:
        if on_unknown_outcome not in ON_UNKNOWN_OUTCOME:
            raise ValueError(f"on_unknown_outcome must be 'tell_model' or 'fail', got {on_unknown_outcome!r}")
        super().__init__()
        self.tool_nodes = frozenset(tool_nodes)
        self.idempotent_nodes = frozenset(idempotent_nodes)
        self.on_unknown_outcome = on_unknown_outcome
        self._log: StepLog | None = None
        self._n = 0
        self._told: list[dict[str, Any]] = []  # the answers ``settle`` gave, for the next checkpoint's view

    # ---- a turn's records -----------------------------------------------------------------

    def begin(self, turn: Turn) -> tuple[contextvars.Token[Turn | None], bool]:
        """The adapter, as the turn starts: forget earlier turns, load this turn's records (a later
        attempt's); whether there is a checkpoint to resume from. Raises ``StepRecordError``."""
        self.storage.clear()
        self.writes.clear()
        self.blobs.clear()
        log = self._log = turn._steps()
        if log.corrupt is not None:
            raise StepRecordError(log.corrupt)
        self._n = 0
        self._told = []
        resumed = False
        for record in log.recorded:
            if not isinstance(record, dict) or record.get("turn") != turn.id or "data" not in record:
                raise StepRecordError(
                    f"a step record of turn {turn.id!r} is not a LangGraph checkpoint: refused"
                )
            try:
                args = self.serde.loads_typed(tuple(record["data"]))
            except Exception as exc:  # noqa: BLE001 - whatever the serializer says: refused
                raise StepRecordError(
                    f"a checkpoint record of turn {turn.id!r} cannot be read: {exc}"
                ) from None
            if record.get("k") == "lg_put":
                InMemorySaver.put(self, *args)
                resumed = True
            elif record.get("k") == "lg_writes":
                InMemorySaver.put_writes(self, *args)
            self._n += 1
        return _TURN.set(turn), resumed

    def end(self, token: contextvars.Token[Turn | None]) -> None:
        _TURN.reset(token)
        self._log = None

    async def _record(self, kind: str, args: tuple[Any, ...], view: dict[str, Any]) -> None:
        log = self._log
        turn = _TURN.get()
        if log is None or turn is None:
            return
        data = list(self.serde.dumps_typed(args))
        record = {"v": 1, "turn": turn.id, "loop": 0, "k": kind, "step": self._n, "data": data, "view": view}
        seq = log.record(self._n, kind, record)
        self._n += 1
        try:
            await log.durable(seq)
        except StepRefused as exc:
            raise StepRecordError(f"a checkpoint could not be made durable: {exc}") from None

    # ---- BaseCheckpointSaver ---------------------------------------------------------------

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        prefix = "branch:to:"
        starts = sorted(
            c[len(prefix) :] for c in checkpoint.get("channel_values", {}) if c.startswith(prefix)
        )
        view: dict[str, Any] = {"next": starts, "tools": any(n in self.tool_nodes for n in starts)}
        if self._told:
            view["messages"], self._told = self._told, []
        await self._record("lg_put", (_keys(config), checkpoint, metadata, new_versions), view)
        return InMemorySaver.put(self, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        messages = [m for channel, value in writes if channel == "messages" for m in _messages_view(value)]
        view = {"node": _node(task_path), "messages": messages}
        await self._record("lg_writes", (_keys(config), list(writes), task_id, task_path), view)
        InMemorySaver.put_writes(self, config, writes, task_id, task_path)

    # ---- LOOP-UNKNOWN-CALL for tool nodes ------------------------------------------------------------

    async def settle(self, graph: Any, config: Any) -> None:
        """Before resuming: a tool node's task the last checkpoint started without recorded writes
        runs again only if idempotent; else its calls are answered as unknown, or the turn fails."""
        from langchain_core.messages import ToolMessage

        state = await graph.aget_state(config)
        for task in state.tasks:
            if (
                task.name not in self.tool_nodes
                or task.name in self.idempotent_nodes
                or task.result is not None
            ):
                continue
            messages = state.values.get("messages", []) if isinstance(state.values, dict) else []
            calls = list(getattr(messages[-1], "tool_calls", None) or ()) if messages else []
            if self.on_unknown_outcome == "fail":
                first = calls[0] if calls else {"id": task.id, "name": task.name}
                raise UnknownToolOutcome(name=first["name"], call_id=first["id"], step=len(messages))
            answers = [
                ToolMessage(
                    content=unknown_text(c["id"], c["name"]),
                    tool_call_id=c["id"],
                    name=c["name"],
                    status="error",
                )
                for c in calls
            ]
            self._told = _messages_view(answers)  # LOOP-STEP-INSPECT: shown as the calls' outcome
            await graph.aupdate_state(config, {"messages": answers}, as_node=task.name)
