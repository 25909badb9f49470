"""pyzmq's flags and socket options as plain ints, for the three hot read/send paths of the
supervisor side (the worker link, the daemon's client link, the client): pyzmq's are enums, and
each ``&`` or ``|`` on one builds an enum member (LINK-FLAGS; on the worker link ≈ 10% of the
supervisor's time while a turn streams events, measured). The worker keeps its own copy
(``worker/_loop.py``), since ``worker/`` never imports ``supervisor/``."""

from __future__ import annotations

import zmq

NOBLOCK = int(zmq.NOBLOCK)
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)
RCVMORE = int(zmq.RCVMORE)
NOBLOCK_MORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
