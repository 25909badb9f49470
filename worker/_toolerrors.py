"""What an isolated tool call (``worker.isolated``, ``worker.run_command``) reports when it did not
simply return: the errors it raises and the result of a command."""

from __future__ import annotations

import sys
from typing import Any, Literal

import msgspec

from ._errors import WorkerError

KillReason = Literal["memory", "timeout", "cpu", "pids", "output", "cancelled"]

_UNITS = {"memory": "MiB", "pids": "processes", "output": "MiB", "cpu": "CPU seconds", "timeout": "s"}


class ToolIsolationError(WorkerError):
    """Base of the errors of a tool call run in its own process: the call did not return."""


class ToolKilled(ToolIsolationError):
    """The call was stopped: ``reason`` is what tripped (``memory``, ``timeout``, ``cpu``, ``pids``,
    ``output``, ``cancelled``), ``limit`` the figure it was held to (MiB, seconds, processes;
    ``None`` for ``cancelled``), ``signal`` the last signal the call's process got from its ladder
    (``None`` when it stopped at the cooperative step)."""

    def __init__(self, reason: KillReason, limit: float | None = None, *, signal: int | None = None) -> None:
        self.reason = reason
        self.limit = limit
        self.signal = signal
        if reason == "cancelled":
            text = "tool killed: cancelled"
        elif reason == "timeout":
            text = f"tool killed: timeout of {limit:g} s reached"
        else:
            shown = f"{limit:g}" if limit is not None else "?"
            text = f"tool killed: {reason} limit {shown} {_UNITS[reason]} reached"
        super().__init__(text)

    def __reduce__(self) -> Any:
        return (_killed, (self.reason, self.limit, self.signal))


def _killed(reason: KillReason, limit: float | None, signal: int | None) -> ToolKilled:
    return ToolKilled(reason, limit, signal=signal)


class ToolCrashed(ToolIsolationError):
    """The call's process died on its own before returning: ``exit_code`` (a normal exit) or
    ``signal`` (the signal that ended it) is set."""

    def __init__(self, exit_code: int | None = None, signal: int | None = None) -> None:
        self.exit_code = exit_code
        self.signal = signal
        how = f"signal {signal}" if signal is not None else f"exit code {exit_code}"
        super().__init__(f"tool crashed: its process died ({how}) before returning")


class CommandResult(msgspec.Struct, frozen=True):
    """What ``worker.run_command`` returns. ``returncode`` is negative when a signal ended the
    command (as in ``subprocess``); ``truncated`` says output past ``output_mb`` was dropped;
    ``killed_reason`` says why the ladder stopped it (``None``: it exited by itself)."""

    returncode: int
    stdout: bytes
    stderr: bytes
    truncated: bool = False
    killed_reason: KillReason | None = None


_FLAVOURED: dict[tuple[type, ...], Any] = {}


def _framework_bases() -> list[type]:
    """The failed-tool exceptions of the tool frameworks loaded in this process."""
    found = []
    pydantic_ai = sys.modules.get("pydantic_ai.exceptions")
    base = getattr(pydantic_ai, "ToolFailed", None) or getattr(pydantic_ai, "ModelRetry", None)
    if isinstance(base, type):
        found.append(base)
    # An MCP server written with the mcp package (2.x MCPServer, 1.x FastMCP) or fastmcp shows a
    # ToolError's text to the client; any other exception's text stays on the server.
    for name in _MCP_SERVER_ERRORS:
        base = getattr(sys.modules.get(name), "ToolError", None)
        if isinstance(base, type):
            found.append(base)
    return found


_MCP_SERVER_ERRORS = (
    "mcp.server.mcpserver.exceptions",
    "mcp.server.fastmcp.exceptions",
    "fastmcp.exceptions",
)


def for_frameworks(exc: ToolIsolationError) -> ToolIsolationError:
    """TOOL-FRAMEWORK-ERROR: the error as the tool framework loaded in this process reports a failed tool to
    its model. Where pydantic-ai is imported, the same error is also its ``ToolFailed`` (or, in versions
    without it, ``ModelRetry``): raised from a pydantic-ai tool, the model sees the text and the run goes on.
    Where an MCP server of the ``mcp`` package runs, it is also that package's ``ToolError``: the client
    (and its model) is told the text rather than a generic failure. ``except worker.ToolKilled`` catches
    it all the same."""
    bases = tuple(b for b in _framework_bases() if not isinstance(exc, b))
    if not bases:
        return exc
    key = (type(exc), *bases)
    cls = _FLAVOURED.get(key)
    if cls is None:
        cls = type(type(exc).__name__, (type(exc), *bases), {"__module__": type(exc).__module__})
        cls.__qualname__ = type(exc).__qualname__
        _FLAVOURED[key] = cls
    out: Any = Exception.__new__(cls)
    out.__dict__.update(exc.__dict__)
    out.args = exc.args
    out.message = str(exc)
    flavoured: ToolIsolationError = out
    return flavoured
