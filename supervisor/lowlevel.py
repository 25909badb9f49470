"""The supervisor's low-level public face, as ``worker.lowlevel`` is the worker's: what tests,
benchmarks and tools may use of the engine's internals, so that nothing outside the package
imports a private module (``supervisor._engine``, ``supervisor._paths`` ...). Not user API: the
user API is ``supervisor.__all__`` (SPEC.md); these names may change with the engine.

- ``procs``: the process helpers the pool calls through this module's attributes, so a test can
  replace ``procs.spawn_worker`` (``monkeypatch.setattr``) to inject worker start failures;
  ``orphans_of`` finds a dead worker's descendants among this process's children (R13).
- ``MAX_HANDOVERS``: how many times a turn handed to workers that died before it was seen to
  start is re-queued before it ends ``crashed``.
- ``TurnRecord``: the engine's record of a turn (the journal's hooks take one).
- ``SUBMIT_ERROR_CODES``: the error code of each way a submit is refused on the client link, the
  one table the daemon and the client read in opposite directions.
- ``runtime_dir``, ``private_dir``: the per-user runtime directory and a supervisor's private
  directory in it (mode 0700, checked).
- ``Timers``: the engine's timer heap (grace, kill-after, deadlines), precise through a timerfd
  where the clock allows (T-PRECISE), else on the loop's timeout.
- ``CLEAR_AHEAD``: how many windows of short turns (capacity × prefetch depth) a journal's dispatch
  gate clears ahead of the workers (J6-AHEAD).
- ``HOLD_BYTES``: how much of a turn's events a follower that keeps up may hold past
  ``max_events`` (G-KEEP).
- ``KEEP_EVENT_BYTES``, ``KEEP_RESULT_BYTES``: the default byte budgets of ended turns' events
  (E-BUDGET) and outputs (R-BUDGET), which ``Supervisor``'s ``keep_events_mb`` and
  ``keep_results_mb`` defaults equal.
- ``probe``: the agent probe (A-PROBE), whose ``PROBE_SECONDS`` (the bound a submit waits for a
  name's probe) a test may lower with ``monkeypatch.setattr``.
"""

from ._engine import TurnRecord, probe, procs
from ._engine.dispatch import CLEAR_AHEAD
from ._engine.exits import MAX_HANDOVERS
from ._engine.procs import orphans_of
from ._engine.timers import Timers
from ._engine.turns import HOLD_BYTES, KEEP_EVENT_BYTES, KEEP_RESULT_BYTES
from ._errors import SUBMIT_ERROR_CODES
from ._paths import private_dir, runtime_dir

__all__ = [
    "CLEAR_AHEAD",
    "HOLD_BYTES",
    "KEEP_EVENT_BYTES",
    "KEEP_RESULT_BYTES",
    "MAX_HANDOVERS",
    "SUBMIT_ERROR_CODES",
    "Timers",
    "TurnRecord",
    "orphans_of",
    "private_dir",
    "probe",
    "procs",
    "runtime_dir",
]
