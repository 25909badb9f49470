"""The turn policy alone: admission, queue-depth arithmetic, a turn's moves, first cause wins and the
escalation ladder's timing, driven through the engine's parts (``supervisor.policy``) with a fake link
(a send callback that records), a fake pool (slots in a dict) and a manual clock. No process, no
socket, no event loop: the whole file runs in milliseconds (TURN-STATES). The process-level tests
(test_foundation, test_semantics, test_timers, …) hold the same rules end to end."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from supervisor import QueueFull, SupervisorClosed, TurnIdConflict, policy
from wire import DEADLINE, DISPOSED, PARENT, USER, worker_link

_PIDS = itertools.count(10_000_000)  # above any pid_max: nothing here may ever reach a process
_INPUT = msgspec.Raw(msgspec.msgpack.encode({"q": 1}))


@pytest.fixture(autouse=True)
def no_leftover_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In place of conftest's check of leftover processes (a walk of /proc, ≈ 0.2 s a test under load,
    forty times what a test here takes): nothing here may start or signal a process at all."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a unit test of the turn policy started or signalled a process")

    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "kill", "killpg", "pidfd_open"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refused)
    monkeypatch.setattr(subprocess.Popen, "__init__", refused)
    yield


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakePool:
    """What the parts use of ``WorkerPool``: its slots, retiring, filling, start notes, the share."""

    def __init__(self) -> None:
        self.slots: dict[str, policy.WorkerSlot] = {}
        self.retired: list[str] = []
        self.fills: list[int] = []
        self.noted: dict[str, tuple[str, float]] = {}
        self.zygote = None

    def retire(self, slot: policy.WorkerSlot) -> None:
        slot.state = "stopping"
        self.retired.append(slot.id)

    def fill(self, target: int, *, spares: int = 0) -> None:
        self.fills.append(target)

    def read_noted(self, slot: policy.WorkerSlot) -> tuple[str, float] | None:
        return self.noted.get(slot.id)

    def settle(self, slot: policy.WorkerSlot) -> None:
        """WORKER-SHARE-AT-CANCEL: a slot idle again (no autogroups here)."""


class Engine:
    """The policy parts wired as ``Supervisor.__init__`` wires them, around fakes."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("workers", 2)
        options.setdefault("prefetch", 1)
        self.clock = Clock()
        self.options = policy.EngineOptions(**options)
        self.timers = policy.Timers(self.clock)
        table = policy.TurnTable(self.options.keep_results, self.options.max_events)
        self.book = book = policy.TurnBook(table, policy.TurnQueue())
        book.phase = "running"
        self.hooks = hooks = policy.Hooks()
        self.sent: list[tuple[str, Any]] = []
        self.signals: list[tuple[int, int]] = []
        self.pool = pool = FakePool()
        timers = self.timers
        send = self.send
        self.finisher = policy.Finisher(book, hooks, send, timers)
        self.dispatcher = policy.Dispatcher(book, self.options, pool, send, timers, hooks)  # type: ignore[arg-type]
        self.escalation = policy.Escalation(
            book, pool.slots, send, timers, hooks, self.dispatcher, self.finisher, self.signal_tree
        )
        self.finisher.connect(escalation=self.escalation, dispatcher=self.dispatcher)
        self.dispatcher.connect(finisher=self.finisher, escalation=self.escalation)
        no_zygote = lambda: None  # noqa: E731 - the probe's zygote: none, no agent is probed here
        self.admission = policy.Admission(book, self.options, hooks, self.dispatcher, timers, "t", no_zygote)
        self.children = policy.ChildTurns(book, send, self.admission, self.escalation, self.dispatcher)
        self.workers = [self.add_worker() for _ in range(self.options.workers)]

    # the fake link and the fake process tree
    def send(self, slot: policy.WorkerSlot, msg: Any) -> None:
        self.sent.append((slot.id, msg))

    def signal_tree(self, pid: int, sig: int, known: Any = None) -> None:
        self.signals.append((pid, sig))

    def kinds(self, turn_id: str) -> list[str]:
        """The names of the messages sent about ``turn_id``, in order."""
        return [type(m).__name__ for _, m in self.sent if getattr(m, "turn_id", None) == turn_id]

    # what the supervisor's handlers do on a worker's messages
    def add_worker(self) -> policy.WorkerSlot:
        n = len(self.pool.slots) + 1
        slot = policy.WorkerSlot(worker_id=f"w{n}", pid=next(_PIDS), fd=None, token="", marker="", now=0.0)
        slot.state = "idle"
        self.pool.slots[slot.id] = slot
        self.dispatcher.idle.append(slot)
        self.dispatcher.pump()
        return slot

    def submit(self, **kw: Any) -> policy.TurnRecord:
        args: dict[str, Any] = {
            "session": None,
            "timeout": None,
            "grace": None,
            "kill_after": None,
            "turn_id": None,
            "parent": None,
        }
        args.update(kw)
        return self.admission.accept("agents.demo:echo", _INPUT, **args)

    def started(self, turn: policy.TurnRecord) -> None:
        slot = turn.worker
        assert slot is not None
        assert self.dispatcher.started_ahead(slot, turn.id)

    def ended(self, turn: policy.TurnRecord, outcome: str = "completed") -> None:
        slot = turn.worker
        assert slot is not None and slot.turn is turn
        slot.turn = None
        slot.turns_run += 1
        assert turn.started_at is not None
        self.dispatcher.note_turn_time(self.clock() - turn.started_at)
        self.finisher.finish(turn, outcome, worker_pid=slot.pid)
        self.dispatcher.after_turn(slot)

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        self.timers.fire_due()


