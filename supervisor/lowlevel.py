"""The supervisor's low-level public face, as ``worker.lowlevel`` is the worker's: what tests,
benchmarks and tools may use of the engine's internals, so that nothing outside the package
imports a private module (``supervisor._engine``, ``supervisor._paths`` ...). Not user API: the
user API is ``supervisor.__all__`` (SPEC.md); these names may change with the engine.

- ``procs``: the process helpers the pool calls through this module's attributes, so a test can
  replace ``procs.spawn_worker`` (``monkeypatch.setattr``) to inject worker start failures;
  ``OrphanIndex`` finds a dead worker's descendants among this process's children (LADDER-STEPS),
  across many exits reading each child once (LADDER-ORPHANS), with its
  ``OrphanFacts`` and ``ORPHAN_FACTS_FRESH`` (how long they are used), for tests with fakes;
  ``orphans`` is their module, whose ``adopted`` (the listing of our children) a test may wrap;
  ``reaper`` reaps a dead worker's tree (``left_nothing``: LADDER-PROOF), whose ``_remove_all`` (the
  directories of reaped workers, WORKER-CWD) a test may wrap.
- ``MAX_HANDOVERS``: how many times a turn handed to workers that died before it was seen to
  start is re-queued before it ends ``crashed``.
- ``TurnRecord``: the engine's record of a turn (the journal's hooks take one); ``TurnTable``: the
  engine's table of them, which keeps a turn's events for its followers.
- ``SUBMIT_ERROR_CODES``: the error code of each way a submit is refused on the client link, the
  one table the daemon and the client read in opposite directions.
- ``runtime_dir``, ``private_dir``: the per-user runtime directory and a supervisor's private
  directory in it (mode 0700, checked).
- ``Timers``: the engine's timer heap (grace, kill-after, deadlines), precise through a timerfd
  where the clock allows (LADDER-TIMERFD), else on the loop's timeout.
- ``CLEAR_AHEAD``: how many windows of short turns (capacity × prefetch depth) a journal's dispatch
  gate clears ahead of the workers (JOURNAL-GATE-AHEAD).
- ``HOLD_BYTES``: how much of a turn's events a follower that keeps up may hold past
  ``max_events`` (EVENTS-KEEP).
- ``AgentAllowlist``: the glob patterns of ``allow_agents`` (SEC-ALLOW), as admission reads them.
- ``connection_uid``, ``socket_peer_uid``: the local uid owning the client end of a TCP connection
  (SEC-PEER), asked through ``sock_diag`` (``diag_uid``) or read from ``/proc/net/tcp{,6}`` (``proc_uid``);
  ``peers`` is their module, which the HTTP front end calls through its attributes (a test can
  replace ``peers.diag_uid`` or ``peers.socket_peer_uid``).
- ``KEEP_EVENT_BYTES``, ``KEEP_RESULT_BYTES``: the default byte budgets of ended turns' events
  (MEM-EVENTS) and outputs (MEM-OUTPUTS), which ``Supervisor``'s ``keep_events_mb`` and
  ``keep_results_mb`` defaults equal.
- ``autogroup_nice``, ``AutogroupShare``: WORKER-CPU-SHARE, the autogroup niceness a pool of N workers gives
  each worker, and what sets it (retrying what the kernel's rate limit refuses).
- ``own_nice``, ``pool_weight``, ``OwnWeight``: WORKER-SUPERVISOR-WEIGHT, the niceness at which the
  supervisor's own autogroup weighs what its pool weighs, and what holds it there while pools run (where it
  may).
- ``treemem``: MEM-STATUS-SAMPLE, the workers' memory as ``status()`` reports it (sampled in the
  background above ``SYNC_WORKERS`` workers), whose constants a test may lower with ``monkeypatch``.
- ``check_optional_str``: LINK-TURN-ID, the one check of what a turn id or a session may hold.
- ``FdBudget``: DAEMON-FD's descriptor budget, whose ``facts`` count the open descriptors at most once a
  second (DAEMON-FD-COUNT), with a ``count`` and a ``clock`` a test may give it.
- ``SpawnRoom``: WORKER-FD-ESTIMATE, whether a worker start leaves room in the descriptor limit (for
  tests with a fake count and clock).
- ``remove_tree``: WORKER-CWD's removal of a worker's directory (and the pool's) with what agents left there.
- ``probe``: the agent probe (ADAPT-PROBE), whose ``PROBE_SECONDS`` (the bound a submit waits for a
  name's probe) a test may lower with ``monkeypatch.setattr``.
"""

from . import _peers as peers
from ._checks import check_optional_str
from ._engine import TurnRecord, orphans, probe, procs, reaper, treemem
from ._engine.allowlist import AgentAllowlist
from ._engine.dispatch import CLEAR_AHEAD
from ._engine.exits import MAX_HANDOVERS
from ._engine.orphans import FRESH as ORPHAN_FACTS_FRESH
from ._engine.orphans import Facts as OrphanFacts
from ._engine.orphans import OrphanIndex
from ._engine.share import AutogroupShare, OwnWeight, autogroup_nice, own_nice, pool_weight
from ._engine.timers import Timers
from ._engine.turns import HOLD_BYTES, KEEP_EVENT_BYTES, KEEP_RESULT_BYTES, TurnTable
from ._engine.workspace import remove_tree
from ._errors import SUBMIT_ERROR_CODES
from ._fds import FdBudget, SpawnRoom
from ._paths import private_dir, runtime_dir
from ._peers import connection_uid, diag_uid, proc_uid, socket_peer_uid

__all__ = [
    "CLEAR_AHEAD",
    "HOLD_BYTES",
    "KEEP_EVENT_BYTES",
    "KEEP_RESULT_BYTES",
    "MAX_HANDOVERS",
    "ORPHAN_FACTS_FRESH",
    "SUBMIT_ERROR_CODES",
    "AgentAllowlist",
    "AutogroupShare",
    "FdBudget",
    "OrphanFacts",
    "OrphanIndex",
    "OwnWeight",
    "SpawnRoom",
    "Timers",
    "TurnRecord",
    "TurnTable",
    "autogroup_nice",
    "check_optional_str",
    "connection_uid",
    "diag_uid",
    "orphans",
    "own_nice",
    "peers",
    "pool_weight",
    "private_dir",
    "probe",
    "proc_uid",
    "procs",
    "reaper",
    "remove_tree",
    "runtime_dir",
    "socket_peer_uid",
    "treemem",
]
