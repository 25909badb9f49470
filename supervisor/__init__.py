"""turnpool's supervisor side: the pool, the turn table, cancellation and escalation.

Layers, bottom up: ``_timers`` (one task for every deadline), ``_turns`` (the turn record,
the one cancellation holder, and the queue), ``_pool`` (a worker slot), ``_procs`` (start,
signal, reap worker process trees), ``_core`` (``Supervisor``: the engine), ``_handle``
(``TurnHandle``), ``_sync`` (blocking twins); around it the serve daemon: ``_daemon`` (a ROUTER
in front of a ``Supervisor``), ``_endpoint`` (claiming and binding its address), ``_metrics``
(Prometheus), ``_daemon_journal`` (the journal on the daemon's hooks), ``_client`` (``Client``,
``SyncClient``), ``_cli_daemon`` (serve, submit, cancel, status); ``http/`` (``serve --http``: the
HTTP/SSE API and the dashboard, on public methods only; ``_turninfo`` gives it read-only turn
views). Never imports agent code.
"""

from wire import Cause, TurnError, TurnResult

from ._client import Client, SyncClient
from ._engine import Supervisor
from ._daemon import Daemon
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
    TurnpoolError,
    UnknownTurn,
    WorkerStartError,
)
from ._handle import TurnHandle
from ._sync import SyncSupervisor, SyncTurnHandle

__all__ = [
    "AuthenticationFailed", "Cause", "Client", "Daemon", "DaemonAlreadyRunning", "DaemonShuttingDown",
    "DaemonUnavailable", "FollowerDropped", "InvalidAgent", "JournalUnavailable", "ProtocolError", "QueueFull",
    "Supervisor", "SupervisorClosed", "SyncClient", "SyncSupervisor", "SyncTurnHandle", "TurnError", "TurnHandle",
    "TurnResult", "TurnpoolError", "UnknownTurn", "WorkerStartError",
]