# ---- a turn's moves --------------------------------------------------------------------------


STATES = ("queued", "handed", "running", "ending", "ended", "kept")


def _record(state: str) -> policy.TurnRecord:
    turn = policy.TurnRecord(
        turn_id="x",
        agent="a:b",
        input=_INPUT,
        session=None,
        parent=None,
        timeout=None,
        grace=1.0,
        kill_after=1.0,
        now=0.0,
    )
    turn.state = state  # type: ignore[assignment]  # (setting up each state to move from)
    return turn


@pytest.mark.parametrize("src", STATES)
def test_every_move_the_table_allows_is_made_and_every_other_is_refused(src: str) -> None:
    assert set(policy.MOVES) == set(STATES)
    for dst in STATES:
        turn = _record(src)
        if dst in policy.MOVES[src]:
            policy.move(turn, dst)  # type: ignore[arg-type]
            assert turn.state == dst
        else:
            with pytest.raises(policy.IllegalMove):
                policy.move(turn, dst)  # type: ignore[arg-type]
            assert turn.state == src


def test_ended_and_kept_are_final() -> None:
    assert policy.MOVES["ended"] == frozenset() and policy.MOVES["kept"] == frozenset()


def test_a_turn_goes_queued_handed_running_ended_through_the_parts() -> None:
    eng = Engine(workers=1)
    turn = eng.submit()
    assert turn.state == "handed" and eng.kinds(turn.id) == ["Run"]  # an idle worker took it at once
    eng.started(turn)
    assert turn.state == "running" and turn.started and eng.book.running == 1
    eng.ended(turn)
    assert turn.state == "ended" and turn.result is not None and turn.result.outcome == "completed"
    assert (eng.book.active, eng.book.running, eng.book.queued()) == (0, 0, 0)


# ---- admission -------------------------------------------------------------------------------


def test_admission_refuses_past_max_queue_counting_handed_turns_and_readmits_beyond_it() -> None:
    eng = Engine(workers=1, max_queue=3)
    first = eng.submit()  # handed to the idle worker: still counts as queued (TURN-HANDED)
    assert first.state == "handed"
    eng.submit()
    eng.submit()
    assert eng.book.queued() == 3
    with pytest.raises(QueueFull):
        eng.submit()
    readmitted = eng.submit(readmit=True)  # JOURNAL-RECOVERY: a turn already promised is never refused
    assert readmitted.state == "queued" and eng.book.queued() == 4


def test_a_known_turn_id_returns_its_record_and_another_request_under_it_is_refused() -> None:
    eng = Engine()
    turn = eng.submit(turn_id="mine")
    assert eng.submit(turn_id="mine") is turn
    with pytest.raises(TurnIdConflict):
        eng.submit(turn_id="mine", session="other")
    assert eng.book.active == 1


