"""``EventsDropped``: the gap marker a follower's ``handle.events()`` yields in place of events it lost.

A turn keeps at most ``max_events`` events for its followers (the older half is dropped when the
buffer overflows), and a slow follower must never slow the agent or other turns. So a follower that
falls further behind than the buffer loses events, and it is told so, in the stream, exactly where
they were lost: ``handle.events()`` yields one ``EventsDropped`` whose ``count`` says how many
events were skipped, then goes on with the oldest event still kept. A follower that starts after
the turn has dropped its oldest events gets one first (``first`` 0). A follower that keeps up never
sees one. The embedded ``Supervisor``'s follower and the daemon ``Client``'s follower yield the same
type (rules EVENTS-GAP-WHERE and EVENTS-DROPPED of docs/design.md).

Agent events are plain decoded msgpack values (dicts, lists, strings, numbers ...), never an
instance of this class, so ``isinstance(event, EventsDropped)`` tells the two apart.
"""

from __future__ import annotations

from typing import Any


class EventsDropped:
    """``count`` events of the turn were dropped before this follower read them; ``first`` is the
    sequence number (0 for the turn's first event) of the first one dropped. The next event the
    iteration yields is number ``first + count``."""

    __slots__ = ("count", "first")

    def __init__(self, count: int, first: int) -> None:
        self.count = count
        self.first = first

    def __repr__(self) -> str:
        return f"EventsDropped(count={self.count}, first={self.first})"

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, EventsDropped):
            return NotImplemented
        return (self.count, self.first) == (other.count, other.first)

    def __hash__(self) -> int:
        return hash((EventsDropped, self.count, self.first))


__all__ = ["EventsDropped"]
