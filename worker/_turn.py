"""The agent-author API: ``Turn`` and its ``CancelSignal``."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

import wire
from wire import Cause, TurnResult

from ._errors import TurnCancelled
from ._steps import StepLog

if TYPE_CHECKING:
    from ._connection import Connection

# EVENTS-EMIT-NOW: ``emit`` gives the event loop a turn when this long has passed since the loop last
# turned, not on every call: a shielded checkpoint costs ≈ 4 µs (and a loop iteration), more
# than sending the event itself. A turn that awaited something between two emits (a model
# streaming deltas) has let the loop turn already and never pays it. What the loop must not
# miss is handled without it: an ``Abort`` that arrives while a turn streams is read right after
# the send (``Connection.emit``).
EMIT_YIELD_INTERVAL = 0.001


class CancelSignal:
    """One turn's cancellation signal: set once, by the supervisor's ``Abort``, with its cause.

    ``cancelled`` is the request; whether the agent honoured it is the turn's outcome.
    A new turn always gets a new signal, so a stale abort can never reach a later turn.
    """

    __slots__ = ("_callbacks", "_cause", "_event", "_thread_event")

    def __init__(self) -> None:
        self._cause: Cause | None = None
        self._event: anyio.Event | None = None
        self._thread_event: threading.Event | None = None
        self._callbacks: list[Any] = []

    @property
    def cancelled(self) -> bool:
        return self._cause is not None

    @property
    def cause(self) -> Cause | None:
        return self._cause

    async def wait(self) -> Cause:
        """Wait until the turn is cancelled; returns the cause."""
        if self._cause is None:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        assert self._cause is not None
        return self._cause

    def wait_sync(self, timeout: float | None = None) -> bool:
        """For plain ``def`` agents running in a thread: block until cancelled or timeout."""
        if self._cause is not None:
            return True
        if self._thread_event is None:
            self._thread_event = threading.Event()
            if self._cause is not None:
                return True
        return self._thread_event.wait(timeout)

    def raise_if_cancelled(self) -> None:
        if self._cause is not None:
            raise TurnCancelled(self._cause)

    def add_callback(self, fn: Any) -> None:
        """Call ``fn(cause)`` (in the worker's event loop) when the signal is set."""
        if self._cause is not None:
            fn(self._cause)
        else:
            self._callbacks.append(fn)

    def _set(self, cause: Cause) -> bool:
        """First cause wins; returns whether this call set it."""
        if self._cause is not None:
            return False
        self._cause = cause
        if self._event is not None:
            self._event.set()
        if self._thread_event is not None:
            self._thread_event.set()
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(cause)
        return True


class Turn:
    """What an agent gets: ``async def agent(turn: worker.Turn) -> output``.

    ``id``, ``input``, ``session``, ``parent``; ``signal`` (this turn's cancellation);
    ``emit`` streams an event to whoever follows the turn; ``checkpoint`` raises
    :class:`TurnCancelled` once cancelled; ``spawn`` runs a child turn in another worker.
    ``attempt`` is 1, or more for a ``retry=True`` turn run again after its worker died (LOOP-RESUME).
    """

    __slots__ = (
        "_conn",
        "_recorded",
        "_steplog",
        "_yielded_at",
        "attempt",
        "id",
        "input",
        "parent",
        "session",
        "signal",
    )  # fmt: skip

    def __init__(
        self,
        turn_id: str,
        input: Any,
        session: str | None,
        parent: str | None,
        conn: Connection,
        attempt: int = 1,
        recorded: Any = wire.NIL,
    ) -> None:
        self.id = turn_id
        self.input = input
        self.session = session
        self.parent = parent
        self.signal = CancelSignal()
        self.attempt = attempt
        self._conn = conn
        self._yielded_at = 0.0  # when the event loop was last seen to turn by ``emit`` (EVENTS-EMIT-NOW)
        self._recorded = recorded  # LOOP-RESUME: the earlier attempts' step records (``Run.steps``)
        self._steplog: StepLog | None = None

    def _steps(self) -> StepLog:
        """The turn's step log (``worker.agent`` records through it), made on first use."""
        log = self._steplog
        if log is None:
            log = self._steplog = StepLog(self.id, self.attempt, self._recorded, self._conn)
        return log

    # EVENTS-ON-WIRE: an emitted event is on the wire when emit returns.
    async def emit(self, event: Any) -> None:
        """Stream ``event`` (anything msgspec encodes). On return it is on the wire.

        It is not where a cancellation lands: a turn cancelled just after emitting sees it at its
        next await (the cancel scope stays cancelled); an ``Abort`` that came in meanwhile is
        read right after the send, so ``turn.signal`` already shows it. It yields to the event
        loop at least once a millisecond (EVENTS-EMIT-NOW), so a turn that does nothing but emit still
        lets the worker's other tasks (and the agent's own) run, without paying a loop
        iteration per event."""
        turned = self._conn.emit(self.id, event)
        now = time.monotonic()
        if turned:
            self._yielded_at = now  # the loop turned since the previous emit: no yield owed
        elif now - self._yielded_at >= EMIT_YIELD_INTERVAL:
            self._yielded_at = now
            await anyio.lowlevel.cancel_shielded_checkpoint()

    def emit_sync(self, event: Any) -> None:
        """``emit`` for plain ``def`` agents running in a worker thread."""
        anyio.from_thread.run_sync(self._conn.emit, self.id, event)

    async def checkpoint(self) -> None:
        """Yield to the event loop; raise :class:`TurnCancelled` if the turn was cancelled."""
        await anyio.lowlevel.checkpoint()
        self.signal.raise_if_cancelled()

    async def spawn(
        self,
        agent: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - public API (SPEC): the child turn's deadline
        grace: float | None = None,
        kill_after: float | None = None,
    ) -> TurnResult:
        """Run a child turn in another worker and return its ``TurnResult``.

        The child is cancelled with cause ``parent`` if this turn is cancelled, or if this
        await is cancelled. Raises :class:`worker.SpawnError` if the supervisor refuses it.
        """
        return await self._conn.spawn(self.id, agent, input, session, timeout, grace, kill_after)

    def __repr__(self) -> str:
        return f"Turn(id={self.id!r}, session={self.session!r})"
