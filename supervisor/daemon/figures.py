"""Per-agent figures of ended turns for the dashboard (``GET /v1/agents``), kept by the daemon.

``AgentRing`` keeps outcome counts and log-binned queue and run times per agent in 10-second slots
over the last hour: one O(1) update per ended turn, a bounded size whatever the number of turns,
and a read that merges at most 360 slots (no pass over the history per request).
"""

from __future__ import annotations

import collections
import math
import time
from typing import TYPE_CHECKING, Any

from wire import TurnResult

if TYPE_CHECKING:
    from .._engine.turns import TurnRecord

OUTCOMES = ("completed", "failed", "aborted", "killed", "crashed")
SIGNALS = {-9: "sigkill", -15: "sigterm"}


def kill_reason(outcome: str | None, cause: str | None, exit_code: int | None) -> str | None:
    """Why a killed turn was killed, in one line: its cause and the escalation step that ended it
    (the signal, from the worker's exit status), e.g. ``user: sigkill`` or ``timeout: sigterm``."""
    if outcome != "killed":
        return None
    step = "killed" if exit_code is None else SIGNALS.get(exit_code, f"exit {exit_code}")
    return f"{cause or 'no cause'}: {step}"


_BASE = 1e-4  # seconds: the histograms' first bin edge
_GROWTH = 1.1  # each bin 10 % wider than the last: percentiles are exact to within 10 %
_BINS = 200  # up to ~5 h; longer lands in the last bin


def _bin(seconds: float) -> int:
    if not seconds > _BASE:  # NaN too: an end hook must never raise
        return 0
    return min(_BINS - 1, int(math.log(min(seconds, 1e9) / _BASE, _GROWTH)) + 1)


def _edge(index: int) -> float:
    """The upper edge of bin ``index`` (seconds)."""
    return _BASE * _GROWTH**index


class _Cell:
    __slots__ = ("outcomes", "queue", "run")

    def __init__(self) -> None:
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.queue: collections.Counter[int] = collections.Counter()
        self.run: collections.Counter[int] = collections.Counter()


class AgentRing:
    """Ended turns per agent in ``slot``-second slots over the last ``slots * slot`` seconds: outcome
    counts and log-binned queue and run times. Bounded: ``slots`` slots, ``max_agents`` names in
    each (the rest counted as ``other``), ``_BINS`` bins per histogram."""

    def __init__(self, slot: float = 10.0, slots: int = 360, max_agents: int = 50) -> None:
        self.slot = slot
        self.slots: collections.deque[tuple[int, dict[str, _Cell]]] = collections.deque()
        self.keep = slots
        self.max_agents = max_agents
        self.agents: set[str] = set()

    def add(self, turn: TurnRecord, result: TurnResult) -> None:
        index = int((result.ended_at or time.time()) // self.slot)
        slots = self.slots
        if not slots or slots[-1][0] < index:
            slots.append((index, {}))
            while slots[0][0] <= index - self.keep:
                slots.popleft()
        cells = slots[-1][1]  # an end stamped a little earlier than the last slot joins it
        agent = result.agent or turn.agent
        if agent not in self.agents:
            if len(self.agents) >= self.max_agents:
                agent = "other"
            else:
                self.agents.add(agent)
        cell = cells.get(agent)
        if cell is None:
            cell = cells[agent] = _Cell()
        cell.outcomes[result.outcome] += 1
        if result.started:
            cell.queue[_bin(result.queued_s)] += 1
            cell.run[_bin(result.run_s)] += 1

    def figures(self, seconds: float, now: float) -> dict[str, dict[str, Any]]:
        """Per agent over the last ``seconds`` (to within one slot): counts by outcome and the p50 and
        p99 of queue and run time (seconds; ``None`` if no turn of it started)."""
        first = int((now - seconds) // self.slot) + 1
        merged: dict[str, _Cell] = {}
        for index, cells in self.slots:
            if index < first:
                continue
            for agent, cell in cells.items():
                into = merged.get(agent)
                if into is None:
                    into = merged[agent] = _Cell()
                into.outcomes.update(cell.outcomes)
                into.queue.update(cell.queue)
                into.run.update(cell.run)
        out = {}
        for agent in sorted(merged):
            cell = merged[agent]
            out[agent] = {
                "turns": sum(cell.outcomes.values()),
                "outcomes": {o: cell.outcomes.get(o, 0) for o in OUTCOMES},
                "queue_p50": _percentile(cell.queue, 0.5),
                "queue_p99": _percentile(cell.queue, 0.99),
                "run_p50": _percentile(cell.run, 0.5),
                "run_p99": _percentile(cell.run, 0.99),
            }
        return out


def _percentile(hist: collections.Counter[int], q: float) -> float | None:
    total = sum(hist.values())
    if not total:
        return None
    rank = q * total
    seen = 0
    for index in sorted(hist):
        seen += hist[index]
        if seen >= rank:
            return round(_edge(index), 6)
    return None  # not reached
