"""Admission: how a turn gets into the supervisor.

``Admission.accept`` is the one way in for every turn: ``submit``, a daemon's already-encoded input
(``accept_encoded``), a journal's readmitted turn (JOURNAL-RECOVERY: ``max_queue`` does not apply) and a child
spawned by a running turn. It validates the turn's arguments at the call (``InvalidAgent``,
``TypeError``, ``ValueError``; a grace above ``max_grace`` is refused, R-GRACE), refuses when the
supervisor is not running (``SupervisorClosed``) or the queue is full (``QueueFull``), returns the
existing record for a known ``turn_id`` with the same request (a submit is idempotent: never runs
twice; another agent, input or session under that id is ``TurnIdConflict``, API-TURN-ID), and otherwise
creates the turn's record - its one cancellation holder (TURN-HOLDER) - runs the accept hooks and queues
it. With a journal (JOURNAL-GATE) a new turn is held back from dispatch until its accept row is committed.

Its collaborators: the ``TurnBook`` (table, queue, counters, phase), the ``EngineOptions``, the hooks
(``accept``), the ``Dispatcher`` (its gate; a pump for a turn that may go now), the timers (their
clock), the prefix of generated ids and ``zygote``, where the agent probe forks from.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from .._checks import check_agent, check_grace, check_optional_str, check_seconds
from .._errors import InvalidAgent, QueueFull, SupervisorClosed, TurnIdConflict
from .._handle import TurnHandle
from .._many import ManyTurns
from .._tracing import caller_trace
from .probe import AgentKinds
from .states import gate_hold
from .turns import TurnRecord, request_differs

if TYPE_CHECKING:
    from .book import TurnBook
    from .dispatch import Dispatcher
    from .hooks import Hooks
    from .settings import EngineOptions
    from .timers import Timers
    from .zygote import Zygote


class AcceptMany(ManyTurns):
    """The embedded pool's ``submit_many``: every input is checked first (``ManyTurns``), then each
    is accepted as ``submit`` accepts one, from the encoding the check already made."""

    _admission: Admission

    async def _submit_checked(
        self, agent: str, item: Any, raw: Any, turn_id: str | None, options: dict[str, Any]
    ) -> TurnHandle:
        admission = self._admission
        if type(agent) is str and agent not in admission.agents.kinds:  # ADAPT-PROBE: the first asks
            await admission.learn(agent)
        turn = admission.accept(agent, raw, turn_id=turn_id, parent=None, **options)
        backend: Any = self  # a Supervisor
        return TurnHandle(backend, turn.id, pin=turn)  # API-HANDLE-KEEPS: the handle holds the record


class Admission:
    """Accepts turns; see the module docstring."""

    def __init__(
        self,
        book: TurnBook,
        options: EngineOptions,
        hooks: Hooks,
        dispatcher: Dispatcher,
        timers: Timers,
        prefix: str,
        zygote: Callable[[], Zygote | None],
    ) -> None:
        self.book = book
        self.options = options
        self.hooks = hooks
        self.dispatcher = dispatcher
        self.timers = timers
        self.prefix = prefix
        self.ids = itertools.count(1)  # generated turn ids: ``<prefix>-<n>``
        self.agents = AgentKinds(zygote)  # ``kinds``: agent -> InvalidAgent's message, or None (accepted)

    async def learn(self, agent: Any) -> None:
        """ADAPT-PROBE: before the first turn of an agent name not known yet is accepted, ask a probe
        what it points at (bounded; see ``probe``), so that ``accept`` can refuse what no worker
        can run. A name that is no agent name at all is left to ``accept`` to refuse."""
        if type(agent) is str and agent not in self.agents.kinds and self.book.phase == "running":
            try:
                check_agent(agent)
            except InvalidAgent:
                return
            allowed = self.options.allow_agents
            if allowed is not None and not allowed.allows(agent):
                return  # SEC-ALLOW: a refused name is never imported, not even by a probe
            await self.agents.learn(agent)

    def accept(
        self,
        agent: str,
        raw: msgspec.Raw,
        *,
        session: str | None,
        timeout: float | None,
        grace: float | None,
        kill_after: float | None,
        turn_id: str | None,
        parent: str | None,
        retry: bool = False,
        attempts: int = 1,
        readmit: bool = False,
    ) -> TurnRecord:
        """Validate a turn's arguments, refuse it (closed, queue full) or return the known record
        for its id, else record it and queue it."""
        book = self.book
        options = self.options
        if not isinstance(retry, bool):
            raise TypeError(f"retry must be True or False, got {retry!r}")
        check_agent(agent)
        if options.allow_agents is not None:
            options.allow_agents.check(agent)  # SEC-ALLOW: submits, spawned children and readmits alike
        refusal = self.agents.kinds.get(agent)  # ADAPT-PROBE: what the probe of this name answered
        if refusal is not None and not readmit:
            raise InvalidAgent(refusal)
        if not readmit:  # LINK-TURN-ID; a readmitted turn was acknowledged under the rule of its day
            session = check_optional_str("session", session)
            turn_id = check_optional_str("turn_id", turn_id)
        timeout = check_seconds("timeout", timeout, positive=True)
        grace = check_grace("grace", check_seconds("grace", grace), options.max_grace)
        kill_after = check_grace("kill_after", check_seconds("kill_after", kill_after), options.max_grace)
        if book.phase != "running":
            closing = book.phase == "closing"
            raise SupervisorClosed(
                "the supervisor is shutting down" if closing else "the supervisor is not running"
            )
        if turn_id is not None:
            known = book.table.find(turn_id)  # kept, or held by a handle (API-HANDLE-KEEPS)
            if known is not None:
                # API-TURN-ID: idempotent for the same request only; another one under this id is refused.
                differs = request_differs(known, agent, raw, session)
                if differs:
                    raise TurnIdConflict(turn_id, differs)
                return known
        if not readmit and book.queued() >= options.max_queue:
            raise QueueFull(f"the queue already holds {options.max_queue} turns")
        size = len(raw)
        if not readmit and book.input_bytes + size > options.max_input_bytes:
            _refuse_input(size, book.input_bytes, options.max_input_bytes)
        chosen = turn_id is not None
        if turn_id is None:
            turn_id = f"{self.prefix}-{next(self.ids)}"
        # TURN-HOLDER: the turn's one cancellation holder, new for every accepted turn.
        turn = TurnRecord(
            turn_id=turn_id,
            agent=agent,
            input=raw,
            session=session,
            parent=parent,
            timeout=timeout if timeout is not None else options.timeout,
            grace=grace if grace is not None else options.grace,
            kill_after=kill_after if kill_after is not None else options.kill_after,
            now=self.timers.clock(),
        )
        turn.retry = retry
        turn.attempts = attempts
        # OBS-TRACE: the caller's trace context (a child turn: its parent's), the turn span's once an
        # accept hook of ``TurnSpans`` has opened it.
        records = book.table.records
        parent_turn = records.get(parent) if parent is not None else None
        turn.trace = parent_turn.trace if parent_turn is not None else caller_trace()
        turn.id_chosen = chosen
        if self.dispatcher.gate is not None:
            gate_hold(turn, readmit)  # a readmitted turn's row is already in the journal
        records[turn_id] = turn
        book.active += 1
        book.input_bytes += size  # MEM-INPUTS: until its result is delivered (``Finisher.deliver``)
        for accept_hook in self.hooks.accept:
            accept_hook(turn)
        book.queue.push(turn)
        if turn.written:
            # JOURNAL-GATE-RESUME, JOURNAL-GATE-SHARE: behind the dispatch gate a new turn cannot be cleared
            # before its accept row is written (``mark_written`` pumps then; an accept hook that writes it
            # calls that before the turn is queued, so the pump is here): a pump per accept walked the gate
            # for nothing. Without a gate every turn is written from the start.
            self.dispatcher.pump()
        return turn


def _refuse_input(size: int, held: int, most: int) -> None:
    """MEM-INPUTS: an input that can never fit is bad input (``ValueError``); one that does not fit
    now waits for turns to end (``QueueFull``, which ``turnpool batch`` retries)."""
    mib = 2**20
    if size > most:
        raise ValueError(
            f"the input is {size / mib:.1f} MiB; this supervisor's max_input_mb is {most / mib:g}"
        )
    raise QueueFull(
        f"the turns not ended yet hold {held / mib:.1f} MiB of inputs; this one ({size / mib:.1f} MiB) "
        f"would pass max_input_mb ({most / mib:g})"
    )
