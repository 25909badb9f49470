"""The ACP agent: ACP sessions and prompts on top of turnpool sessions and turns.

``TurnpoolAgent`` implements the agent side of the Agent Client Protocol against a *backend*:
anything with ``submit(agent, input, session=...)`` returning a turn handle (``events()``,
``result()``, ``cancel()``) — the embedded ``Supervisor`` or a daemon ``Client``, which have the
same methods. The rules it keeps (docs/acp.md names them):

* an ACP session is a turnpool session (same id), so its prompts run one at a time, in order;
* a prompt is one turn; its input is ``{"text", "prompt", "session_id", "cwd"}`` (see ``turn_input``);
* the turn's events become ``session/update`` notifications (``_acp_events``), all sent before
  the prompt is answered;
* ``session/cancel`` cancels the session's prompts with cause ``user``; the cancelled prompt is
  answered ``cancelled`` once, after the turn is quiescent, however it ended — never an error
  first; unfinished tool calls are reported ended and marked cancelled;
* a turn ending ``aborted`` or ``killed`` because someone asked (cause ``user``, ``parent``,
  ``disposed``) answers ``cancelled``; ``failed`` and ``crashed``, and a turn turnpool stopped on
  its own account (cause ``deadline`` or ``memory``), answer a JSON-RPC error whose message names
  the outcome and cause; ``completed`` answers ``end_turn`` (or the ``stop_reason`` the agent returned).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any, Protocol

import acp
from acp.schema import AgentCapabilities, Implementation, PromptCapabilities

from wire import TurnResult

from .._errors import InvalidAgent
from .events import TurnEvents, stop_reason_of

log = logging.getLogger("turnpool.acp")

TURNPOOL_VERSION = "0.1.0"
# Causes of a stopped turn that answer ``cancelled``: someone asked (an ACP cancel, or
# ``turnpool cancel`` on the daemon), or the front end is shutting down. A turn stopped on
# turnpool's own account (deadline, memory) answers an error that names the cause instead.
CANCELLED_BY = frozenset({"user", "disposed", "parent"})


class _Handle(Protocol):
    turn_id: str

    def events(self) -> AsyncIterator[Any]: ...
    async def result(self) -> TurnResult: ...
    async def cancel(self, cause: Any = None) -> Any: ...


class Backend(Protocol):
    """What the ACP agent needs of a ``Supervisor`` or a ``Client``."""

    async def submit(
        self,
        agent: str,
        input: Any = None,
        *,
        session: str | None = None,
        grace: float | None = None,
        kill_after: float | None = None,
    ) -> _Handle: ...


class _Prompt:
    """One ``session/prompt`` in flight: its turn (once submitted) and whether ACP cancelled it."""

    __slots__ = ("cancelled", "ended", "handle")

    def __init__(self) -> None:
        self.handle: _Handle | None = None
        self.cancelled = False
        self.ended = False  # the turn's result is in: nothing left to stop


class _Session:
    __slots__ = ("cwd", "id", "prompts")

    def __init__(self, session_id: str, cwd: str) -> None:
        self.id = session_id
        self.cwd = cwd
        self.prompts: list[_Prompt] = []


def turn_input(session: _Session, blocks: list[Any]) -> dict[str, Any]:
    """The turn's input for a prompt: its text blocks joined by newlines (``text``), every
    content block as ACP JSON (``prompt``), the ACP ``session_id`` and the session's ``cwd``."""
    prompt = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in blocks]
    text = "\n".join(b["text"] for b in prompt if b.get("type") == "text" and isinstance(b.get("text"), str))
    return {"text": text, "prompt": prompt, "session_id": session.id, "cwd": session.cwd}


def _describe(result: TurnResult) -> str:
    if result.outcome in ("aborted", "killed"):
        kind = result.cause.kind if result.cause is not None else "unknown"
        return f"turn {result.turn_id} was stopped by turnpool (cause {kind}) and ended {result.outcome}"
    if result.outcome == "failed":
        err = result.error
        what = f"{err.type}: {err.message}" if err is not None else "the agent raised"
        return f"turn {result.turn_id} failed: {what}"
    if result.outcome == "crashed":
        code = result.exit_code
        how = (
            f"killed by signal {-code}"
            if code is not None and code < 0
            else f"exit code {code}"
            if code is not None
            else "exit status unknown"
        )
        return f"turn {result.turn_id} crashed: its worker (pid {result.worker_pid}) died on its own, {how}"
    return f"turn {result.turn_id} ended {result.outcome}"


