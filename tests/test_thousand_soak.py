"""The thousand-turn soak scaled down (``benchmarks/soak_thousand.py``; ``make soak-thousand`` runs
1,000 turns for 5 minutes): many concurrent I/O-bound streaming turns through a daemon while its
status and dashboard are read. Behaviour only: no event lost, every turn completed, every status
and dashboard read answered, the live list showing the running turns. Figures come from the soak."""

from __future__ import annotations

import anyio
import pytest

from benchmarks import soak_thousand

pytestmark = pytest.mark.anyio


async def test_many_streaming_turns_through_a_daemon_lose_nothing_while_status_and_dashboard_answer() -> None:
    turns = 24
    with anyio.fail_after(180):
        r = await soak_thousand.soak(turns, 6.0, sample=1.0)
    assert r["lost"] == 0, r
    assert r["outcomes"] == {"completed": turns}, r
    assert r["samples"] >= 2, r
    assert r["live_rows"] == turns, r
    assert r["rss_mib_max"] > 0, r
