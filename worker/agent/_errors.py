"""The agent loop's errors: one base, one class per way a run can be interrupted.

Every error here ends a ``run()`` / ``resume()`` *after* the loop has closed its timeline's
current block, set ``last_run_interrupted`` and run the ``on_abort`` hooks with ``reason``.
"""

from __future__ import annotations

from collections.abc import Sequence

from wire import Cause

from .._errors import TurnCancelled, WorkerError


class AgentLoopError(WorkerError):
    """Base of the errors raised by ``AgentLoop.run()`` and ``AgentLoop.resume()``."""

    @property
    def reason(self) -> str:
        """What the ``on_abort`` hooks are told."""
        return str(self)


class Cancelled(AgentLoopError, TurnCancelled):
    """Raised by ``run()`` / ``resume()`` when a cancel (``cancel()``, a ``CancelSender``, a
    channel whose every sender is gone, or the bound turn's signal) is seen at a detection point.

    A subclass of ``worker.TurnCancelled``: an agent that lets it propagate ends its turn
    ``aborted``. ``cause`` is the bound turn's cause, or ``None`` for a local cancel.
    """

    def __init__(self, cause: Cause | None = None) -> None:
        Exception.__init__(self, "Cancelled")
        self.cause = cause

    @property
    def reason(self) -> str:
        return "Cancelled"


class Aborted(AgentLoopError):
    """Raised by ``run()`` / ``resume()`` when a hook answered ``Abort(reason)``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self._reason = reason

    @property
    def reason(self) -> str:
        return self._reason


class ClientError(AgentLoopError):
    """Raised by ``run()`` / ``resume()`` when the model client failed to open the stream or
    failed while streaming (the client's own exception is the ``__cause__``)."""


class ToolError(AgentLoopError):
    """Raised by ``run()`` / ``resume()`` when a tool raised, or when the model made more than
    ``max_tool_errors`` calls in one run that no tool could take (an unknown tool, arguments that
    are not JSON or do not fit the tool's signature: each of those is first answered to the
    model as the call's output, ``{"error": ...}``). ``name`` and ``call_id`` say which call; the
    tool's exception is the ``__cause__``."""

    def __init__(self, message: str, *, name: str, call_id: str) -> None:
        super().__init__(message)
        self.name = name
        self.call_id = call_id


class MaxStepsExceeded(AgentLoopError):
    """Raised by ``run()`` / ``resume()`` when the model was asked ``max_steps`` times in one run
    without finishing (a model that loops on tool calls ends the turn ``failed``, not never)."""

    def __init__(self, max_steps: int) -> None:
        super().__init__(
            f"the model was asked {max_steps} times in this run without finishing (AgentLoop max_steps)"
        )
        self.max_steps = max_steps


class HookError(AgentLoopError):
    """Raised by ``run()`` / ``resume()`` when a hook raised. ``phase`` is the hook method
    (``before_step``, ``on_event``, ``after_tool_results``, ``on_abort``)."""

    def __init__(self, message: str, *, phase: str) -> None:
        super().__init__(message)
        self.phase = phase


class ConfigWarnings(AgentLoopError):
    """Raised by ``run()`` / ``resume()`` when the loop's ``settings`` hold options the model
    client does not support; ``warnings`` lists them."""

    def __init__(self, warnings: Sequence[str]) -> None:
        self.warnings = tuple(warnings)
        super().__init__("; ".join(self.warnings))


class UnknownToolOutcome(AgentLoopError):
    """Raised by ``run()`` / ``resume()`` of a loop made with ``on_unknown_outcome="fail"`` when the
    turn is resumed after a crash and a tool call had started but not completed (LOOP-UNKNOWN-CALL): it
    may or may not have taken effect, and the tool is not ``idempotent``. ``name`` and ``call_id``
    say which call; the turn ends ``failed``."""

    def __init__(self, *, name: str, call_id: str, step: int) -> None:
        super().__init__(
            f"tool call {call_id!r} ({name!r}, step {step}) started in an earlier attempt of this "
            "turn that crashed before it completed: its outcome is unknown, and the tool is not "
            "idempotent, so it is not run again"
        )
        self.name = name
        self.call_id = call_id
        self.step = step


class StepRecordError(AgentLoopError):
    """Raised by ``run()`` / ``resume()`` when the turn's step records cannot be used: a record
    that cannot be read or belongs to another turn or run (refused at resume: the loop never
    runs blind), a turn that cannot be resumed past a step whose record was too large, or the
    supervisor could not make a record durable (LOOP-STEP-CORRUPT)."""
