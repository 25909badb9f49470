"""A worker slot: one worker process as the supervisor tracks it."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ._timers import Timer
    from ._turns import TurnRecord

SlotState = Literal["starting", "idle", "busy", "stopping", "dead"]


class WorkerSlot:
    __slots__ = (
        "id", "ident", "pid", "fd", "token", "marker", "state", "turn", "turns_run", "known",
        "spawns", "started_at", "ready_at", "timer", "doomed", "exit_code", "failure", "ahead", "out",
        "deferred_ready", "cgroup", "passed",
    )

    def __init__(self, worker_id: str, pid: int, fd: int | None, token: str, marker: str, now: float) -> None:
        self.id = worker_id
        self.ident = worker_id.encode()
        self.pid = pid
        self.fd = fd
        self.token = token
        self.marker = marker
        self.state: SlotState = "starting"
        self.turn: TurnRecord | None = None  # the turn it reported Started for
        # Turns handed ahead (prefetched), in the order the worker will start them. They still
        # count as queued until the worker reports Started.
        self.ahead: collections.deque[TurnRecord] = collections.deque()
        self.out: list[Any] = []  # messages batched for one frame (flushed by the supervisor)
        self.turns_run = 0
        self.known: set[int] = set()  # descendants seen when the tree was frozen
        self.spawns: dict[int, str] = {}  # spawn request id -> child turn id
        self.started_at = now
        self.ready_at: float | None = None
        self.timer: Timer | None = None  # start-up deadline, or the stop deadline when retiring
        self.doomed = False  # escalation began: never goes back to idle
        self.exit_code: int | None = None
        self.deferred_ready: Any = None  # a Ready that came before the zygote's report of the pid
        self.failure: str | None = None  # why it was killed before it was ready, if we know
        self.cgroup: str | None = None  # its own cgroup v2 directory, where the pool has one
        # Handed turns the worker went past (its start marker names a later one, rule S1): their
        # Started and End may still come, and are then taken as theirs.
        self.passed: set[str] = set()

    @property
    def inflight(self) -> int:
        return len(self.ahead) + (self.turn is not None)

    @property
    def live(self) -> bool:
        return self.state in ("starting", "idle", "busy")

    def __repr__(self) -> str:
        return f"WorkerSlot({self.id}, pid={self.pid}, {self.state})"