def test_admission_refuses_when_closing_and_a_grace_above_max_grace() -> None:
    eng = Engine(max_grace=10.0)
    with pytest.raises(ValueError):
        eng.submit(grace=11.0)
    eng.book.phase = "closing"
    with pytest.raises(SupervisorClosed):
        eng.submit()
    assert eng.book.active == 0 and eng.book.queued() == 0


def test_the_input_budget_counts_inputs_until_their_turn_ends() -> None:
    eng = Engine(workers=1, max_input_bytes=2 * len(_INPUT))
    one = eng.submit()
    eng.submit()
    assert eng.book.input_bytes == 2 * len(_INPUT)
    with pytest.raises(QueueFull):
        eng.submit()
    eng.started(one)
    eng.ended(one)
    assert eng.book.input_bytes == len(_INPUT)
    eng.submit()


def test_behind_the_dispatch_gate_a_turn_is_handed_only_once_both_its_rows_are_committed() -> None:
    eng = Engine(workers=1)
    asked: list[policy.TurnRecord] = []
    eng.dispatcher.gate = asked.extend  # JOURNAL-GATE: the journal's gate, asked to clear written turns
    turn = eng.submit()
    assert turn.state == "queued" and asked == []  # its accept row is not even written
    eng.dispatcher.written(turn)  # JOURNAL-GATE-SHARE: written, not committed: the gate may clear it already
    assert asked == [turn] and turn.clearing and turn.state == "queued"
    policy.gate_cleared(turn)
    eng.dispatcher.pump()
    assert turn.state == "queued"  # cleared, but its accept row is not committed yet
    policy.gate_recorded(turn)
    eng.dispatcher.pump()
    assert turn.state == "handed" and eng.kinds(turn.id) == ["Run"]


# ---- queue-depth arithmetic --------------------------------------------------------------------


def _check_counts(eng: Engine) -> None:
    records = list(eng.book.table.records.values())
    waiting = sum(t.state in ("queued", "handed") for t in records)
    assert eng.book.queued() == waiting
    assert eng.book.running == sum(t.state == "running" for t in records)
    assert eng.book.active == sum(t.state in ("queued", "handed", "running", "ending") for t in records)
    assert eng.book.handed == sum(len(s.ahead) for s in eng.pool.slots.values())


@pytest.mark.parametrize("seed", range(5))
def test_queue_depth_matches_the_turns_waiting_through_every_step(seed: int) -> None:
    """Submits, starts, ends, cancels (queued, handed, running) and revokes in a random order, with
    prefetch on: after every step the queue depth is exactly the turns queued or handed ahead, and
    ``QueueFull`` comes exactly at ``max_queue``."""
    rng = random.Random(seed)
    eng = Engine(workers=3, prefetch=4, max_queue=12)
    for _ in range(600):
        live = [t for t in eng.book.table.records.values() if t.state in ("queued", "handed", "running")]
        op = rng.random()
        if op < 0.35:
            full = eng.book.queued() >= eng.options.max_queue
            try:
                eng.submit()
            except QueueFull:
                assert full
            else:
                assert not full
        elif op < 0.55:
            heads = [s.ahead[0] for s in eng.pool.slots.values() if s.turn is None and s.ahead]
            if heads:
                eng.started(rng.choice(heads))
        elif op < 0.75:
            running = [s.turn for s in eng.pool.slots.values() if s.turn is not None and s.turn.cause is None]
            if running:
                eng.ended(rng.choice(running))
        elif op < 0.9 and live:
            turn = rng.choice(live)
            eng.escalation.cancel(turn, USER)
            if turn.state == "handed" and turn.worker is not None and turn.worker.turn is not turn:
                assert eng.dispatcher.revoked(turn.worker, turn.id)  # its worker drops it unstarted
            elif turn.state == "running":
                eng.ended(turn, "aborted")  # the agent honoured the Abort within grace
        else:
            behind = [(s, t) for s in eng.pool.slots.values() for t in list(s.ahead)[1:]]
            if behind:
                slot, turn = rng.choice(behind)
                assert eng.dispatcher.revoked(slot, turn.id)  # given back unstarted: queued again
        _check_counts(eng)
    assert not eng.signals  # every cancel was honoured within grace: no ladder step was needed


