"""The serve daemon: ``server`` (``Daemon``: a ROUTER in front of a ``Supervisor``), ``run`` (``Lifecycle``:
start-up, signals, shutdown; the process settings of ``turnpool serve``), ``tasks`` (the request tasks),
``intake`` (reading requests off the client link, a slice at a
time), ``requests`` (the answer to each client request), ``endpoint`` (claiming and binding its
address), ``clients`` (per-client bookkeeping and flow control), ``client_watch`` (freeing what a
client that abandons, goes or stops reading held), ``metrics`` (Prometheus), ``recovery`` (the journal,
``supervisor/journal/``, on the daemon's hooks; restart recovery)."""

from .server import Daemon

__all__ = ["Daemon"]
