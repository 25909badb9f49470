"""The soak, reduced for CI: a few thousand turns with random cancels, deadlines, crashes and
stubborn agents from several concurrent submitters (``make soak`` runs the full one)."""

from __future__ import annotations

import pytest

from tests.support.soak import soak

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


@pytest.mark.slow
async def test_daemon_soak_sigkill_every_acked_turn_ends_once_and_runs_at_most_once() -> None:
    """``turnpool serve`` with its journal, SIGKILLed at random points under load and restarted:
    every acknowledged turn ends exactly once, none runs twice (the agents count their own
    executions), lost acknowledgements resubmitted with the same id do not run again, async
    agents that never await are still killed, and nothing the daemon or an agent started (a
    fork-without-exec background process included) is left alive."""
    from tests.support.soak_daemon import daemon_soak, markdown

    report = await daemon_soak(500, kills=3, submitters=4, vanish_per_round=50)
    assert report.kills == 3
    assert report.ok, markdown(report, "tests/test_soak.py")
    assert report.acked == 500 and sum(report.outcomes.values()) == 500
