"""A turn id names one request (issue 15, item 6; design rule R-ID).

The same ``turn_id`` with the same agent, input and session is idempotent (the existing turn,
never run twice); with another agent, input or session it raises ``TurnIdConflict`` naming what
differs — embedded, through the daemon, and for ids the daemon only knows from its journal
(after a restart).
"""

from __future__ import annotations

import shutil

import anyio
import pytest

import supervisor
from supervisor import Client, Supervisor, TurnIdConflict
from tests.support.daemonkit import FAST, short_dir, start, stop_process

pytestmark = pytest.mark.anyio

ECHO = "examples.agents:echo"
CHANGES = [
    ({"agent": "examples.agents:noop"}, "agent"),
    ({"input": {"n": 2}}, "input"),
    ({"session": "other"}, "session"),
]


def _request(**change: object) -> tuple[str, object, dict[str, object]]:
    req: dict[str, object] = {"agent": ECHO, "input": {"n": 1, "m": [1, 2]}, "session": None}
    req.update(change)
    return str(req.pop("agent")), req.pop("input"), req


async def _check(backend: object, turn_id: str) -> None:
    agent, inp, kw = _request()
    first = await backend.submit(agent, inp, turn_id=turn_id, **kw)  # type: ignore[attr-defined]
    reordered = {"m": [1, 2], "n": 1}  # the same dict, built in another order: the same input
    again = await backend.submit(agent, reordered, turn_id=turn_id, **kw)  # type: ignore[attr-defined]
    assert again.turn_id == first.turn_id == turn_id
    for ended in (False, True):
        for change, what in CHANGES:
            agent2, inp2, kw2 = _request(**change)
            with pytest.raises(TurnIdConflict) as err:
                await backend.submit(agent2, inp2, turn_id=turn_id, **kw2)  # type: ignore[attr-defined]
            assert what in str(err.value) and turn_id in str(err.value), err.value
            assert err.value.differs == (what,) and isinstance(err.value, ValueError)
        if not ended:
            with anyio.fail_after(60):
                assert (await first.result()).output == {"n": 1, "m": [1, 2]}
    assert (await backend.run(agent, inp, turn_id=turn_id, **kw)).output == inp  # type: ignore[attr-defined]


def test_turn_id_conflict_is_public() -> None:
    """``TurnIdConflict`` is exported (and a ``ValueError``)."""
    assert "TurnIdConflict" in supervisor.__all__ and issubclass(TurnIdConflict, ValueError)


async def test_embedded_same_id_other_request_conflicts() -> None:
    """Embedded: queued, running or ended, another agent, input or session under a used id raises
    ``TurnIdConflict`` naming it; the same request (dict order aside) is the existing turn."""
    async with Supervisor(workers=1, spares=0) as sup:
        await _check(sup, "job-1")
        assert (await sup.status())["outcomes"] == {"completed": 1}


async def test_daemon_same_id_other_request_conflicts_even_after_a_restart() -> None:
    """Through the daemon, and again after a restart when the id is known from the journal."""
    home = short_dir()
    journal = home / "journal.sqlite3"
    first = start(*FAST, "--journal", str(journal), home=home)
    try:
        async with Client.connect(first.endpoint) as client:
            await _check(client, "job-2")
    finally:
        stop_process(first.proc)
    second = start(*FAST, "--journal", str(journal), home=home)
    try:
        async with Client.connect(second.endpoint) as client:
            agent, inp, kw = _request()
            with anyio.fail_after(60):
                again = await client.run(agent, {"m": [1, 2], "n": 1}, turn_id="job-2", **kw)
            assert again.output == inp
            for change, what in CHANGES:
                agent2, inp2, kw2 = _request(**change)
                with pytest.raises(TurnIdConflict, match=what):
                    await client.submit(agent2, inp2, turn_id="job-2", **kw2)
            assert (await client.status())["outcomes"] == {}  # nothing ran again
    finally:
        stop_process(second.proc)
        shutil.rmtree(home, ignore_errors=True)
