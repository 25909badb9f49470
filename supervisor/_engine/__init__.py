"""The engine: a private package. ``Supervisor`` (``supervisor.py``) keeps its state, the public
methods and one handler per worker message, and composes the parts, each owning its own state:
starting and disposing (``lifecycle.py``), the worker link (``link.py``: the socket), the worker
pool (``pool.py``: processes, with the zygote in ``zygote.py`` and process-tree work in
``procs.py``), the turn table and queue (``turns.py``), admission (``admission.py``), child
turns (``children.py``), dispatch (``dispatch.py``), the escalation ladder (``escalation.py``),
the memory watchdog (``memory.py``), exit handling (``exits.py``), ending turns (``ending.py``),
the front ends' hooks (``hooks.py``), the timers (``timers.py``), worker output (``output.py``),
and read-only views (``turninfo.py``); argument validation is shared with the client
(``supervisor/_checks.py``). Front ends use only ``Supervisor``'s public methods.
"""

from .procs import check_agent_path
from .supervisor import Supervisor
from .turns import TurnRecord

__all__ = [
    "Supervisor",
    "TurnRecord",
    "check_agent_path",
]
