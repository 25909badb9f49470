"""Hooks: user code the loop calls at fixed points, and what it may answer.

A hook is an object with any of these methods (sync or async); ``Hook`` supplies no-op
defaults and ``hook(...)`` builds one from plain functions:

* ``before_step(step) -> action``        before each step (a model call, or a batch of tools);
* ``on_event(event) -> action``          on each streamed model event;
* ``after_tool_results(outputs) -> action`` after a batch of tools returned;
* ``on_abort(reason) -> None | str``     once per interrupted run; a returned ``str`` replaces
                                          the reason for the hooks after it (the Rust ``&mut String``).

An action is ``None``/``CONTINUE``, ``Pause(reason)`` (the run returns ``Paused``; ``resume()``
goes on) or ``Abort(reason)`` (the run raises ``Aborted(reason)``). Hooks run in order; the
first one that does not continue decides.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import msgspec

from ._messages import FunctionCall


class Continue(msgspec.Struct, frozen=True, tag="continue"):
    pass


class Pause(msgspec.Struct, frozen=True, tag="pause"):
    reason: str = "paused"


class Abort(msgspec.Struct, frozen=True, tag="abort"):
    reason: str = "aborted by hook"


CONTINUE = Continue()
Action = Continue | Pause | Abort


class Step(msgspec.Struct, frozen=True):
    """What ``before_step`` sees: the step's index in this run (0-based), the tool calls it
    will run (empty: it will call the model), and whether the run is a ``resume()``."""

    index: int
    pending: tuple[FunctionCall, ...]
    resumed: bool = False


class Hook:
    """Base with no-op defaults: override what you need."""

    def before_step(self, step: Step) -> Any:
        return None

    def on_event(self, event: Any) -> Any:
        return None

    def after_tool_results(self, outputs: Any) -> Any:
        return None

    def on_abort(self, reason: str) -> Any:
        return None


PHASES = ("before_step", "on_event", "after_tool_results", "on_abort")


class _FnHook(Hook):
    def __init__(self, fns: dict[str, Callable[..., Any]]) -> None:
        for name, fn in fns.items():
            setattr(self, name, fn)
        self._names = tuple(fns)

    def __repr__(self) -> str:
        return f"hook({', '.join(self._names)})"


def hook(
    *,
    before_step: Callable[[Step], Any] | None = None,
    on_event: Callable[[Any], Any] | None = None,
    after_tool_results: Callable[[Any], Any] | None = None,
    on_abort: Callable[[str], Any] | None = None,
) -> Hook:
    """A ``Hook`` from plain (sync or async) functions."""
    fns = {
        name: fn
        for name, fn in (
            ("before_step", before_step),
            ("on_event", on_event),
            ("after_tool_results", after_tool_results),
            ("on_abort", on_abort),
        )
        if fn is not None
    }
    return _FnHook(fns)


async def call_maybe_async(fn: Callable[..., Any], *args: Any) -> Any:
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def as_action(value: Any, phase: str) -> Action:
    if value is None:
        return CONTINUE
    if isinstance(value, (Continue, Pause, Abort)):
        return value
    raise TypeError(f"{phase} hook returned {value!r}; expected None, CONTINUE, Pause(...) or Abort(...)")
