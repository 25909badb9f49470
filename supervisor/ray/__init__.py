"""turnpool on a Ray cluster: one node supervisor per node, a router on the driver.

* ``node`` — ``NodeSupervisor``, the Ray actor owning one embedded ``Supervisor`` on its node
  (every cancellation rule stays node-local);
* ``router`` — ``RaySupervisor``, the driver-side ``Backend`` that routes turns to nodes and
  ends the turns of a lost node;
* ``placement`` — turn ids naming nodes, rendezvous hashing (pure, no Ray).

Importing this package imports Ray (the ``ray`` extra); ``import supervisor`` never does:
``supervisor.RaySupervisor`` is resolved on first use.
"""

from .router import NODE_LOST, RaySupervisor

__all__ = ["NODE_LOST", "RaySupervisor"]
