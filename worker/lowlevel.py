"""The worker side's low-level public face: what the supervisor, tests and benchmarks may use of
the start-marker, End-log, process-guard and heap helpers (``_marker``, ``_endlog``, ``_guards``,
``_heap``). The process tree and cgroups have their own face, ``worker.proctree``.

Those modules stay private (their layout may change); this list is the approved way in, so the
supervisor never imports ``worker._x``. Linux only, like the rest of the worker. Agents have no
use for any of it: their API is ``worker.Turn``.
"""

from ._endlog import HEAD as ENDLOG_HEAD
from ._endlog import REC as ENDLOG_REC
from ._endlog import SIZE as ENDLOG_SIZE
from ._endlog import EndLog
from ._endlog import read as endlog_read
from ._guards import EXIT_LINK_LOST, cgroup_joined, install_process_guards, process_role, start_guardian
from ._guards import _take_baton as take_baton
from ._heap import TRIM_SLACK, HeapKeeper
from ._heap import trim as heap_trim
from ._heir import GONE as HEIR_GONE
from ._heir import UNWATCHABLE as HEIR_UNWATCHABLE
from ._heir import start_ticks
from ._heir import watch as heir_watch
from ._loop import warm_up_state
from ._marker import SIZE as MARKER_SIZE
from ._marker import give_token as marker_give_token
from ._marker import read as marker_read
from ._marker import read_noted as marker_read_noted
from ._ownfile import Mapping as OwnFileView
from ._ownfile import create as own_file
from ._ownfile import view as own_file_view
from ._settle import run_paths as zygote_worker_paths
from ._slice import NUMBERS as SLICE_SYSCALLS
from ._slice import SLICE_NS as SHORT_SLICE_NS
from ._slice import new_threads_short, set_slice, slice_of
from ._toolerrors import forget_raised as tool_errors_forget
from ._toolerrors import raised as tool_error_raised
from ._toolgroups import SPARE_GROUPS as TOOL_SPARE_GROUPS
from ._toolgroups import backend as tool_limits_backend
from ._toolgroups import next_kept as tool_next_call_groups
from ._toolgroups import sweep_stale_groups as tool_groups_sweep
from ._toolspawner import EXIT_INFO as TOOL_STATUS_FROM_PIDFD
from ._toolspawner import Died as ToolSpawnerDied
from ._toolspawner import Spawner as ToolSpawner
from ._tooltemplate import enable as tool_templates
from ._tooltemplate import pid_of as tool_template_pid
from ._watcher import supervisor_gone as watcher_supervisor_gone
from ._zygote import FORK_BATCH
from ._zygote import _preload as zygote_preload

# What each name is for, beyond the supervisor's own use:
# - ``EndLog``, ``ENDLOG_HEAD``/``ENDLOG_REC``/``ENDLOG_SIZE``: the End log's writer and layout
#   (WORKER-END-LOG), so a test can write a log and damage a record as a dying worker could;
# - ``start_guardian``, ``take_baton``, ``EXIT_LINK_LOST``: the worker's process guards (its
#   guardian process, the baton that lets exactly one of worker and guardian kill the tree, the
#   exit code of a worker whose link to the supervisor is lost), for tests that play the worker;
# - ``watcher_supervisor_gone``: what the pool's watcher does for a worker when the supervisor dies
#   (TREE-WATCHER, WORKER-SHARE-AT-DEATH), for tests that play the worker;
# - ``start_ticks``, ``heir_watch``, ``HEIR_GONE``/``HEIR_UNWATCHABLE``: LADDER-HEIR's process identity
#   (pid + start time) and the watch a warm spare holds a turn on, for tests of pid reuse;
# - ``zygote_preload``, ``zygote_worker_paths``: what the zygote imports and runs before it forks
#   (WORKER-SETTLE), so a test can fork a process prepared like the zygote and measure a worker's writes;
# - ``ToolSpawner``, ``ToolSpawnerDied``: a command's spawner as its caller sees it (TOOL-SPAWNER), so a
#   test can kill one between starting a command and answering for it.
# - ``tool_next_call_groups``, ``tool_template_pid``: where the next isolated call's process waits and which
#   template made it (TOOL-EMBRYO-DIRECT), so a test or probe can count that process's page faults.
# - ``slice_of``, ``set_slice``, ``new_threads_short``, ``SHORT_SLICE_NS``, ``SLICE_SYSCALLS``: a thread's
#   EEVDF slice read and asked for, the one turnpool's ZeroMQ I/O threads ask for (WORKER-SHORT-SLICE) and the
#   calls' numbers, so a test can read a process's threads back and fake a kernel that refuses.

__all__ = [
    "ENDLOG_HEAD",
    "ENDLOG_REC",
    "ENDLOG_SIZE",
    "EXIT_LINK_LOST",
    "FORK_BATCH",
    "HEIR_GONE",
    "HEIR_UNWATCHABLE",
    "MARKER_SIZE",
    "SHORT_SLICE_NS",
    "SLICE_SYSCALLS",
    "TOOL_SPARE_GROUPS",
    "TOOL_STATUS_FROM_PIDFD",
    "TRIM_SLACK",
    "EndLog",
    "HeapKeeper",
    "OwnFileView",
    "ToolSpawner",
    "ToolSpawnerDied",
    "cgroup_joined",
    "endlog_read",
    "heap_trim",
    "heir_watch",
    "install_process_guards",
    "marker_give_token",
    "marker_read",
    "marker_read_noted",
    "new_threads_short",
    "own_file",
    "own_file_view",
    "process_role",
    "set_slice",
    "slice_of",
    "start_guardian",
    "start_ticks",
    "take_baton",
    "tool_error_raised",
    "tool_errors_forget",
    "tool_groups_sweep",
    "tool_limits_backend",
    "tool_next_call_groups",
    "tool_template_pid",
    "tool_templates",
    "warm_up_state",
    "watcher_supervisor_gone",
    "zygote_preload",
    "zygote_worker_paths",
]
