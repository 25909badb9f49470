"""turnpool's supervisor side: the engine that runs turns in worker processes, and its front ends.

The map (each capability in a folder named for it; see docs/design.md, "Layout"):

* ``_engine/`` — the engine (private): ``Supervisor`` keeps the policy (accept, cancel, escalate,
  finish) and composes the worker link, the worker pool (and zygote), the dispatcher and the turn
  table. Never imports agent code; reaches the worker side only through ``worker.lowlevel`` and
  ``worker.proctree``.
* ``_backend`` — the ``Backend`` contract every front end is written against (``Supervisor`` and
  ``Client`` implement it) and ``open_backend``; ``_handle`` / ``_sync`` — ``TurnHandle`` and the
  blocking twins; ``_events`` — ``EventsDropped``, the gap marker every follower yields (EVENTS-GAP-WHERE).
* front ends: ``daemon/`` (``turnpool serve``: server, endpoint, clients, metrics, journal,
  recovery), ``client/`` (``Client``, ``SyncClient``), ``batch/`` (the batch runner), ``acp/`` (the
  Agent Client Protocol front end), ``http/`` (``serve --http``), ``cli/`` (the ``turnpool`` command).
* ``ray/`` — ``RaySupervisor``, the same ``Backend`` over a Ray cluster (one node supervisor per
  node). Resolved lazily: ``import supervisor`` never imports Ray (the ``ray`` extra).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from wire import Cause, TurnError, TurnResult

from ._errors import (
    AuthenticationFailed,
    DaemonAlreadyRunning,
    DaemonShuttingDown,
    DaemonUnavailable,
    FollowerDropped,
    InvalidAgent,
    JournalUnavailable,
    ProtocolError,
    QueueFull,
    SupervisorClosed,
    TurnIdConflict,
    TurnpoolError,
    UnknownTurn,
    WorkerStartError,
)
from ._events import EventsDropped
from ._handle import TurnHandle

if TYPE_CHECKING:
    from ._engine.supervisor import Supervisor
    from ._sync import SyncSupervisor, SyncTurnHandle
    from .client import Client, SyncClient
    from .daemon.server import Daemon
    from .ray import RaySupervisor

    __version__: str

# The engine, the blocking fronts, the daemon's client and the daemon itself are imported on first
# use (PEP 562), so that ``import supervisor`` (which every ``turnpool`` command and every
# ``supervisor.*`` submodule import runs first) pays for none of them: a ``turnpool status`` needs
# the client, not the engine. ``from supervisor import Supervisor`` works as before.
_LAZY = {
    "Supervisor": "._engine.supervisor",
    "SyncSupervisor": "._sync",
    "SyncTurnHandle": "._sync",
    "Client": ".client",
    "SyncClient": ".client",
    "Daemon": ".daemon.server",
}


def __getattr__(name: str) -> Any:
    """The engine's and the fronts' classes on first use; ``RaySupervisor`` too, so the core works
    (and imports fast) without Ray."""
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    if name == "RaySupervisor":
        try:
            from .ray import RaySupervisor
        except ModuleNotFoundError as exc:
            if exc.name != "ray":
                raise
            raise ImportError("supervisor.RaySupervisor needs Ray: pip install 'turnpool[ray]'") from exc
        return RaySupervisor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _version() -> str:
    """The version has one source, pyproject.toml's ``version``, read from the installed
    distribution's metadata (on first use: ``importlib.metadata`` is slow to import); ``turnpool
    --version`` prints this (tests/test_habits.py holds them together)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("turnpool")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AuthenticationFailed",
    "Cause",
    "Client",
    "Daemon",
    "DaemonAlreadyRunning",
    "DaemonShuttingDown",
    "DaemonUnavailable",
    "EventsDropped",
    "FollowerDropped",
    "InvalidAgent",
    "JournalUnavailable",
    "ProtocolError",
    "QueueFull",
    "RaySupervisor",
    "Supervisor",
    "SupervisorClosed",
    "SyncClient",
    "SyncSupervisor",
    "SyncTurnHandle",
    "TurnError",
    "TurnHandle",
    "TurnIdConflict",
    "TurnResult",
    "TurnpoolError",
    "UnknownTurn",
    "WorkerStartError",
]