# ---- first cause wins ----------------------------------------------------------------------------


def test_first_cause_wins_and_the_result_carries_it() -> None:
    eng = Engine(workers=1)
    turn = eng.submit()
    eng.started(turn)
    assert eng.escalation.cancel(turn, DEADLINE) == DEADLINE
    assert eng.escalation.cancel(turn, USER) == DEADLINE
    assert eng.kinds(turn.id).count("Abort") == 1  # a repeated cancel sends nothing more
    eng.ended(turn, "aborted")
    assert turn.result is not None and turn.result.cause == DEADLINE
    assert eng.escalation.cancel(turn, USER) == DEADLINE  # an ended turn keeps its cause


def test_a_queued_turn_cancelled_ends_aborted_unstarted_and_nothing_is_sent() -> None:
    eng = Engine(workers=1)
    eng.submit()  # takes the only worker
    queued = eng.submit()
    assert queued.state == "queued"
    eng.escalation.cancel(queued, USER)
    assert queued.state == "ended" and queued.result is not None
    assert (queued.result.outcome, queued.result.started) == ("aborted", False)
    assert eng.kinds(queued.id) == [] and eng.book.queued() == 1


def test_disposal_wins_over_an_earlier_cause() -> None:
    eng = Engine(workers=1)
    turn = eng.submit()
    eng.started(turn)
    eng.escalation.cancel(turn, USER)
    eng.book.disposing = True
    eng.ended(turn, "aborted")
    assert turn.result is not None and turn.result.cause == DISPOSED


def test_a_parent_result_waits_for_its_live_child_which_is_cancelled_with_cause_parent() -> None:
    eng = Engine(workers=2)
    parent = eng.submit()
    eng.started(parent)
    child = eng.submit(parent=parent.id)
    parent.add_child(child.id)
    eng.started(child)
    eng.ended(parent)  # the parent's code returned while its child still runs
    assert parent.state == "ending" and parent.result is None
    assert child.cause == PARENT and "Abort" in eng.kinds(child.id)
    eng.ended(child, "aborted")
    assert child.state == "ended" and parent.state == "ended"
    assert parent.result is not None and parent.result.outcome == "completed"


# ---- the ladder's timing ---------------------------------------------------------------------------


def test_the_ladder_sends_sigterm_after_grace_and_sigkill_after_kill_after() -> None:
    eng = Engine(workers=1, grace=1.0, kill_after=2.0)
    turn = eng.submit()
    eng.started(turn)
    slot = turn.worker
    assert slot is not None
    eng.escalation.cancel(turn, USER)
    assert eng.kinds(turn.id) == ["Run", "Abort"] and eng.signals == []
    eng.advance(0.999)
    assert eng.signals == []
    eng.advance(0.001)
    assert eng.signals == [(slot.pid, signal.SIGTERM)] and turn.escalation == 1
    assert turn.escalated_at == 1.0 and slot.doomed
    eng.advance(1.999)
    assert len(eng.signals) == 1
    eng.advance(0.001)
    assert eng.signals[1:] == [(slot.pid, signal.SIGKILL)] and turn.escalation == 2
    assert eng.escalation.counts == {"sigterm": 1, "sigkill": 1}


def test_an_end_within_grace_stops_the_ladder() -> None:
    eng = Engine(workers=1, grace=1.0)
    turn = eng.submit()
    eng.started(turn)
    eng.escalation.cancel(turn, USER)
    eng.advance(0.5)
    eng.ended(turn, "aborted")
    eng.advance(10.0)
    assert eng.signals == [] and turn.result is not None and turn.result.outcome == "aborted"


def test_kill_now_skips_grace_and_kill_after() -> None:
    eng = Engine(workers=2, grace=5.0, kill_after=5.0)
    cancelled, other = eng.submit(), eng.submit()
    eng.started(cancelled)
    eng.started(other)
    eng.escalation.cancel(cancelled, USER)
    eng.escalation.kill_now()
    assert cancelled.worker is not None
    assert eng.signals == [(cancelled.worker.pid, signal.SIGKILL)]  # only the cancelled turn's tree
    eng.escalation.cancel(other, USER)  # from now on every cancel goes straight to SIGKILL
    eng.advance(0.0)
    assert other.worker is not None and eng.signals[-1] == (other.worker.pid, signal.SIGKILL)


