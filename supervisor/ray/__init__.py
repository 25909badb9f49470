"""turnpool on a Ray cluster: one node supervisor per node, a router on the driver.

* ``node`` — ``NodeSupervisor``, the Ray actor owning one embedded ``Supervisor`` on its node
  (every cancellation rule stays node-local);
* ``router`` — ``RaySupervisor``, the driver-side ``Backend`` that routes turns to nodes;
* ``membership`` — the router's node supervisors, started as nodes join, and the loss handling
  that ends (or re-places) a lost node's turns once;
* ``node_link`` — one node's submit and result streams (the result stream is also its liveness);
* ``turn_table`` — the router's turn table and session pins (no Ray);
* ``placement`` — turn ids naming nodes, rendezvous hashing (pure, no Ray);
* ``daemon`` — ``turnpool serve --ray``: the client endpoint with a ``RaySupervisor`` behind it.

Importing this package imports Ray (the ``ray`` extra); ``import supervisor`` never does:
``supervisor.RaySupervisor`` is resolved on first use.
"""

from .router import NODE_LOST, RaySupervisor

__all__ = ["NODE_LOST", "RaySupervisor"]
