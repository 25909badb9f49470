"""The End log: the ends of the turns a worker finished, kept where its death cannot take them.

With prefetch a worker runs quick handed turns back to back, and their ``Started`` and ``End`` wait
in a batch that leaves later (the loop's flush, or the stale flusher). A turn that then kills the
process (``os._exit``, a segfault) takes that batch along - or a frame still inside ZeroMQ's I/O
thread - and with it the ends of the turns that ran before it. The supervisor would see those turns
as handed and never started, and run them again elsewhere.

So, before the worker starts anything of its next turn, the ``End`` of the turn it finished is
copied (already encoded: one memcpy) into this memory-mapped file, made like the start marker
(``worker/_marker.py``): it has no name, the supervisor keeps a read-only mapping of it and the
worker maps the descriptor it was handed and closes it (``worker/_ownfile.py``, rule SEC-WORKER-FILES), so no
other worker's agent can open it to write an end of its own making into it. The kernel keeps the
pages whatever happens to the process. When the worker dies, the supervisor reads the log and
applies each logged ``End`` of a turn it still believes handed to or running on that worker, as if
the frame had arrived (rule WORKER-END-LOG in ``docs/design.md``).

Layout: a 16-byte header - ``used`` (4 bytes, native order: bytes of records after the header), the
worker's pid (4 bytes, native), 8 bytes reserved - then records, each a 4-byte little-endian length
``n``, the turn's start time (8-byte double, the same ``time.monotonic()`` value its start marker
got), then ``n`` bytes of the msgpack-encoded ``End``. A record is written in full before ``used``
is moved past it (one aligned 4-byte store), so a death at any instant leaves either the old log or
the new one visible, never a torn record.

The log is bounded (``SIZE``). An ``End`` that does not fit is not logged: it asks for an ``EndAck``
instead (the mechanism of rule WORKER-FLUSH), the worker starts nothing before that ack is in, and every
``EndAck`` empties the log - the supervisor has every ``End`` sent before the acked one, since
frames on the link arrive in order.
"""

from __future__ import annotations

import os
import struct

import msgspec

from wire.worker_link import End

from . import _ownfile

HEAD = 16  # used, pid, reserved
REC = 4 + 8  # length, start time
SIZE = 1 << 20  # 1 MiB: tens of thousands of small ends between two acks; bigger ends take the ack
# The header is in native byte order (the file never leaves the machine): a native ``I`` is packed
# with one memcpy, so ``used`` changes in one aligned 4-byte store that no death can tear (the
# standard-size formats write it byte by byte).
_head = struct.Struct("@II")
_u32 = struct.Struct("@I")
_rec = struct.Struct("<Id")
_decoder = msgspec.msgpack.Decoder(End)


class EndLog:
    """The worker's side: ``append`` each finished turn's encoded ``End`` before the next turn."""

    def __init__(self, fd: int) -> None:
        """Map the log the supervisor made (``fd``, ``SIZE`` zero bytes); ``fd`` is closed."""
        self._map = _ownfile.take(fd, SIZE)
        self._used = 0
        self._map[0:HEAD] = _head.pack(0, os.getpid()) + bytes(HEAD - _head.size)

    def append(self, data: bytes, started_at: float) -> bool:
        """Log one encoded ``End``; False (nothing written) when it does not fit."""
        start = HEAD + self._used
        stop = start + REC + len(data)
        if stop > SIZE:
            return False
        m = self._map
        _rec.pack_into(m, start, len(data), started_at)
        m[start + REC : stop] = data
        self._used = used = stop - HEAD
        _u32.pack_into(m, 0, used)  # last: the record is visible only now
        return True

    def clear(self) -> None:
        """The supervisor confirmed an ``End``, so it holds every ``End`` logged before it."""
        if self._used:
            self._used = 0
            _u32.pack_into(self._map, 0, 0)


def read(view: memoryview | bytes, pid: int) -> list[tuple[float, End]]:
    """The supervisor's side, from its mapping of the log: the ends logged by the worker with
    this ``pid``, in order, each with its turn's start time. Empty if the log is another
    process's (or none was written); a record that does not decode ends the walk (nothing
    after it is trusted)."""
    try:
        head = bytes(view[:HEAD])
        if len(head) < HEAD:
            return []
        used, owner = _head.unpack_from(head)
        if owner != pid or used > SIZE - HEAD:
            return []
        body = bytes(view[HEAD : HEAD + used])
    except ValueError:  # a closed mapping
        return []
    ends: list[tuple[float, End]] = []
    at = 0
    while at + REC <= len(body):
        n, started_at = _rec.unpack_from(body, at)
        stop = at + REC + n
        if stop > len(body):
            break
        try:
            ends.append((started_at, _decoder.decode(body[at + REC : stop])))
        except msgspec.DecodeError:
            break
        at = stop
    return ends
