"""The soak, reduced for CI: a few thousand turns with random cancels, deadlines, crashes and
stubborn agents from several concurrent submitters (``make soak`` runs the full one)."""

from __future__ import annotations

import pytest

from tests.soak import soak

pytestmark = pytest.mark.anyio

TURNS = 2500


@pytest.mark.slow
async def test_soak_every_turn_one_outcome_nothing_accumulates() -> None:
    """Every turn gets exactly one result with an outcome allowed for its kind; no zombie
    accumulates; the supervisor's fds and RSS level off once the result store is full."""
    report = await soak(TURNS, submitters=8, workers=3, samples=10, keep_results=500)
    assert report.wrong == []
    assert report.deliveries_max == 1 and sum(report.outcomes.values()) == TURNS
    for kind in ("completed", "failed", "aborted", "killed", "crashed"):
        assert report.outcomes[kind] > 0, report.outcomes  # every outcome was exercised
    quarter, last = report.samples[len(report.samples) // 4], report.samples[-1]
    assert last.zombies == 0 and report.max_zombies <= 8
    assert last.fds <= quarter.fds + 8, [s.fds for s in report.samples]
    assert last.rss_mb <= quarter.rss_mb + 40, [round(s.rss_mb) for s in report.samples]
    print(
        f"soak: {TURNS} turns in {report.seconds:.1f}s, outcomes {dict(report.outcomes)}, "
        f"fds {[s.fds for s in report.samples]}, rss {[round(s.rss_mb) for s in report.samples]}"
    )
