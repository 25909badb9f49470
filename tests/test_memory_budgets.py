"""Byte budgets beside the count bounds: the events of ended turns (MEM-EVENTS, ``keep_events_mb``) and
the inputs of turns not ended yet (MEM-INPUTS, ``max_input_mb``).

Before, each of the last ``keep_results`` ended turns kept up to ``max_events`` events for late
followers: 2,000 turns of 1,000 small events grew a supervisor by 327 MiB, and the defaults allow a
hundred million events; and ``max_queue`` let 100,000 queued turns hold up to 32 MiB of input each.
Attacks: many event-heavy turns past a small budget (embedded and through a daemon, whose memory is
measured), a follower reading an old turn while the budget sheds, and clients queueing big inputs.
"""

from __future__ import annotations

import inspect
from contextlib import aclosing
from typing import Any

import anyio
import psutil
import pytest

from supervisor import Client, EventsDropped, QueueFull, Supervisor, UnknownTurn
from supervisor import lowlevel as sup_lowlevel
from tests.support.daemonkit import FAST, serving
from tests.support.events import first_event
from tests.support.memkit import rss_under

pytestmark = pytest.mark.anyio

FLOOD = "tests.agents.client:flood"
EVENTS = 2_000
# Each event is counted as its encoded size + 64 bytes: at least 128 KB per turn of 2,000, so a
# 1 MiB budget keeps the events of 8 such turns at most.
MOST_KEPT = 2**20 // (EVENTS * 64)


async def _replay(handle: Any) -> list[Any]:
    """Every event the turn's handle replays, markers included (bounded)."""
    with anyio.fail_after(60):
        async with aclosing(handle.events()) as events:
            return [event async for event in events]


async def test_ended_turns_keep_their_events_within_the_budget_newest_first() -> None:
    """12 turns of 2,000 events under ``keep_events_mb=1``: every result stays; the newest turns
    replay every event; the oldest ones replay one ``EventsDropped`` for all but their last event,
    then that event."""
    async with Supervisor(workers=2, spares=0, keep_events_mb=1) as sup:
        with anyio.fail_after(120):
            results = [await sup.run(FLOOD, {"count": EVENTS}) for _ in range(12)]
        assert all(r.outcome == "completed" and r.output == {"events": EVENTS} for r in results)
        replays = [await _replay(sup.handle(r.turn_id)) for r in results]
        memory = (await sup.status())["memory"]
    assert 0 < memory["ended_events_mb"] <= memory["keep_events_mb"] == 1.0, memory
    kept = [len(r) == EVENTS and r == [{"i": i, "p": "p" * 16} for i in range(EVENTS)] for r in replays]
    last = {"i": EVENTS - 1, "p": "p" * 16}
    shed = [len(r) == 2 and isinstance(r[0], EventsDropped) and r[1] == last for r in replays]
    assert all(k or s for k, s in zip(kept, shed, strict=True)), [len(r) for r in replays]
    first_kept = kept.index(True)
    assert kept[first_kept:] == [True] * (12 - first_kept), kept  # the newest ones, in a row
    assert 1 <= 12 - first_kept <= MOST_KEPT, kept
    marker = replays[0][0]
    assert (marker.count, marker.first) == (EVENTS - 1, 0)


async def test_a_follower_reading_an_old_turn_keeps_it_while_the_budget_sheds() -> None:
    """A follower reads the first event of an ended turn and pauses while 12 more event-heavy turns
    end: the budget sheds around it, and it still reads every event of its turn. Once it is gone,
    the next turn's end sheds that turn too."""
    async with Supervisor(workers=2, spares=0, keep_events_mb=1) as sup:
        with anyio.fail_after(120):
            old = await sup.run(FLOOD, {"count": EVENTS})
            handle: Any = sup.handle(old.turn_id)
            async with aclosing(handle.events()) as events:
                got = [await anext(events)]
                for _ in range(12):
                    await sup.run(FLOOD, {"count": EVENTS})
                got += [event async for event in events]
            assert got == [{"i": i, "p": "p" * 16} for i in range(EVENTS)]
            await sup.run(FLOOD, {"count": EVENTS})
            replay = await _replay(sup.handle(old.turn_id))
    assert len(replay) == 2 and isinstance(replay[0], EventsDropped), replay[:3]
    assert (replay[0].count, replay[0].first, replay[1]) == (EVENTS - 1, 0, {"i": EVENTS - 1, "p": "p" * 16})


