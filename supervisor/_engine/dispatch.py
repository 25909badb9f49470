"""Dispatch: which worker gets which queued turn, and when.

``Dispatcher`` owns the dispatch state (idle workers, busy ones in order, the count of turns
handed ahead, the adaptive prefetch depth) and the rules that use it: one turn to each idle
worker first, then prefetching up to ``prefetch`` turns per worker while turns are short
(``prefetch_window``), rebalancing when a handed-ahead turn would wait behind a busy worker while
another is free, the journal's dispatch gate (JOURNAL-GATE), and the start marker (LADDER-EARLY) that tells a
turn started although its ``Started`` never came. It also keeps the pool at its size (``refill``).

Its collaborators: the ``TurnBook`` (queue, counters), the ``EngineOptions``, the pool (its slots,
retiring, start notes), the send callback, the timers and the hooks (``start``); once wired
(``connect``), the ``Finisher`` (turns given back after a cancel end ``aborted``) and the
``Escalation`` (a started turn's deadline and ladder).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wire import worker_link
from worker import lowlevel

from .ending import output_of
from .states import gate_clearing, gate_written, mark_started, move

if TYPE_CHECKING:
    from .book import TurnBook
    from .ending import Finisher
    from .escalation import Escalation
    from .hooks import Hooks
    from .pool import WorkerPool, WorkerSlot
    from .settings import EngineOptions
    from .steps import StepRecords
    from .timers import Timers
    from .turns import TurnRecord

Send = Callable[["WorkerSlot", Any], None]
# JOURNAL-GATE: what a journal sets to clear written turns for dispatch (``Supervisor.set_dispatch_gate``).
DispatchGate = Callable[[list["TurnRecord"]], None]

log = logging.getLogger("turnpool.supervisor")

# LADDER-HEIR: how long after a doomed worker's exit the supervisor tells a heir that has not started
# its held turn to start it (``Proceed``); a heir that watches the exit itself started long before.
PROCEED_DELAY = 0.01

# JOURNAL-GATE-AHEAD: while turns are short enough to be handed ahead (depth > 1), the dispatch gate clears
# up to this many windows of turns (capacity × depth each): the next window's "may run" rows are
# committed while the workers run the current one, so a worker never waits for a journal commit.
# Long turns (depth 1) get no reserve: at most ``capacity`` turns are cleared, running included.
CLEAR_AHEAD = 2


class Dispatcher:
    """Hands queued turns to workers; see the module docstring."""

    def __init__(
        self,
        book: TurnBook,
        options: EngineOptions,
        pool: WorkerPool,
        send: Send,
        timers: Timers,
        hooks: Hooks,
        steps: StepRecords | None = None,
    ) -> None:
        self.book = book
        self.steps = steps  # LOOP-RESUME: the records a later attempt's Run carries (None: none kept)
        self.options = options
        self.pool = pool
        self.send = send
        self.timers = timers
        self.hooks = hooks
        self.finisher: Finisher | None = None  # set by ``connect``
        self.escalation: Escalation | None = None
        self.idle: collections.deque[WorkerSlot] = collections.deque()
        self.busy: dict[WorkerSlot, None] = {}  # slots holding a turn (running or handed), in order
        self.turn_time = options.prefetch_window  # EWMA of run times; starts at "too long to prefetch"
        self.depth = 1
        self.pump_wanted = False  # a pump was asked for during a receive batch
        self.defer = False  # inside a receive batch: pump once, at its end
        self.recycling = False  # WORKER-RELOAD: stale workers may still be busy (see ``recycle``)
        # LADDER-HANDOVER: doomed workers (escalation began) whose slot was given up before their exit;
        # their turn still counts in ``_running`` until its ``killed`` result.
        self.released: set[WorkerSlot] = set()
        # JOURNAL-GATE, the dispatch gate. When set (a journal sets it, ``Supervisor.set_dispatch_gate``), a
        # new turn is handed to a worker only once (1) ``mark_recorded(turn)`` says its accept row is
        # committed and (2) the gate, called with a batch of turns from the head of the queue whose
        # accept row is written (JOURNAL-GATE-SHARE: ``written``, committed or not), has answered
        # ``clear_for_dispatch``: a row saying they may run is committed. Intent before effect, in
        # batches (group commit).
        self.gate: DispatchGate | None = None
        # JOURNAL-GATE-RESUME: the head of the ready queue that the gate's walk already went through: its
        # first ``skip`` entries are all cleared (or on their way) or ended, ``live`` of them
        # still queued; ``seen`` is the queue's (taken, dropped, gone, fronts) counts then.
        self.skip = 0
        self.live = 0
        self.seen = (0, 0, 0, 0)
        self.full = False  # JOURNAL-GATE-SHARE: the last walk left no room in the gate's window

    def connect(self, *, finisher: Finisher, escalation: Escalation) -> None:
        """The parts dispatch needs and that need it (built after it): wired once."""
        self.finisher = finisher
        self.escalation = escalation

    def refill(self) -> None:
        """Keep ``workers + spares`` workers live, plus one per slot lent to a waiting parent."""
        if self.book.phase != "running":
            return
        options = self.options
        self.pool.fill(options.workers + options.spares + self.book.lent, spares=options.spares)

    def end_deferral(self) -> None:
        """The receive batch is handled: run the pump it asked for, once."""
        self.defer = False
        if self.pump_wanted:
            self.pump_wanted = False
            self.pump()

    def pump(self) -> None:
        """Hand queued turns to workers: first one to each idle worker (up to ``workers``
        busy at once), then top busy workers up to ``prefetch`` turns each. A turn handed
        ahead must never wait behind a busy worker while another can take it: see ``_rebalance``.

        Inside a receive batch it runs once, at the end of the batch (not once per message)."""
        if self.defer:
            self.pump_wanted = True
            return
        if self.gate is not None:
            self._request_clearance()
        queue = self.book.queue
        if not queue.has_ready():
            if self.book.handed and self.idle:
                self._rebalance()
            return
        idle = self.idle
        busy = self.busy
        cap = self.options.workers + self.book.lent + self._stale_busy()
        while idle and len(busy) < cap:
            slot = idle[0]
            if slot.state != "idle":
                idle.popleft()
                continue
            turn = queue.pop()
            if turn is None:
                return
            idle.popleft()
            slot.state = "busy"
            busy[slot] = None
            self._hand(slot, turn)
        if self.depth > 1 and queue.has_ready():
            self._top_up()

    # LADDER-HANDOVER: a doomed worker's handed turns come back at the kill decision; its slot goes to
    # another worker (a warm spare) the moment its process has exited, before its tree is reaped.
    def take_back_ahead(self, slot: WorkerSlot) -> None:
        """The supervisor decided to kill ``slot``'s worker (its first escalation signal is out):
        the turns handed ahead to it come back to the front of the queue now, when it provably
        cannot start them: its running turn's ``Started`` came over the wire, so that turn's End
        asks for an ``EndAck`` (WORKER-FLUSH) that a doomed worker is never sent (``Supervisor._on_end``),
        and the worker starts no handed turn before it. (A turn known to run only from its start
        marker may end in the same frame as its Started, with no ack to wait for: its worker's
        handed turns stay with it and come back at its exit, as before.)"""
        if not (slot.heard and slot.turn is not None and slot.ahead):
            return
        finisher = self.finisher
        assert finisher is not None
        for turn in reversed(list(slot.ahead)):
            if turn.revoking:
                continue  # its Revoked (or the worker's exit) brings it back, as before
            self.unhand(slot, turn)
            if turn.cause is not None:
                finisher.finish(turn, "aborted")  # cancelled while handed: never started
            else:
                self.book.queue.push(turn, front=True)
        self.pump()

    def release_exited(self, slot: WorkerSlot) -> None:
        """``slot``'s doomed worker process has exited: no agent code of it runs any more (its
        descendants were frozen at the SIGTERM step, LADDER-TERM-FIRST, and are being killed and reaped).
        Its slot goes to another worker now - a warm spare takes the next queued turn while the
        tree is reaped - instead of after the ``killed`` result. Its turn still counts in
        ``_running`` until that result (``released``)."""
        if slot not in self.busy:
            return
        del self.busy[slot]
        self.released.add(slot)
        self._heir_may_start(slot)
        self.pump()

    def exited(self, slot: WorkerSlot) -> None:
        """``slot``'s worker is gone: it holds nothing any more."""
        self.busy.pop(slot, None)
        self.released.discard(slot)
        self._heir_may_start(slot)

    # LADDER-HEIR: at the kill decision a warm spare is handed the next queued turn, held until the
    # doomed worker's process is gone; the spare watches that process itself (its pidfd).
    def hand_to_heir(self, doomed: WorkerSlot) -> None:
        """The kill of ``doomed`` is decided and its handed turns came back (LADDER-HANDOVER): if the
        pool is full only because of it and a warm worker is idle, hand that worker the next
        queued turn now, held: the worker starts it the moment ``doomed``'s process is gone (its
        pidfd, with the pid's start time so a reused pid cannot fool it), not when this
        supervisor has seen the exit and sent a ``Run``. Never more than ``workers`` agents run:
        the held turn starts only after the doomed worker is gone, the same moment its slot is
        given up here (``release_exited``). Until it starts it is a handed turn like any other
        (TURN-HANDED): a cancel ends it ``aborted`` unstarted, its worker's death puts it back in the queue.
        ``doomed`` stays in ``busy`` until its exit, so ``busy`` holds one slot more than the
        pool's capacity meanwhile and ``pump`` hands nothing more."""
        book = self.book
        if (
            doomed.ahead  # (not taken back, LADDER-HANDOVER: its turns come back first, at its exit)
            or doomed.heir_turn is not None
            or doomed not in self.busy
            or book.phase != "running"
            or not book.queue.has_ready()
        ):
            return
        cap = self.options.workers + book.lent + self._stale_busy()
        if len(self.busy) - self._promised() != cap:
            return  # room without this slot (pump hands it), or none even after its exit
        heir = next((s for s in self.idle if s.state == "idle" and not s.doomed and not s.stale), None)
        if heir is None:
            return
        start = lowlevel.start_ticks(doomed.pid)  # our child, not reaped yet: still this process
        if start is None:
            return
        turn = book.queue.pop()
        if turn is None:
            return
        self.idle.remove(heir)
        heir.state = "busy"
        self.busy[heir] = None
        doomed.heir_turn = turn
        self._hand(heir, turn, (doomed.pid, start))

    def _promised(self) -> int:
        """Doomed slots whose place is already promised to a held turn (counted twice in ``busy``)."""
        n = 0
        for slot in self.busy:
            turn = slot.heir_turn
            if turn is not None and turn.worker is not None and turn.state in ("handed", "running"):
                n += 1
        return n

    def _heir_may_start(self, doomed: WorkerSlot) -> None:
        """``doomed``'s process is gone: its heir may start its held turn. It does by itself (it
        watches the same exit, on its own pidfd); ``Proceed`` starts it where it could not watch.
        Sent ``PROCEED_DELAY`` later, and only if the turn has not been seen to start by then: a
        frame sent now would wake the supervisor's and the heir's ZeroMQ threads at the very
        moment the heir starts the turn, on a machine with two cores."""
        turn = doomed.heir_turn
        if turn is None:
            return
        doomed.heir_turn = None
        heir = turn.worker
        if turn.state == "handed" and heir is not None:
            self.timers.call_later(PROCEED_DELAY, self._proceed, heir, turn)

    def _proceed(self, heir: WorkerSlot, turn: TurnRecord) -> None:
        if turn.state == "handed" and turn.worker is heir and heir.state == "busy":
            self.send(heir, worker_link.Proceed(turn.id))

    def note_turn_time(self, run_s: float) -> None:
        t = self.turn_time = self.turn_time + 0.2 * (run_s - self.turn_time)
        window = self.options.prefetch_window
        most = self.options.prefetch
        if t >= window:
            self.depth = 1
        elif t * (most - 1) <= window:
            # Compared, not divided: turns whose Started and End arrive in one pass measure 0 s
            # (one clock reading per pass), so the average decays towards 0 and ``window / t``
            # overflowed (OverflowError, then ZeroDivisionError) after ~3,000 such turns, which
            # broke the frame handler and left every turn of the pool hanging.
            self.depth = most
        else:
            self.depth = 1 + int(window / t)

    def _top_up(self) -> None:
        depth = self.depth
        limit = self.options.max_turns_per_worker
        queue = self.book.queue
        while True:
            gave = False
            for slot in self.busy:
                n = len(slot.ahead) + (slot.turn is not None)
                if n >= depth or slot.doomed or slot.stale:
                    continue
                current = slot.turn
                # Never queue behind a turn being cancelled or waiting on a child it spawned.
                if current is not None and (current.cause is not None or current.children):
                    continue
                if limit is not None and slot.turns_run + n >= limit:
                    continue
                turn = queue.pop()
                if turn is None:
                    return
                self._hand(slot, turn)
                gave = True
            if not gave:
                return

    # TURN-HANDED: a handed turn is still queued until its worker reports it started.
    def _hand(self, slot: WorkerSlot, turn: TurnRecord, after: tuple[int, int] | None = None) -> None:
        move(turn, "handed")
        turn.worker = slot
        slot.ahead.append(turn)
        self.book.handed += 1
        if turn.timeout is not None:
            # LADDER-EARLY: the deadline is armed at handoff; it counts from the start the worker reports
            # or notes in its start marker, whichever the supervisor learns first.
            turn.timer = self.timers.call_later(turn.timeout, self._handed_deadline, turn, slot)
        if turn.attempts > 1 and self.steps is not None:
            # LOOP-RESUME: a later attempt carries the earlier ones' step records
            held = after or (0, 0)
            records = self.steps.for_run(turn)
            run = worker_link.Run(
                turn.id,
                turn.agent,
                turn.input,
                turn.session,
                turn.parent,
                *held,
                turn.trace,
                turn.attempts,
                records,
            )
            self.send(slot, run)
        elif after is None:
            self.send(
                slot,
                worker_link.Run(turn.id, turn.agent, turn.input, turn.session, turn.parent, trace=turn.trace),
            )
        else:  # LADDER-HEIR: held until process ``after`` (pid, start time) is gone
            run = worker_link.Run(
                turn.id, turn.agent, turn.input, turn.session, turn.parent, *after, trace=turn.trace
            )
            self.send(slot, run)

    def _handed_deadline(self, turn: TurnRecord, slot: WorkerSlot) -> None:
        """A handed turn's timeout has passed since handoff and no Started came: if the worker
        noted it started, the deadline counts from then; if not, look again one timeout later
        (it cannot have started before now, so its deadline is at least that far)."""
        if turn.state != "handed" or turn.worker is not slot:
            return
        self.note_marked_start(slot)  # arms the deadline from the noted start
        if turn.state == "handed" and turn.timeout is not None:
            turn.timer = self.timers.call_later(turn.timeout, self._handed_deadline, turn, slot)

    def note_marked_start(self, slot: WorkerSlot) -> TurnRecord | None:
        """LADDER-EARLY: the worker notes each turn in its start marker before any of the turn's code runs.
        If it names a turn handed to this worker whose Started has not arrived (a turn stuck
        before it could send it), that turn is running from the noted time: started, deadline
        counted from then, escalatable. Turns handed before it were passed by the worker: their
        Started and End are still theirs when they come. Returns the turn so found."""
        if slot.turn is not None or not slot.ahead or slot.state == "dead":
            return None
        noted = self.pool.read_noted(slot)
        if noted is None:
            return None
        turn_id, at = noted
        ahead = slot.ahead
        index = next((i for i, t in enumerate(ahead) if t.id == turn_id), -1)
        if index < 0:
            return None
        turn = ahead[index]
        for before in list(ahead)[:index]:
            slot.passed.add(before.id)
        now = self.timers.clock()
        log.info("turn %s: started per worker %s's start marker (no Started yet)", turn.id, slot.id)
        self.start_turn(slot, turn, min(max(at, turn.submitted_at), now))
        return turn

    def start_turn(self, slot: WorkerSlot, turn: TurnRecord, started_at: float) -> None:
        """The turn handed to ``slot`` runs from ``started_at``: arm its deadline (and its
        escalation, if it was cancelled while handed)."""
        slot.ahead.remove(turn)
        self.book.handed -= 1
        turn.revoking = False
        slot.turn = turn
        slot.heard = False  # (set by the Started handler when this start came over the wire)
        move(turn, "running")
        self.book.running += 1
        if turn.timer is not None:  # the handoff deadline (LADDER-EARLY)
            turn.timer.cancel()
            turn.timer = None
        escalation = self.escalation
        assert escalation is not None
        if mark_started(turn, started_at):
            if turn.timeout is not None:
                # LADDER-CAUSES: the deadline counts from the start and cancels with cause deadline.
                turn.timer = self.timers.call_at(started_at + turn.timeout, escalation.deadline, turn)
            for start_hook in self.hooks.start:
                start_hook(turn, slot.pid)
        if turn.cause is not None and turn.esc_timer is None:
            # Cancelled while handed ahead, started before the Abort arrived.
            escalation.arm(turn, slot)

    def unhand(self, slot: WorkerSlot, turn: TurnRecord) -> None:
        """A handed turn leaves its worker unstarted: it is a queued turn again (not in the queue)."""
        with contextlib.suppress(ValueError):
            slot.ahead.remove(turn)
        self.book.handed -= 1
        move(turn, "queued")
        turn.worker = None
        turn.revoking = False
        slot.passed.discard(turn.id)
        if turn.timer is not None:  # the handoff deadline: armed again at the next handoff
            turn.timer.cancel()
            turn.timer = None
        if turn.esc_timer is not None:
            turn.esc_timer.cancel()
            turn.esc_timer = None

    def _stale_busy(self) -> int:
        """WORKER-RELOAD: busy workers that are stale (finishing a turn on old code): they hold no fresh
        worker's place, in the dispatch cap or at the JOURNAL-GATE gate. 0 at once unless a reload is on."""
        if not self.recycling:
            return 0
        stale = sum(1 for s in self.busy if s.stale)
        self.recycling = stale > 0
        return stale

    def recycle(self) -> dict[str, int]:
        """WORKER-RELOAD (``Supervisor.recycle_workers``): every worker that may have imported agent code
        is replaced. Idle ones are retired now; a busy one is marked stale: its running turn
        finishes on it, the turns handed ahead to it are revoked (back to the queue, for fresh
        workers), it takes no new turn and is retired when its turn ends. Stale workers do not
        count as live, so their replacements start at once. A worker still starting imported
        nothing of an agent yet and is kept. Returns ``{"workers": replaced, "busy": stale}``."""
        pool = self.pool
        workers = busy = 0
        for slot in list(pool.slots.values()):
            if slot.state not in ("idle", "busy") or slot.doomed or slot.stale:
                continue
            workers += 1
            if slot.state == "idle":
                pool.retire(slot)
                continue
            busy += 1
            self._make_stale(slot)
            if slot.turn is None and not slot.ahead:
                self.after_turn(slot)
        self.refill()
        self.pump()
        return {"workers": workers, "busy": busy}

    def _make_stale(self, slot: WorkerSlot) -> None:
        """``slot`` takes no new turn and is retired once it holds none (``after_turn``); the turns
        handed ahead to it are revoked (``Revoked`` brings each back to the queue)."""
        slot.stale = True
        self.recycling = True
        for turn in list(slot.ahead):
            self.revoke(slot, turn)

    def revoke(self, slot: WorkerSlot, turn: TurnRecord) -> None:
        """Ask ``slot``'s worker to give back the handed ``turn`` unstarted (``Revoked`` brings it
        back), unless that is asked already or the turn is cancelled (its Abort does)."""
        if not turn.revoking and turn.cause is None:
            turn.revoking = True
            self.send(slot, worker_link.Revoke(turn.id))

    # MEM-RETIRE: memory a worker kept is not the next turn's.
    def retire_if_kept(self, slot: WorkerSlot, turn: TurnRecord | None, turn_id: str) -> None:
        """The End of ``turn_id`` came from ``slot``: if it is the turn it runs, cancelled for memory
        and not being killed, its worker may still hold what put it over ``max_rss_mb`` (a cache, a
        leak: MEM-TRIM hands back only what was freed). It is not reused: the turns handed ahead to it
        are revoked and it is replaced once they are back. Called before the ``EndAck`` goes, so a
        worker waiting for it (WORKER-FLUSH) reads the ``Revoke`` first and starts none of them."""
        if (
            turn is not None
            and turn.cause is not None
            and turn.id == turn_id
            and turn.cause.kind == "memory"
            and not turn.escalation
            and not slot.stale
        ):
            log.info(
                "worker %s (pid %s) ended turn %s cancelled for memory: replaced", slot.id, slot.pid, turn_id
            )
            self._make_stale(slot)
            self.refill()

    def _rebalance(self) -> None:
        """Nothing is queued, a worker could take a turn, yet turns wait handed ahead behind a
        running one: revoke them so they come back to the queue and go to the free worker."""
        if len(self.busy) >= self.options.workers + self.book.lent or not any(
            s.state == "idle" for s in self.idle
        ):
            return
        for slot in self.busy:
            ahead = slot.ahead
            if not ahead:
                continue
            waiting = ahead if slot.turn is not None else list(ahead)[1:]
            for turn in waiting:
                self.revoke(slot, turn)

    def written(self, turn: TurnRecord) -> None:
        """JOURNAL-GATE-SHARE (``Supervisor.mark_written``): the journal has ``turn``'s accept row written -
        handed to it, not committed yet. Every row written from now on commits with that row or
        after it (a batch runs its accept rows before its "dispatched" rows, and batches commit in
        order, one at a time), so the gate may already clear ``turn``: for a turn at the head of an
        idle pool its accept row and its "may run" row share one commit instead of two in a row.
        It is still handed to a worker only once both are committed (``mark_recorded``,
        ``clear_for_dispatch``; ``TurnQueue.pop`` asks for both)."""
        gate_written(turn)
        if turn.state == "queued" and not self.full:
            # (When the last walk found the gate's window full, a pump here is for nothing - 0.5 µs
            # per submit in a burst; the next turn's end pumps, and so does ``mark_recorded``: a
            # turn this skips wrongly only waits for its record, as before JOURNAL-GATE-SHARE.)
            self.pump()

    def _request_clearance(self) -> None:
        """JOURNAL-GATE: ask the gate to clear the written turns at the head of the queue (JOURNAL-GATE-SHARE:
        their accept row handed to the journal, committed or not), as many as the workers could take now
        (running + handed ahead + cleared ≤ capacity × depth), and while turns are short (depth > 1)
        ``CLEAR_AHEAD`` times that (JOURNAL-GATE-AHEAD): with one window only, the workers ran out of cleared
        turns while each clearance waited for its commit (2 workers, journal on: 33k turns/s between the
        commits against 52k/s with no journal).

        JOURNAL-GATE-RESUME: the cleared turns at the head are not walked again at every pump: ``skip`` and
        ``live`` are brought up to date from what the queue counted since the last walk (turns
        taken or dropped from the head, cleared turns cancelled), and the walk goes on from there.
        Only a turn pushed back to the front (rare: a revoked or taken-back turn) makes it start
        again from the head. Walking the cleared head every pump was 7 % of the daemon's busy
        time with the journal on (py-spy, 20,000 submits in flight)."""
        gate = self.gate
        assert gate is not None
        book = self.book
        queue = book.queue
        taken, dropped, gone, fronts = self.seen
        if fronts != queue.fronts:
            skip = live = 0
        else:
            t = queue.taken - taken
            skip = self.skip - t - (queue.dropped - dropped)
            live = self.live - t - (queue.gone - gone)
            if skip < 0:
                skip = 0
            if live > skip:
                live = skip
            elif live < 0:
                live = 0
        self.seen = (queue.taken, queue.dropped, queue.gone, queue.fronts)
        capacity = self.options.workers + book.lent + self._stale_busy()
        # (A released doomed worker's turn still counts in ``book.running``, not against capacity.)
        depth = self.depth
        window = capacity * depth * (CLEAR_AHEAD if depth > 1 else 1)
        want = window - book.running - book.handed + len(self.released) - live
        if want <= 0:
            self.skip, self.live, self.full = skip, live, True
            return
        batch: list[TurnRecord] = []
        ready = queue.ready
        for turn in itertools.islice(ready, skip, None) if skip else ready:
            if want <= 0:
                break
            if turn.state != "queued":
                skip += 1
                continue
            if turn.dispatchable or turn.clearing:
                skip += 1
                live += 1
                want -= 1  # already cleared (or on its way): counts against what workers can take
                continue
            if not turn.written:
                break  # in order: no turn is cleared ahead of an earlier one
            # JOURNAL-GATE-SHARE: a written turn is cleared whether or not its accept row is committed yet;
            # its "may run" row is written after the accept row (same batch or a later one), and
            # ``TurnQueue.pop`` hands it only once both are committed.
            gate_clearing(turn)
            batch.append(turn)
            skip += 1
            live += 1
            want -= 1
        self.skip, self.live, self.full = skip, live, want <= 0
        if batch:
            gate(batch)

    # ---- what a worker says about the turns handed to it ---------------------------------

    def started_ahead(self, slot: WorkerSlot, turn_id: str) -> bool:
        """A ``Started`` from a worker running nothing: the handed turn it names runs from now.
        False if no turn of that id is handed to it."""
        ahead = slot.ahead
        if not ahead:
            return False
        turn: TurnRecord | None = ahead[0]
        if turn is not None and turn.id != turn_id:
            turn = next((t for t in ahead if t.id == turn_id), None)
            if turn is None:
                return False
        assert turn is not None
        self.start_turn(slot, turn, self.timers.clock())
        return True

    def started_passed(self, slot: WorkerSlot, turn_id: str) -> bool:
        """LADDER-EARLY: a ``Started`` from a worker running another turn, for a turn it went past before the
        one its marker named: that turn did start. False if it is no such turn."""
        if turn_id not in slot.passed:
            return False
        passed = next((t for t in slot.ahead if t.id == turn_id), None)
        if passed is not None:
            mark_started(passed, self.timers.clock())
        return True

    def ended_ahead(self, slot: WorkerSlot, msg: worker_link.End) -> bool:
        """An ``End`` for a turn handed to ``slot`` that it does not run: the end of a turn it went
        past (LADDER-EARLY: its own outcome stands), or a handed turn dropped unstarted on ``Abort``. False
        otherwise (SEC-FORGE: an End for a turn this worker does not run is taken only as the answer to an
        Abort the supervisor sent for a handed turn; anything else - an agent forging another
        turn's end over its worker's connection - changes nothing)."""
        finisher = self.finisher
        assert finisher is not None
        handed = next((t for t in slot.ahead if t.id == msg.turn_id), None)
        if handed is not None and handed.id in slot.passed and handed.started:
            self.unhand(slot, handed)
            finisher.finish(
                handed, msg.outcome, output=output_of(msg, handed), error=msg.error, worker_pid=slot.pid
            )
            slot.turns_run += 1
            self.after_turn(slot)
            return True
        if handed is None or handed.cause is None:
            return False
        self.unhand(slot, handed)
        finisher.finish(handed, "aborted")
        self.after_turn(slot)
        return True

    def revoked(self, slot: WorkerSlot, turn_id: str) -> bool:
        """The worker gave back a handed turn unstarted (``Revoked``): aborted if it was
        cancelled meanwhile, else back to the front of the queue. False if it holds no such turn."""
        handed = next((t for t in slot.ahead if t.id == turn_id), None)
        if handed is None:
            return False
        self.unhand(slot, handed)
        if handed.cause is not None:
            assert self.finisher is not None
            self.finisher.finish(handed, "aborted")
        else:
            self.book.queue.push(handed, front=True)
        self.after_turn(slot)
        return True

    def after_turn(self, slot: WorkerSlot) -> None:
        if slot.state != "busy":
            return
        if slot.doomed:
            return  # being killed (or unreachable): it gets no new turn; its exit settles the rest
        if slot.turn is not None or slot.ahead:
            self.pump()  # still busy: top it up
            return
        self.busy.pop(slot, None)
        options = self.options
        target = options.workers + options.spares + self.book.lent
        slots = self.pool.slots
        # len(slots) bounds the live count: skip the scan in the common case.
        live = 0 if len(slots) <= target else sum(1 for s in slots.values() if s.live and not s.doomed)
        limit = options.max_turns_per_worker
        if (
            (limit is not None and slot.turns_run >= limit)
            or live > target
            or slot.stale  # WORKER-RELOAD: its turn is done; a fresh worker already took its place
        ):
            slot.state = "idle"
            self.pool.retire(slot)
            self.refill()
            return
        slot.state = "idle"
        self.pool.settle(slot)  # WORKER-SHARE-AT-CANCEL: a cancelled turn's worker weighs as the pool again
        self.idle.append(slot)
        self.pump()
