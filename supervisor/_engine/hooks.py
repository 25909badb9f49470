"""The hooks front ends register (``Supervisor.add_hooks``), called on the event loop in
registration order: a turn accepted (``admission.py``), started (``dispatch.py``), an event
(``Supervisor._on_event``), a step of its escalation ladder (``escalation.py``: ``abort``, ``sigterm``,
``sigkill``) and its result delivered (``ending.py``). A hook must not block."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from wire import TurnResult

if TYPE_CHECKING:
    from .turns import TurnRecord

AcceptHook = Callable[["TurnRecord"], None]
StartHook = Callable[["TurnRecord", int], None]
EventHook = Callable[["TurnRecord", msgspec.Raw], None]
ResultHook = Callable[["TurnRecord", TurnResult], None]
StepHook = Callable[["TurnRecord", str], None]


class Hooks:
    """The registered callbacks, one list per moment of a turn."""

    __slots__ = ("accept", "event", "result", "start", "step")

    def __init__(self) -> None:
        self.accept: list[AcceptHook] = []
        self.start: list[StartHook] = []
        self.event: list[EventHook] = []
        self.result: list[ResultHook] = []
        self.step: list[StepHook] = []

    def stepped(self, turn: TurnRecord, step: str) -> None:
        for hook in self.step:
            hook(turn, step)