async def test_a_follower_whose_client_vanishes_mid_replay_holds_nothing_back() -> None:
    """A ``Client`` reads the first event of an old ended turn through ``turnpool serve --keep-events-mb
    1`` and vanishes without a word, its follow still open, while event-heavy turns end. Once the
    daemon has freed it, the next turn's end sheds the old turn: a new follower reads one marker and
    the last event, so a vanished follower held nothing for good."""
    with serving(*FAST, "--no-journal", "--keep-events-mb", "1") as d:
        async with Client.connect(d.endpoint, timeout=30) as client:
            old = await client.run(FLOOD, {"count": EVENTS})
            gone = await Client.connect(d.endpoint, timeout=30).__aenter__()
            stream = gone.handle(old.turn_id).events()
            with anyio.fail_after(60):
                assert await anext(stream) == {"i": 0, "p": "p" * 16}
            await gone.__aexit__(None, None, None)  # the socket closes; the daemon was told nothing
            with anyio.fail_after(120):
                for _ in range(12):
                    await client.run(FLOOD, {"count": EVENTS})
                while True:  # the daemon sees the client gone (its disconnect monitor) and frees the follow
                    if not (await client.status())["daemon"]["streams"]:
                        break
                    await anyio.sleep(0.05)  # allowed: pacing a bounded poll of the daemon's status
                await client.run(FLOOD, {"count": EVENTS})
            replay = await _replay(client.handle(old.turn_id))
    assert len(replay) == 2 and isinstance(replay[0], EventsDropped), replay[:3]
    assert (replay[0].count, replay[1]) == (EVENTS - 1, {"i": EVENTS - 1, "p": "p" * 16})


async def test_a_daemon_running_event_heavy_turns_stays_within_its_event_budget() -> None:
    """600 turns of 1,000 events through ``turnpool serve --keep-events-mb 8``: the daemon grows by
    less than 40 MiB (+14 MiB measured; waited for: MEM-TRIM hands back what was shed), where without
    a budget it kept them all (+80 MiB measured, ``--keep-events-mb 100000``). The newest turn
    replays in full; the oldest replays a marker, then its last event."""
    turns, events = 600, 1_000
    with serving(*FAST, "--no-journal", "--keep-events-mb", "8") as d:
        daemon = psutil.Process(d.pid)
        async with Client.connect(d.endpoint, timeout=30) as client:
            await client.run(FLOOD, {"count": 1})
            before = daemon.memory_info().rss
            with anyio.fail_after(300):
                handles = await client.submit_many(FLOOD, [{"count": events}] * turns)
                for handle in handles:
                    assert (await handle.result()).outcome == "completed"
            grown = await rss_under(daemon, before + 40 * 2**20) - before
            newest, oldest = await _replay(handles[-1]), await _replay(handles[0])
    print(f"daemon RSS +{grown / 2**20:.1f} MiB after {turns} turns of {events} events")
    assert grown < 40 * 2**20, grown
    assert newest == [{"i": i, "p": "p" * 16} for i in range(events)]
    assert len(oldest) == 2 and isinstance(oldest[0], EventsDropped), oldest[:3]
    assert (oldest[0].count, oldest[0].first, oldest[1]) == (events - 1, 0, {"i": events - 1, "p": "p" * 16})


MIB_INPUT = "x" * (2**20 + 64)  # encodes to just over 1 MiB
LONG = "tests.agents.client:wait_for_cancel"


