"""Errors an agent sees."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wire import Cause


class WorkerError(Exception):
    """Base of the worker package's errors."""


class TurnCancelled(WorkerError):
    """Raised by ``Turn.checkpoint()`` (and ``Turn.signal.raise_if_cancelled()``) once the turn
    has been cancelled. Letting it propagate ends the turn ``aborted``."""

    def __init__(self, cause: Cause | None) -> None:
        super().__init__(f"turn cancelled ({cause.kind if cause else 'unknown'})")
        self.cause = cause


class SpawnError(WorkerError):
    """Raised by ``Turn.spawn()`` when the supervisor refused to start the child turn."""
