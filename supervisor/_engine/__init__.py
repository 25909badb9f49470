"""The engine: a private package. ``Supervisor`` (``supervisor.py``) keeps its state, the public
methods and one handler per worker message, and composes the parts, each owning its own state:
starting and disposing (``lifecycle.py``), the worker link (``link.py``: the socket), the worker
pool (``pool.py``: processes, with the zygote in ``zygote.py`` and process-tree work in
``procs.py``), the turn table and queue (``turns.py``), admission (``admission.py``), child
turns (``children.py``), dispatch (``dispatch.py``), the escalation ladder (``escalation.py``),
the memory watchdog (``memory.py``), exit handling (``exits.py``), ending turns (``ending.py``),
the front ends' hooks (``hooks.py``), the timers (``timers.py``), worker output (``output.py``),
argument validation (``options.py``) and read-only views (``turninfo.py``). Front ends use only
``Supervisor``'s public methods.
"""

from .options import AGENT_RE, MAX_GRACE, check_agent, check_count, check_optional_str, check_seconds
from .procs import check_agent_path
from .supervisor import Supervisor
from .turns import TurnRecord

__all__ = [
    "AGENT_RE",
    "MAX_GRACE",
    "Supervisor",
    "TurnRecord",
    "check_agent",
    "check_agent_path",
    "check_count",
    "check_optional_str",
    "check_seconds",
]