async def test_inputs_past_max_input_mb_are_refused_until_turns_end() -> None:
    """``max_input_mb=4``: a running turn and two queued ones hold just over 3 MiB of inputs; a fourth
    1 MiB input (or a ``submit_many`` of two) is refused with ``QueueFull`` naming the budget, changing
    nothing (the queue as it was, no turn made); an input larger than the budget is a ``ValueError``;
    once the running turn ends its input is released and the same submit is accepted."""
    async with Supervisor(workers=1, spares=0, max_input_mb=4, prefetch=1) as sup:
        running = await sup.submit(LONG, MIB_INPUT)
        await first_event(running)
        queued = [await sup.submit("examples.agents:echo", MIB_INPUT) for _ in range(2)]
        before = await sup.status()
        assert before["memory"]["inputs_mb"] == 3.0 and before["memory"]["max_input_mb"] == 4.0, before
        with pytest.raises(QueueFull, match="max_input_mb"):
            await sup.submit("examples.agents:echo", MIB_INPUT)
        with pytest.raises(QueueFull):  # refused at its first input: the plain error, nothing accepted
            await sup.submit_many("examples.agents:echo", [MIB_INPUT, MIB_INPUT])
        with pytest.raises(ValueError, match="max_input_mb is 4"):
            await sup.submit("examples.agents:echo", "x" * (5 * 2**20))
        after = await sup.status()
        assert (after["queue"], after["running"]) == (before["queue"], before["running"]) == (2, 1), after
        assert await running.cancel() == {"kind": "user"}
        with anyio.fail_after(60):
            assert (await running.result()).outcome == "aborted"
            late = await sup.submit("examples.agents:echo", MIB_INPUT)
            for handle in [*queued, late]:
                assert (await handle.result()).output == MIB_INPUT
        assert sup.input_bytes == 0  # every input given back at its turn's end
        assert (await sup.status())["memory"]["inputs_mb"] == 0
        disposed = [await sup.submit(LONG, MIB_INPUT), await sup.submit("examples.agents:echo", MIB_INPUT)]
    assert [(await h.result()).cause for h in disposed] == [{"kind": "disposed"}] * 2
    assert sup.input_bytes == 0  # disposal ends them too: nothing is held


async def test_a_daemon_refuses_inputs_past_its_budget_with_queue_full() -> None:
    """``serve --max-input-mb 3``: a client's third 1 MiB input while two turns hold theirs gets
    ``QueueFull`` (code ``queue_full``); one larger than the budget gets a ``ValueError``; after the
    turns end the daemon takes it."""
    with serving(*FAST, "--no-journal", "--max-input-mb", "3") as d:
        async with Client.connect(d.endpoint, timeout=30) as client:
            held = [await client.submit(LONG, MIB_INPUT) for _ in range(2)]
            with pytest.raises(QueueFull, match="max_input_mb"):
                await client.submit("examples.agents:echo", MIB_INPUT)
            with pytest.raises(ValueError, match="max_input_mb is 3"):
                await client.submit("examples.agents:echo", "x" * (4 * 2**20))
            for handle in held:
                await handle.cancel()
            with anyio.fail_after(60):
                for handle in held:
                    assert (await handle.result()).outcome == "aborted"
                assert (await client.run("examples.agents:echo", MIB_INPUT)).output == MIB_INPUT


async def test_ended_turns_outputs_are_kept_within_keep_results_mb_newest_first() -> None:
    """10 turns returning 1 MiB each under ``keep_results_mb=4``: the newest results are answered by
    id, the oldest forgotten (``UnknownTurn``), at most 4 MiB of them kept; a handle still held keeps
    its own result (API-HANDLE-KEEPS), whatever the budget forgot."""
    async with Supervisor(workers=2, spares=0, keep_results_mb=4) as sup:
        held = await sup.submit("examples.agents:echo", MIB_INPUT)
        with anyio.fail_after(120):
            ids = [(await sup.run("examples.agents:echo", MIB_INPUT)).turn_id for _ in range(10)]
        answered = []
        for turn_id in ids:
            try:
                answered.append((await sup.result(turn_id)).output == MIB_INPUT)
            except UnknownTurn:
                answered.append(False)
        first = answered.index(True)
        assert answered[first:] == [True] * (10 - first), answered  # the newest, in a row
        assert 1 <= 10 - first <= 4, answered
        assert (await held.result()).output == MIB_INPUT


def test_the_supervisors_byte_budget_defaults_are_the_tables() -> None:
    """``Supervisor``'s ``keep_events_mb`` and ``keep_results_mb`` defaults are written out in its
    signature; they are the turn table's budgets."""
    defaults = inspect.signature(Supervisor).parameters
    assert defaults["keep_events_mb"].default * 2**20 == sup_lowlevel.KEEP_EVENT_BYTES
    assert defaults["keep_results_mb"].default * 2**20 == sup_lowlevel.KEEP_RESULT_BYTES
