"""Helpers for tests that read a turn's event stream."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import anyio

from supervisor import EventsDropped


async def first_event(handle: Any, bound: float = 60.0) -> Any:
    """Wait (bounded) until the turn emitted its first event; return it."""
    with anyio.fail_after(bound):
        async with aclosing(handle.events()) as events:
            async for event in events:
                return event
    raise AssertionError("the turn ended without emitting")


def assert_accounted(items: list[Any], count: int) -> None:
    """Each event is the one after the last (events are their own sequence numbers), or comes
    right after an ``EventsDropped`` marker that says exactly how many were skipped; the stream
    ends at event ``count``."""
    expected = 0
    for item in items:
        if isinstance(item, EventsDropped):
            assert item.first == expected and item.count > 0, (item, expected)
            expected += item.count
        else:
            assert item == expected, (item, expected)
            expected += 1
    assert expected == count
