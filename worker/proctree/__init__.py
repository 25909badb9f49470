"""The process tree, as both sides see it: the public face of the process-tree and cgroup code the
worker and the supervisor share (``_tree``: prctl, freeze, list and signal a tree; ``_cgroup``: a
pool cgroup per supervisor and one per worker, killed atomically), and the worker's end-of-turn
sweep (``_sweep``, the worker's alone). The supervisor imports these names from here, never the
private modules. Linux only where the modules say so.
"""

from ._cgroup import POOL_PREFIX as CGROUP_POOL_PREFIX
from ._cgroup import Pool as CgroupPool
from ._cgroup import cgroup_of
from ._cgroup import kill as cgroup_kill
from ._cgroup import kill_and_remove as cgroup_kill_and_remove
from ._cgroup import populated as cgroup_populated
from ._cgroup import procs as cgroup_procs
from ._cgroup import pss_bytes as cgroup_pss_bytes
from ._cgroup import remove as cgroup_remove
from ._cgroup import sweep_stale as cgroup_sweep_stale
from ._cgroup import usable as cgroups_usable
from ._proof import make as proof_file
from ._proof import unmapped as proof_unmapped
from ._tree import (
    TREE_ENV,
    children,
    descendants,
    freeze_tree,
    has_marker,
    markers_of,
    session_of,
    set_autogroup_nice,
    set_child_subreaper,
    signal_all,
    thaw,
)

__all__ = [
    "CGROUP_POOL_PREFIX",
    "TREE_ENV",
    "CgroupPool",
    "cgroup_kill",
    "cgroup_kill_and_remove",
    "cgroup_of",
    "cgroup_populated",
    "cgroup_procs",
    "cgroup_pss_bytes",
    "cgroup_remove",
    "cgroup_sweep_stale",
    "cgroups_usable",
    "children",
    "descendants",
    "freeze_tree",
    "has_marker",
    "markers_of",
    "proof_file",
    "proof_unmapped",
    "session_of",
    "set_autogroup_nice",
    "set_child_subreaper",
    "signal_all",
    "thaw",
]
