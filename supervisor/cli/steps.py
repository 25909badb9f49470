"""``--steps`` for ``turnpool result`` and ``turnpool history`` (LOOP-STEP-INSPECT): a turn's step records as
its journal holds them: each model step and each tool call's state (``not_started``, ``started``,
``completed``, ``not_recorded``), so an operator sees which calls completed before a crash."""

from __future__ import annotations

from typing import Any


def turn_steps(path: str, turn_id: str) -> list[dict[str, Any]]:
    """The turn's steps (``describe``'s shape), read-only from the journal at ``path``."""
    from ..journal.steps import view_steps  # here: only the journal commands read steps

    return view_steps(path, turn_id)


def summary(steps: list[dict[str, Any]]) -> str:
    """One cell for ``history --steps``: ``4 steps; calls: 2 completed, 1 started``."""
    if not steps:
        return ""
    states: dict[str, int] = {}
    for step in steps:
        for call in step.get("calls", ()):
            states[call["state"]] = states.get(call["state"], 0) + 1
    calls = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    model = sum(1 for s in steps if "calls" in s)
    return f"{model} steps" + (f"; calls: {calls}" if calls else "")
