"""The Ray backend's placement rules as pure functions (no cluster): turn ids name their node,
and rendezvous hashing moves only what a joining node wins (RAY-IDS, RAY-SESSIONS)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")

from supervisor.ray.placement import new_turn_id, node_key, node_of, rendezvous

KEYS = [node_key(f"{i:02x}" * 28) for i in range(1, 5)]


def test_a_router_made_turn_id_names_its_node_and_a_callers_does_not() -> None:
    """Promise: ``node_of`` finds the node in every id the router makes, and never in a caller's."""
    for key in KEYS:
        assert node_of(new_turn_id(key)) == key
    for caller in ["job-1", "abc.def", KEYS[0] + ".xyz", "", KEYS[0] + "." + "0" * 17]:
        assert node_of(caller) is None


def test_a_joining_node_takes_only_the_sessions_it_wins() -> None:
    """Promise: with rendezvous hashing a new node takes sessions only for itself; every other
    session keeps its node (so only sessions moving to the new node ever change node)."""
    sessions = [f"s{i}" for i in range(2000)]
    before = {s: rendezvous(s, KEYS[:3]) for s in sessions}
    after = {s: rendezvous(s, KEYS) for s in sessions}
    moved = [s for s in sessions if before[s] != after[s]]
    assert moved and all(after[s] == KEYS[3] for s in moved)
    assert 0.15 < len(moved) / len(sessions) < 0.35  # about a quarter: the new node's share
    # A lost node gives up only its own sessions.
    lost = {s: rendezvous(s, KEYS[1:]) for s in sessions}
    assert all(lost[s] == after[s] for s in sessions if after[s] != KEYS[0])


def test_no_node_to_choose_from_is_an_error() -> None:
    """Promise: placing with no live node raises at once instead of picking nothing."""
    with pytest.raises(LookupError):
        rendezvous("s", [])
