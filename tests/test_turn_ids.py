"""A turn id names one request (issue 15, item 6; design rule API-TURN-ID).

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


BAD_IDS = ["a\x00b", "line\nbreak", "tab\t", "\x7f", "c1\x85", "sep\u2028", "lone\ud800", "x" * 257, ""]
GOOD_IDS = ["日本", "a/b", "100%", "..", "a b", "👨\u200d👩", "x" * 256]


async def test_the_turn_id_rule_is_the_same_embedded_and_through_a_client() -> None:
    """LINK-TURN-ID: a turn id (or session) of 1 to 256 characters holding no control character, line
    separator or surrogate is accepted and runs; any other is refused at the call, embedded and
    by a ``Client`` before anything is sent (the daemon refuses it too), and ``submit_many`` with
    one bad id among good ones submits nothing (was: a NUL or a lone surrogate was accepted)."""
    home = short_dir()
    served = start(*FAST, home=home)
    try:
        async with Supervisor(workers=1, spares=0) as sup, Client.connect(served.endpoint) as client:
            for backend in (sup, client):
                for bad in BAD_IDS:
                    for field in ("turn_id", "session"):
                        with pytest.raises((TypeError, ValueError), match=field):
                            await backend.submit(ECHO, 1, **{field: bad})
                    with pytest.raises((TypeError, ValueError), match="turn_id"):
                        await backend.submit_many(ECHO, [1, 2], turn_ids=["fine-1", bad])
                with anyio.fail_after(60):
                    for good in GOOD_IDS:
                        res = await backend.run(ECHO, good, turn_id=good, session=good)
                        assert res.turn_id == good and res.output == good
                        assert (await backend.handle(good).result()).turn_id == good
                st = await backend.status()
                assert st["outcomes"] == {"completed": len(GOOD_IDS)}, st  # nothing refused ran
    finally:
        stop_process(served.proc)
        shutil.rmtree(home, ignore_errors=True)


async def test_the_daemon_refuses_a_bad_turn_id_a_client_did_not_check() -> None:
    """LINK-TURN-ID at the daemon itself: a ``Submit`` frame carrying a NUL turn id (sent by a client that
    skipped the check) is refused with a ``bad_value`` error, and nothing runs."""
    import wire
    from wire import client_link

    home = short_dir()
    served = start(*FAST, home=home)
    try:
        async with Client.connect(served.endpoint) as client:
            raw = wire.encode_payload(1)
            with pytest.raises(ValueError, match="control character"):
                await client._call(  # a frame the public API would not send
                    lambda req: client_link.Submit(
                        req, ECHO, raw, None, None, None, None, "a\x00b", False, False
                    )
                )
            assert (await client.status())["outcomes"] == {}
    finally:
        stop_process(served.proc)
        shutil.rmtree(home, ignore_errors=True)


async def test_a_turn_acknowledged_under_an_older_rule_is_readmitted_as_it_is() -> None:
    """LINK-TURN-ID binds new submits only: a turn the journal acknowledged before the rule (an id holding
    a control character) is readmitted at recovery and runs, where a new submit of that id is
    refused, so a daemon upgraded over such a journal still starts and loses nothing."""
    import msgspec

    import wire

    async with Supervisor(workers=1, spares=0) as sup:
        with pytest.raises(ValueError, match="control character"):
            await sup.submit(ECHO, 1, turn_id="old\x01id")
        record = sup.accept_encoded(
            ECHO, msgspec.Raw(wire.encode_payload(7)), session="s\x02", timeout=None, grace=None,
            kill_after=None, turn_id="old\x01id", readmit=True,
        )  # fmt: skip
        with anyio.fail_after(60):
            result = await sup.handle(record.id).result()
    assert result.turn_id == "old\x01id" and result.output == 7, result
