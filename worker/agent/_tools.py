"""Tools the model may call: a name, a JSON Schema for the arguments, and a function.

The function gets the arguments as keyword arguments. An ``async def`` tool is cancelled
with the rest of its batch when the loop is cancelled; a plain ``def`` tool runs in a thread
and cannot be interrupted (the loop waits for it, and the pool's grace-then-kill is the bound). A
``worker.isolated`` tool, sync or async, is awaited in its own process: a cancel runs its ladder.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread

from .._isolated import Isolated
from ._messages import ToolSpec


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    # LOOP-UNKNOWN-CALL: a call that started in an attempt that crashed is run again (with the same
    # ``current_call().idempotency_key``) only when the tool says it is safe to.
    idempotent: bool = False

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def check_arguments(self, arguments: dict[str, Any]) -> str | None:
        """Why ``arguments`` do not fit the function's signature (a missing or an unknown
        parameter), or ``None``: the model's mistake, told to the model, not a tool failure."""
        try:
            signature = inspect.signature(self.fn)
        except (TypeError, ValueError):
            return None  # a callable without a readable signature: let the call tell
        try:
            signature.bind(**arguments)
        except TypeError as exc:
            return f"bad arguments for tool {self.name!r}: {exc}"
        return None

    async def __call__(self, arguments: dict[str, Any]) -> Any:
        if isinstance(self.fn, Isolated):
            # TOOL-TOLD: awaited, so the loop's cancel reaches the call's ladder (a thread would not).
            return await self.fn.acall(**arguments)
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**arguments)
        result = await anyio.to_thread.run_sync(functools.partial(self.fn, **arguments))
        if inspect.isawaitable(result):
            result = await result
        return result


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    idempotent: bool = False,
) -> Any:
    """``@tool`` / ``@tool(name=..., parameters=..., idempotent=True)``: a ``Tool`` from a
    function (its docstring is the default description). ``idempotent=True``: a call whose
    outcome a crash left unknown is run again on the turn's next attempt, with the same
    idempotency key (``worker.agent.current_call()``); otherwise it is never run twice."""
    if not isinstance(idempotent, bool):
        raise TypeError(f"idempotent must be True or False, got {idempotent!r}")

    def make(f: Callable[..., Any]) -> Tool:
        return Tool(
            name=name or f.__name__,
            fn=f,
            description=description if description is not None else inspect.getdoc(f) or "",
            parameters=parameters or {"type": "object", "properties": {}},
            idempotent=idempotent,
        )

    return make(fn) if fn is not None else make
