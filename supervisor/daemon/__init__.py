"""The serve daemon: ``server`` (``Daemon``: a ROUTER in front of a ``Supervisor``), ``endpoint``
(claiming and binding its address), ``clients`` (per-client bookkeeping and flow control),
``metrics`` (Prometheus), ``journal`` and ``journal_writer`` (the SQLite journal and its writer
process), ``recovery`` (the journal on the daemon's hooks; restart recovery)."""

from .server import Daemon

__all__ = ["Daemon"]
