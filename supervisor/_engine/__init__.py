"""The engine: a private package. ``Supervisor`` (``supervisor.py``) keeps the public methods and one
handler per worker message, and wires the parts; each part is given what it reads and writes, never
the ``Supervisor``: the options (``settings.py``: ``EngineOptions``), the turn book (``book.py``:
``TurnBook`` over the turn table and queue of ``turns.py``; a turn's states and moves in
``states.py``), the worker link (``link.py``: the socket), the worker pool (``pool.py``: processes,
with the zygote in ``zygote.py`` and process-tree work in ``procs.py``), the timers (``timers.py``),
the front ends' hooks (``hooks.py``); admission (``admission.py``), child turns (``children.py``),
dispatch (``dispatch.py``), the escalation ladder (``escalation.py``), ending turns (``ending.py``),
exit handling (``exits.py``), the memory watchdog (``memory.py``), starting and disposing
(``lifecycle.py``); worker output (``output.py``) and read-only views (``turninfo.py``); argument
validation is shared with the client (``supervisor/_checks.py``). Front ends use only
``Supervisor``'s public methods; tests of the policy alone use ``supervisor.policy``.
"""

from typing import TYPE_CHECKING, Any

from .turns import TurnRecord

if TYPE_CHECKING:
    from .procs import check_agent_path


def __getattr__(name: str) -> Any:
    """``check_agent_path`` on first use: ``procs`` imports the worker side, which the journal's
    readers (``steps``, through ``supervisor.journal``) and the ``turnpool`` commands that only read
    a journal or talk to a daemon never need."""
    if name == "check_agent_path":
        from .procs import check_agent_path

        return check_agent_path
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TurnRecord",
    "check_agent_path",
]
