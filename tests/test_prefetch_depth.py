"""The adaptive prefetch depth survives turns that take no measurable time.

Turns whose ``Started`` and ``End`` frames are handled in one pass measure 0 s (one clock reading
per pass); the running mean of turn times then decays towards 0, and the depth computed from it
(``window / mean``) overflowed after ~3,000 such turns in a row: the frame handler raised on every
``End`` from then on and every turn of the pool hung (seen on a Ray node running 5,000 no-ops).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.anyio


async def test_thousands_of_instant_turns_all_end() -> None:
    """Promise: a pool running thousands of back-to-back no-op turns (many measured at 0 s) ends
    every one of them; the prefetch depth never breaks the frame handler."""
    n = 6000
    async with Supervisor(workers=1, spares=0, prefetch=64, agent_path=[str(ROOT)]) as sup:
        with anyio.fail_after(120):
            handles = [await sup.submit("examples.agents:noop") for _ in range(n)]
            results = [await h.result() for h in handles]
    zero = sum(1 for r in results if r.run_s == 0.0)
    assert [r.outcome for r in results] == ["completed"] * n, f"{zero} of {n} turns measured 0 s"
