"""Shared fixtures. Every test must leave no process behind: ``no_leftover_processes`` is
autouse and fails a test whose children, grandchildren or re-parented orphans outlive it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import leftovers
from worker import proctree

# This test process adopts orphans (like the supervisor does), so a double-forked daemon
# that escaped a kill shows up here as our child instead of vanishing under init.
proctree.set_child_subreaper()


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    before = {p.pid for p in leftovers.descendants()}
    yield
    left = [p for p in leftovers.descendants() if p.pid not in before]
    desc, zombies = leftovers.clear(left)
    if desc or zombies:
        pytest.fail(f"test left processes behind: alive={desc} unreaped zombies={zombies}")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