def test_the_deadline_counts_from_the_start_and_cancels_with_cause_deadline() -> None:
    eng = Engine(workers=1, grace=1.0)
    eng.submit()  # takes the only worker
    turn = eng.submit(timeout=3.0)
    eng.advance(10.0)  # queued: no deadline runs yet
    assert turn.cause is None
    first = next(t for t in eng.book.table.records.values() if t is not turn)
    eng.started(first)
    eng.ended(first)  # the worker takes the next turn now
    eng.started(turn)
    eng.advance(2.999)
    assert turn.cause is None
    eng.advance(0.001)
    assert turn.cause == DEADLINE and "Abort" in eng.kinds(turn.id)


def test_a_handed_turn_cancelled_is_escalated_once_its_start_marker_shows_it_running() -> None:
    """LADDER-EARLY: a turn cancelled while handed ahead (its Started not seen) has its ladder armed at the
    cancel; at each step the start marker is read: not started yet, the step is looked at again a grace later;
    once the marker names it, it runs from the noted time and the ladder goes on from there."""
    eng = Engine(workers=1, grace=1.0, kill_after=1.0)
    turn = eng.submit()
    slot = turn.worker
    assert slot is not None and turn.state == "handed"
    eng.escalation.cancel(turn, USER)
    assert eng.kinds(turn.id) == ["Run", "Abort"]
    eng.advance(1.0)  # grace over, the marker names nothing: looked at again a grace later
    assert eng.signals == [] and turn.state == "handed"
    eng.pool.noted[slot.id] = (turn.id, 1.5)  # the worker noted it started at 1.5 (its Started is stuck)
    eng.advance(1.0)
    assert turn.state == "running" and turn.started_at == 1.5
    assert eng.signals == [(slot.pid, signal.SIGTERM)]
    eng.advance(1.0)
    assert eng.signals[1:] == [(slot.pid, signal.SIGKILL)]


# ---- child turns ------------------------------------------------------------------------------------


def test_a_parent_waiting_on_its_child_lends_its_slot_until_the_child_ends() -> None:
    """TURN-LEND: a child is accepted while its parent runs; the parent lends its worker's place (the pool is
    asked for one worker more) and the turns handed behind it are revoked; the child's result goes
    back to the parent's worker and the place is given back."""
    eng = Engine(workers=1, spares=0)
    parent = eng.submit()
    eng.started(parent)
    behind = eng.submit()  # prefetch off: it waits in the queue, not behind the parent
    slot = parent.worker
    assert slot is not None and behind.state == "queued"
    spawn = worker_link.Spawn(7, parent.id, "agents.demo:echo", _INPUT)
    eng.children.spawn(slot, spawn)
    (child_id,) = parent.children
    child = eng.book.table.get(child_id)
    assert child.parent == parent.id and eng.book.lent == 1
    assert eng.pool.fills[-1] == 2  # workers + spares + the lent place
    assert child.state == "queued"  # behind ``behind``: no second worker is up yet
    eng.add_worker()  # the place lent comes up: the queue's head goes first, in order
    assert behind.state == "handed"
    eng.started(behind)
    eng.ended(behind)
    assert child.state == "handed"
    eng.started(child)
    eng.ended(child)
    replies = [m for sid, m in eng.sent if sid == slot.id and type(m).__name__ == "SpawnReply"]
    assert len(replies) == 1 and replies[0].req == 7 and replies[0].result.turn_id == child.id
    assert eng.book.lent == 0 and not slot.spawns


def test_a_spawn_from_a_cancelled_parent_is_refused_and_nothing_is_accepted() -> None:
    eng = Engine(workers=1)
    parent = eng.submit()
    eng.started(parent)
    slot = parent.worker
    assert slot is not None
    eng.escalation.cancel(parent, USER)
    eng.children.spawn(slot, worker_link.Spawn(1, parent.id, "agents.demo:echo", _INPUT))
    (reply,) = [m for _, m in eng.sent if type(m).__name__ == "SpawnReply"]
    assert reply.error is not None and "cancelled" in reply.error.message
    assert eng.book.active == 1 and eng.book.lent == 0