def _meta(result: TurnResult) -> dict[str, Any]:
    return {
        "turnpool": {
            "turn_id": result.turn_id,
            "outcome": result.outcome,
            "worker_pid": result.worker_pid,
            "exit_code": result.exit_code,
            "cause": result.cause.kind if result.cause is not None else None,
        }
    }


class TurnpoolAgent:
    """An ACP ``Agent`` whose prompts are turnpool turns of ``agent`` run by ``backend``."""

    def __init__(
        self, backend: Backend, agent: str, *, grace: float | None = None, kill_after: float | None = None
    ) -> None:
        self._backend = backend
        self._agent = agent
        # Per-turn escalation times, passed only when set (else the backend's own apply).
        self._times = {k: v for k, v in (("grace", grace), ("kill_after", kill_after)) if v is not None}
        self._sessions: dict[str, _Session] = {}
        self._conn: Any = None
        # Cancels sent for prompts whose request was itself cancelled (the client went away):
        # the front end awaits them before it closes the backend.
        self.cleanup: set[asyncio.Task[Any]] = set()

    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    async def initialize(
        self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None, **kwargs: Any
    ) -> acp.InitializeResponse:
        return acp.InitializeResponse(
            protocol_version=min(protocol_version, acp.PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=False,
                prompt_capabilities=PromptCapabilities(image=False, audio=False, embedded_context=True),
            ),
            agent_info=Implementation(
                name="turnpool", title=f"turnpool ({self._agent})", version=TURNPOOL_VERSION
            ),
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> None:
        return None

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> acp.NewSessionResponse:
        session_id = f"acp-{secrets.token_hex(8)}"
        self._sessions[session_id] = _Session(session_id, cwd)
        return acp.NewSessionResponse(session_id=session_id)

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> acp.PromptResponse:
        session = self._sessions.get(session_id)
        if session is None:
            raise acp.RequestError.invalid_params({"sessionId": session_id, "reason": "unknown session"})
        pending = _Prompt()
        session.prompts.append(pending)
        try:
            return await self._run_prompt(session, pending, prompt)
        except BaseException:
            # The request itself was cancelled (client gone) or sending failed: stop the turn.
            if pending.handle is not None and not pending.ended:
                pending.cancelled = True
                task = asyncio.ensure_future(pending.handle.cancel())
                self.cleanup.add(task)
                task.add_done_callback(self.cleanup.discard)
            raise
        finally:
            session.prompts.remove(pending)

    async def _run_prompt(self, session: _Session, pending: _Prompt, blocks: list[Any]) -> acp.PromptResponse:
        try:
            handle = await self._backend.submit(
                self._agent, turn_input(session, blocks), session=session.id, **self._times
            )
        except InvalidAgent as exc:  # ADAPT-PROBE: the daemon's probe refused the agent name
            raise acp.RequestError(
                -32602, f"InvalidAgent: {exc}", {"agent": self._agent, "error": "InvalidAgent"}
            ) from None
        pending.handle = handle
        if pending.cancelled:  # session/cancel arrived while the turn was being submitted
            await handle.cancel()
        events = TurnEvents()
        async for event in handle.events():
            update = events.update(event)
            if update is not None:
                await self._send(session.id, update)
        result = await handle.result()  # returns once the turn is quiescent
        pending.ended = True
        stopped = result.outcome in ("aborted", "killed")
        if pending.cancelled or (stopped and result.cause is not None and result.cause.kind in CANCELLED_BY):
            for update in events.close_open_tools(cancelled=True, reason="cancelled"):
                await self._send(session.id, update)
            return acp.PromptResponse(stop_reason="cancelled", field_meta=_meta(result))
        if result.outcome == "completed":
            # A framework agent streams its text as deltas and returns the same text: sent once.
            if isinstance(result.output, str) and result.output and result.output != events.text:
                await self._send(session.id, acp.update_agent_message_text(result.output))
            for update in events.close_open_tools(cancelled=False, reason="the turn ended"):
                await self._send(session.id, update)
            return acp.PromptResponse(stop_reason=stop_reason_of(result.output), field_meta=_meta(result))
        message = _describe(result)
        for update in events.close_open_tools(cancelled=False, reason=message):
            await self._send(session.id, update)
        raise acp.RequestError(-32603, message, _meta(result)["turnpool"])

    async def _send(self, session_id: str, update: Any) -> None:
        await self._conn.session_update(session_id=session_id, update=update)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        """``session/cancel``: cause ``user`` for every prompt of the session; harmless when idle."""
        session = self._sessions.get(session_id)
        if session is None:
            return
        for pending in list(session.prompts):
            if pending.cancelled:
                continue
            pending.cancelled = True
            if pending.handle is not None and not pending.ended:
                await pending.handle.cancel()
