"""The turn table: its rows, the table itself and the queue.

``TurnRecord`` is the one cancellation holder of a turn: created when the turn is accepted,
the same through queueing, start, every event and the end; a new turn always gets a new one.
``TurnTable`` holds the records (live ones and the last ``keep_results`` ended ones: the
retention is written once, here), the events each turn retains and their replay to followers,
and the restore of results journalled by an earlier daemon. ``TurnQueue`` is the FIFO of turns
waiting for a worker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sys
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

import msgspec

import wire
from wire import Cause, TurnResult

from .._errors import UnknownTurn
from .._events import EventsDropped
from .states import TurnState, move

if TYPE_CHECKING:
    from .pool import WorkerSlot
    from .timers import Timer

# EVENTS-KEEP: events a follower that keeps up has not read yet are kept beyond ``max_events``, up to
# this many bytes per turn (each event counted as its encoded size plus ``EVENT_OVERHEAD``, about
# what the object holding it costs in memory): a follower slower than the agent for a while loses
# nothing, and a turn's buffer stays bounded whatever its followers do.
HOLD_BYTES = 32 * 2**20
EVENT_OVERHEAD = 64


# MEM-EVENTS: the events of ended turns kept in all (each counted as in ``HOLD_BYTES``), for late
# followers: past it the oldest turns' events go first (their results stay). 2,000 turns of 1,000
# 60-byte events had grown a supervisor by 327 MiB; the default ``keep_results`` × ``max_events`` allows
# a hundred million events.
KEEP_EVENT_BYTES = 256 * 2**20


# MEM-OUTPUTS: the outputs of the ended turns kept, in bytes (encoded): past it the oldest ended turns are
# forgotten first, as past ``keep_results`` (through a journal their results are still answered).
# ``keep_results`` alone let 10,000 results of up to 32 MiB each stay. Outputs under ``SIZED_OUTPUT``
# are not counted (``keep_results`` bounds them: 10 MiB at most with the defaults).
KEEP_RESULT_BYTES = 1024 * 2**20
SIZED_OUTPUT = 1024


def output_size(output: Any) -> int:
    """About how many bytes ``output`` takes encoded (MEM-OUTPUTS), for a result restored from a
    journal (a worker's End carries its size: ``output_of``): exact for strings and bytes, an
    encoding for containers, 0 for scalars and what cannot be encoded."""
    if output is None or isinstance(output, (bool, int, float)):
        return 0
    if isinstance(output, (str, bytes, bytearray)):
        return len(output)
    try:
        return len(msgspec.msgpack.encode(output))
    except (TypeError, ValueError, OverflowError):
        return 0


# EVENTS-KEEP: a follower that took no event while the buffer filled this many times in a row (each
# time ``max_events // 2`` more events came: ``4 × max_events`` events in all) has stopped reading.
HOLD_CHECKS = 8


class EventReader:
    """One follower's place in a turn's events (EVENTS-KEEP): ``seq`` is the next event it takes;
    ``mark`` is where it was when the buffer was last full, ``still`` how many times in a row
    it had not moved by then. A reader that moved within the last ``HOLD_CHECKS`` keeps up,
    and the events it has still to take are kept."""

    __slots__ = ("mark", "seq", "still")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.mark = seq
        self.still = 0


# MEM-LEAN: what a turn without events, followers or children holds: one shared empty value each,
# never mutated (immutable underneath: a stray ``append`` or ``add`` raises instead of sharing).
# Every turn used to bring three empty containers of its own, kept with its record for the last
# ``keep_results`` turns: three of the five objects per turn that Python's cyclic garbage collector
# tracks. Each collection walks what it tracks, and at thousands of turns a second the collections
# cost the supervisor more CPU per turn than any other single step of its path (docs/design.md,
# MEM-LEAN; tests/test_turn_cpu.py).
_NO_EVENTS: list[msgspec.Raw] = cast("list[msgspec.Raw]", ())
_NO_WAITERS: list[asyncio.Future[None]] = cast("list[asyncio.Future[None]]", ())
_NO_CHILDREN: set[str] = cast("set[str]", frozenset())
_UNHELD_REFS = 2  # ``sys.getrefcount`` of a record only a local name refers to (and the call's argument)


class TurnRecord:
    __slots__ = (
        "__weakref__",  # API-HANDLE-KEEPS: the table finds a record evicted by id while a handle holds it
        "agent",
        "attempts",
        "cause",
        "children",
        "clearing",
        "digest",
        "dispatchable",
        "done",
        "ended_at",
        "esc_timer",
        "escalated_at",
        "escalation",
        "events",
        "events_base",
        "events_bytes",
        "exited_at",
        "grace",
        "id",
        "id_chosen",
        "input",
        "kill_after",
        "output_bytes",
        "parent",
        "pending_result",
        "readers",
        "recorded",
        "result",
        "retry",
        "revoking",
        "session",
        "spawn_origin",
        "started",
        "started_at",
        "state",
        "submitted_at",
        "timeout",
        "timer",
        "trace",
        "trim_at",
        "waiters",
        "worker",
        "written",
    )

    def __init__(
        self,
        *,
        turn_id: str,
        agent: str,
        input: msgspec.Raw,
        session: str | None,
        parent: str | None,
        timeout: float | None,
        grace: float,
        kill_after: float,
        now: float,
    ) -> None:
        self.id = turn_id
        self.agent = agent
        self.input = input
        self.session = session
        self.parent = parent
        self.timeout = timeout
        self.grace = grace
        self.kill_after = kill_after
        self.state: TurnState = "queued"  # TURN-STATES: changed only by ``states.move``
        self.cause: Cause | None = None  # first cause wins
        self.started = False
        self.worker: WorkerSlot | None = None
        self.escalation = 0  # 0: none, 1: SIGTERM sent, 2: SIGKILL sent
        self.submitted_at = now
        self.started_at: float | None = None
        self.ended_at: float | None = None
        # LADDER-HANDOVER: the loop clock when the first escalation signal went out (the kill decision:
        # from then on the turn's outcome is ``killed``), and when its worker's exit was seen (its
        # slot goes to another worker there, while the tree is reaped).
        self.escalated_at: float | None = None
        self.exited_at: float | None = None
        self.events: list[msgspec.Raw] = _NO_EVENTS  # MEM-LEAN: a list of its own from the first event
        self.events_base = 0  # sequence number of events[0] (older ones were dropped)
        self.events_bytes = 0  # EVENTS-KEEP: what ``events`` holds (each: its size + EVENT_OVERHEAD)
        self.trim_at = 0  # EVENTS-KEEP: the buffer is looked at again past this many events (0: max_events)
        self.readers: list[EventReader] | None = None  # EVENTS-KEEP: its followers' positions
        # MEM-LEAN: a list of its own from the first wait
        self.waiters: list[asyncio.Future[None]] = _NO_WAITERS
        self.result: TurnResult | None = None
        # The futures of the ``result()`` calls waiting for it (``wait_done``), each its own; set
        # and dropped when the result is out (``set_done``).
        self.done: list[asyncio.Future[None]] | None = None
        self.children: set[str] = _NO_CHILDREN  # MEM-LEAN: a set of its own from the first child
        self.trace: str | None = None  # OBS-TRACE: the ``traceparent`` its agent's spans nest under
        self.spawn_origin: tuple[Any, int] | None = None  # (worker slot, request id) of a spawn
        self.pending_result: TurnResult | None = None  # held until live children have ended
        self.timer: Timer | None = None  # the deadline (timeout), armed when the turn starts
        self.esc_timer: Timer | None = None  # the next escalation step
        self.attempts = 1
        self.retry = False
        self.revoking = False  # a Revoke for this handed turn is on its way to the worker
        # The dispatch gate (JOURNAL-GATE, ``Supervisor.set_dispatch_gate``): with a journal a turn is handed
        # to a worker only once its accept row is committed (``recorded``) and a row saying it may
        # run is committed (``dispatchable``: cleared). JOURNAL-GATE-SHARE: the gate may ask for that row as
        # soon as the accept row is written (``written``: queued to the journal, so any row
        # written later commits with it or after it), before it is committed; both rows are then
        # committed before the turn is handed. Without a gate all three are true from the start.
        self.recorded = True
        self.written = True
        self.dispatchable = True
        self.clearing = False  # its "may run" row is being written
        # API-TURN-ID: the input's digest once the input itself is freed (the turn ended), so a later
        # submit under this id can still be told apart; None while the input is held, or unknown.
        self.digest: int | None = None
        self.id_chosen = False  # the caller chose the id (the idempotency case): canonical digest
        self.output_bytes = 0  # MEM-OUTPUTS: its output's encoded size, as the worker sent it (``output_of``)

    async def changed(self) -> None:
        """Wait until the turn has news for its followers (an event, its end): ``wake_followers``.
        API-BARE-FUTURE: a bare future per wait, as ``wait_done``: paid once per event per follower."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.waiters:
            self.waiters.append(fut)
        else:
            self.waiters = [fut]
        await fut

    def wake_followers(self) -> None:
        if self.waiters:
            waiters, self.waiters = self.waiters, _NO_WAITERS
            for fut in waiters:
                if not fut.done():  # (a follower cancelled meanwhile)
                    fut.set_result(None)

    def add_child(self, child_id: str) -> None:
        """A child turn spawned by this one (the only way a child is recorded: MEM-LEAN)."""
        if self.children:
            self.children.add(child_id)
        else:
            self.children = {child_id}


# API-BARE-FUTURE: ``result()`` waits on a bare future of its own per call, not an ``asyncio.Event``: an
# event per awaited turn cost its construction, a loop check under a lock and a deque, ≈ 1 µs more
# per waiter (wake-up and re-wait: 1.9 µs against 0.85 µs, 100k rounds). Each waiter's future is
# its own, so a waiter that is cancelled cancels only its own, as with an event.
async def wait_done(turn: TurnRecord) -> None:
    """Wait until ``set_done(turn)``; cancelling this wait leaves the other waiters waiting."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiters = turn.done
    if waiters is None:
        turn.done = [fut]
    else:
        waiters.append(fut)
    try:
        await fut
    finally:
        if fut.cancelled() and turn.done is not None:
            with contextlib.suppress(ValueError):
                turn.done.remove(fut)


def set_done(turn: TurnRecord) -> None:
    """The turn's result is out (or it was set aside, DAEMON-KEEP-QUEUED): wake every ``wait_done``. The
    list is dropped from the record (MEM-LEAN): a kept record holds no spent waiters."""
    waiters = turn.done
    if waiters is not None:
        turn.done = None
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


# API-TURN-ID: what makes two submits under one id the same request.
_SORTED = msgspec.msgpack.Encoder(order="sorted")


def _input_digest(raw: msgspec.Raw | bytes, canonical: bool) -> int:
    """An in-process digest of an encoded input; ``canonical``: dict key order does not count
    (``{"a": 1, "b": 2}`` built in another order is the same input)."""
    data = bytes(raw)
    if canonical:
        with contextlib.suppress(msgspec.DecodeError, TypeError, ValueError):
            data = _SORTED.encode(msgspec.msgpack.decode(data))
    return hash(data)


def seal_input(turn: TurnRecord) -> None:
    """The turn ended: keep a digest of its input before the input itself is freed."""
    raw = turn.input
    if raw is not None and raw is not wire.NIL:
        turn.digest = _input_digest(raw, turn.id_chosen)


def input_known(turn: TurnRecord) -> bool:
    """Whether ``turn``'s record can tell its input apart (not one restored from a journal)."""
    held = turn.input
    return turn.digest is not None or (held is not None and held is not wire.NIL)


def same_input(turn: TurnRecord, raw: msgspec.Raw | bytes) -> bool | None:
    """Whether ``raw`` is the input ``turn`` was submitted with; ``None`` when this record cannot
    tell (restored from a journal: the journal holds the input)."""
    held = turn.input
    if held is not None and held is not wire.NIL:
        if bytes(held) == bytes(raw):
            return True
        try:
            return bool(msgspec.msgpack.decode(bytes(held)) == msgspec.msgpack.decode(bytes(raw)))
        except msgspec.DecodeError:
            return False
    if turn.digest is not None:
        return turn.digest == _input_digest(raw, turn.id_chosen)
    return None


def request_differs(
    turn: TurnRecord, agent: str, raw: msgspec.Raw | bytes, session: str | None
) -> tuple[str, ...]:
    """What differs between ``turn``'s request and this one (agent, input, session); an input this
    record cannot tell is not counted (see ``same_input``)."""
    differs = []
    if turn.agent != agent:
        differs.append("agent")
    if same_input(turn, raw) is False:
        differs.append("input")
    if turn.session != session:
        differs.append("session")
    return tuple(differs)


class TurnTable:
    """Every turn the supervisor answers for: the live ones and the last ``keep`` ended ones.

    ``records`` maps turn id to record; ``ended`` lists ended ids oldest first, so the oldest
    ended record is forgotten once more than ``keep`` have ended (results retention, one place
    for turns that end here and for results restored from a journal). MEM-EVENTS: the events of
    ended turns are kept within ``keep_event_bytes`` in all, the oldest turns' dropped first.
    """

    __slots__ = (
        "ended",
        "ended_bytes",
        "ended_events",
        "held",
        "keep",
        "keep_event_bytes",
        "keep_result_bytes",
        "max_events",
        "output_sizes",
        "records",
        "result_bytes",
    )

    def __init__(
        self,
        keep: int,
        max_events: int,
        keep_event_bytes: int = KEEP_EVENT_BYTES,
        keep_result_bytes: int = KEEP_RESULT_BYTES,
    ) -> None:
        self.records: dict[str, TurnRecord] = {}
        # API-HANDLE-KEEPS: ended records evicted from ``records`` that a handle still holds (weakly here).
        self.held: weakref.WeakValueDictionary[str, TurnRecord] = weakref.WeakValueDictionary()
        self.ended: collections.deque[str] = collections.deque()
        self.keep = keep
        self.max_events = max_events
        # MEM-EVENTS: ended turns that kept events, oldest first, each with the bytes it was counted
        # for (``events_bytes`` at its end); ``ended_bytes`` is their sum.
        self.keep_event_bytes = keep_event_bytes
        self.ended_events: collections.deque[tuple[TurnRecord, int]] = collections.deque()
        self.ended_bytes = 0
        # MEM-OUTPUTS: the outputs of at least ``SIZED_OUTPUT`` bytes of the kept ended turns, by id
        # (smaller ones are bounded by ``keep``), and their sum.
        self.keep_result_bytes = keep_result_bytes
        self.output_sizes: dict[str, int] = {}
        self.result_bytes = 0

    def __len__(self) -> int:
        return len(self.records)

    def __contains__(self, turn_id: object) -> bool:
        return turn_id in self.records

    def get(self, turn_id: str) -> TurnRecord:
        """The record of ``turn_id``; raises ``UnknownTurn``."""
        try:
            return self.records[turn_id]
        except (KeyError, TypeError):
            held = self.held.get(turn_id) if isinstance(turn_id, str) else None
            if held is not None:
                return held
            raise UnknownTurn(turn_id) from None

    def find(self, turn_id: str) -> TurnRecord | None:
        """The record of ``turn_id`` (kept, or evicted but held by a handle), or ``None``."""
        record = self.records.get(turn_id)
        return record if record is not None else self.held.get(turn_id)

    def note_ended(self, turn_id: str) -> None:
        """``turn_id`` ended (or was restored ended): keep it, forgetting the oldest ended turns
        beyond ``keep``, or while the outputs kept pass ``keep_result_bytes`` (MEM-OUTPUTS: never the
        turn that just ended)."""
        ended = self.ended
        ended.append(turn_id)
        record = self.records.get(turn_id)
        if record is not None and record.state == "ended":
            if record.events:
                self.ended_events.append((record, record.events_bytes))
                self.ended_bytes += record.events_bytes
                if self.ended_bytes > self.keep_event_bytes:
                    self._shed_events()
            size = record.output_bytes
            if size >= SIZED_OUTPUT:
                self.output_sizes[turn_id] = size
                self.result_bytes += size
        while len(ended) > self.keep or (self.result_bytes > self.keep_result_bytes and len(ended) > 1):
            old = self.records.get(ended.popleft())
            if old is not None and old.state == "ended":
                if self.ended_events and self.ended_events[0][0] is old:
                    self._shed_oldest()  # MEM-EVENTS: forgotten, so no longer counted
                if self.output_sizes:
                    self.result_bytes -= self.output_sizes.pop(old.id, 0)
                del self.records[old.id]
                # API-HANDLE-KEEPS: a handle may still hold it; then its result (and its id) stay reachable.
                # MEM-LEAN: only then is it worth a weak reference. With the table's entry deleted,
                # two references (``old`` and ``getrefcount``'s argument) mean nobody else has it:
                # it is freed on return, and a weak reference (made, then removed by its callback
                # at once) would only cost every evicted turn its churn.
                if sys.getrefcount(old) > _UNHELD_REFS:
                    self.held[old.id] = old

    def _shed_events(self) -> None:
        """MEM-EVENTS: the events of ended turns passed ``keep_event_bytes``: drop the oldest turns'
        events until they fit. A turn a follower is reading now is passed over, in its place (EVENTS-KEEP:
        a follower that reads keeps what it reads); a follower that comes later gets one
        ``EventsDropped`` for them, then the turn's last event. Results are untouched."""
        pending = self.ended_events
        passed: list[tuple[TurnRecord, int]] = []
        while self.ended_bytes > self.keep_event_bytes and pending:
            if pending[0][0].readers:
                passed.append(pending.popleft())
            else:
                self._shed_oldest()
        pending.extendleft(reversed(passed))  # still the oldest: shed first once their readers go

    def _shed_oldest(self) -> None:
        """Drop the events of the oldest ended turn counted, all but its last: a follower then
        reads one ``EventsDropped`` and that event (EVENTS-DROPPED's form: the gap, then the oldest kept;
        with nothing after the gap it would pass unseen). The last one is copied: a decoded event
        is a view of the whole frame it came in, which it would keep alive."""
        turn, counted = self.ended_events.popleft()
        self.ended_bytes -= counted
        events = turn.events
        if len(events) > 1:
            last = msgspec.Raw(bytes(events[-1]))
            turn.events_base += len(events) - 1
            turn.events = [last]
            turn.events_bytes = len(last) + EVENT_OVERHEAD
            turn.trim_at = 0

    def add_event(self, turn: TurnRecord, data: msgspec.Raw) -> None:
        """Retain one event of ``turn`` and wake its followers. At most ``max_events`` are
        retained (the older half is dropped when full, and followers skip the gap), except for
        events a follower that keeps up has still to read (EVENTS-KEEP, ``_trim``)."""
        events = turn.events
        if events is _NO_EVENTS:
            events = turn.events = []  # MEM-LEAN: the turn's first event
        events.append(data)
        turn.events_bytes += len(data) + EVENT_OVERHEAD
        if len(events) > (turn.trim_at or self.max_events):
            self._trim(turn)
        turn.wake_followers()

    def _trim(self, turn: TurnRecord) -> None:
        """EVENTS-KEEP: the buffer is full. Drop its older half, but not the events that a follower
        which keeps reading has still to take, while the turn's buffer is within ``HOLD_BYTES``.
        A follower that took nothing while ``HOLD_CHECKS × max_events // 2`` events came has
        stopped: it holds nothing, its events go as before and it is told (EVENTS-DROPPED). Looked at again
        once another ``max_events // 2`` events came, so a flood pays this once per half buffer,
        not per event."""
        events = turn.events
        keep = self.max_events // 2
        drop = len(events) - keep
        readers = turn.readers
        if readers:
            hold = -1
            for reader in readers:
                reader.still = 0 if reader.seq > reader.mark else reader.still + 1
                reader.mark = reader.seq
                if reader.still < HOLD_CHECKS:
                    hold = reader.seq if hold < 0 else min(hold, reader.seq)
            if hold >= 0 and turn.events_bytes <= HOLD_BYTES:
                drop = min(drop, hold - turn.events_base)
        if drop > 0:
            gone = events[:drop]
            turn.events_bytes -= sum(map(len, gone)) + EVENT_OVERHEAD * len(gone)
            del events[:drop]
            turn.events_base += drop
        turn.trim_at = max(self.max_events, len(events) + keep)

    def add_reader(self, turn: TurnRecord, seq: int) -> EventReader:
        """EVENTS-KEEP: a follower of ``turn`` starting at ``seq``; it updates ``reader.seq`` as it
        takes events and calls ``drop_reader`` when it stops following."""
        reader = EventReader(seq)
        if turn.readers is None:
            turn.readers = [reader]
        else:
            turn.readers.append(reader)
        return reader

    def drop_reader(self, turn: TurnRecord, reader: EventReader) -> None:
        """The follower is gone: what it held goes (down to the usual bound) unless another
        follower that keeps up holds it."""
        readers = turn.readers
        if readers is None or reader not in readers:
            return
        readers.remove(reader)
        if not readers:
            turn.readers = None
        if len(turn.events) > self.max_events:
            self._trim(turn)

    async def follow(self, turn_id: str) -> AsyncIterator[tuple[int, msgspec.Raw]]:
        """The turn's events as ``(seq, raw)`` from the oldest retained; ends when the turn ends."""
        turn = self.get(turn_id)
        seq = turn.events_base
        reader = self.add_reader(turn, seq)  # EVENTS-KEEP
        try:
            while True:
                if seq < turn.events_base:
                    seq = turn.events_base
                while seq - turn.events_base < len(turn.events):
                    yield seq, turn.events[seq - turn.events_base]
                    seq += 1
                    reader.seq = seq
                    if seq < turn.events_base:
                        seq = turn.events_base
                if turn.state in ("ended", "kept") or turn.pending_result is not None:
                    return
                await turn.changed()
        finally:
            self.drop_reader(turn, reader)

    async def events(self, turn_id: str) -> AsyncIterator[Any]:
        """The turn's events decoded, in order, from the first; ends when the turn ends.

        EVENTS-DROPPED: where events were dropped before this follower read them (it fell more than
        ``max_events // 2`` behind, or started after the buffer had overflowed), one
        ``EventsDropped(count, first)`` stands in their place, then the oldest event kept follows.
        A follower that keeps up never sees one (the worker link yields between batches, LINK-FAIR)."""
        decode = wire.decode_payload
        expected = 0
        async for seq, raw in self.follow(turn_id):
            if seq != expected:
                yield EventsDropped(seq - expected, expected)
            expected = seq + 1
            yield decode(raw)

    def restore(self, result: TurnResult, now: float) -> None:
        """Register a turn that ended before this supervisor started (a daemon's journal), so it
        answers for it as for any ended turn. A known id is left alone."""
        if result.turn_id in self.records:
            return
        turn = TurnRecord(
            turn_id=result.turn_id,
            agent=result.agent,
            input=wire.NIL,
            session=result.session,
            parent=result.parent,
            timeout=None,
            grace=0.0,
            kill_after=0.0,
            now=now,
        )
        move(turn, "ended")
        turn.result = result
        turn.output_bytes = output_size(result.output)  # MEM-OUTPUTS: not from a worker's frame here
        turn.cause = result.cause
        turn.started = result.started
        turn.attempts = result.attempts
        self.records[turn.id] = turn
        self.note_ended(turn.id)


class TurnQueue:
    """FIFO of turns waiting for a worker, with sessions run one turn at a time in order.

    ``ready`` holds turns that may start now; ``waiting[session]`` holds a session's later
    turns until its current one is quiescent. Removal is lazy (a cancelled turn's state is no
    longer ``queued`` and it is skipped), so every operation is O(1) amortised.
    """

    def __init__(self) -> None:
        self.ready: collections.deque[TurnRecord] = collections.deque()
        self.waiting: dict[str, collections.deque[TurnRecord]] = {}
        self.active: dict[str, str] = {}  # session -> id of its turn that is ready or running
        self.count = 0  # turns in state "queued"
        # JOURNAL-GATE-RESUME: how the head of ``ready`` changed, for the dispatch gate's walk (``Dispatcher``
        # remembers how far the cleared turns at the head reach and keeps that up to date from
        # these counts instead of walking them again at every pump).
        self.taken = 0  # turns ``pop`` returned (from the head)
        self.dropped = 0  # ended turns dropped from the head
        self.fronts = 0  # turns pushed back to the front
        self.gone = 0  # cleared turns (JOURNAL-GATE) cancelled while queued

    def __len__(self) -> int:
        return self.count

    def push(self, turn: TurnRecord, *, front: bool = False) -> None:
        self.count += 1
        session = turn.session
        if session is not None and not front:
            if session in self.active:
                self.waiting.setdefault(session, collections.deque()).append(turn)
                return
            self.active[session] = turn.id
        if front:
            self.fronts += 1
            self.ready.appendleft(turn)
        else:
            self.ready.append(turn)

    def pop(self) -> TurnRecord | None:
        """The next turn that may be handed to a worker now; ``None`` when the head of the queue
        still waits for the dispatch gate - its "may run" row or its accept row not committed yet
        (turns pass it in order, so none overtakes another)."""
        ready = self.ready
        while ready:
            turn = ready[0]
            if turn.state != "queued":
                ready.popleft()
                self.dropped += 1
                continue
            if not (turn.dispatchable and turn.recorded):
                # JOURNAL-GATE (JOURNAL-GATE-SHARE: a turn may be cleared before its accept row is committed)
                return None
            ready.popleft()
            self.count -= 1
            self.taken += 1
            return turn
        return None

    def has_ready(self) -> bool:
        ready = self.ready
        while ready and ready[0].state != "queued":
            ready.popleft()
            self.dropped += 1
        if not ready:
            return False
        head = ready[0]
        return head.dispatchable and head.recorded

    def discard(self, turn: TurnRecord) -> None:
        """The turn left the queue by cancellation; the caller sets its state."""
        self.count -= 1
        if turn.dispatchable or turn.clearing:
            self.gone += 1

    # TURN-SESSIONS: a session's next turn becomes ready only once the current one is quiescent.
    def session_quiescent(self, turn: TurnRecord) -> None:
        """``turn`` ended: if it was its session's current turn, the session's next queued
        turn (if any) becomes ready."""
        session = turn.session
        if session is None or self.active.get(session) != turn.id:
            return
        waiting = self.waiting.get(session)
        while waiting:
            nxt = waiting.popleft()
            if nxt.state == "queued":
                if not waiting:
                    del self.waiting[session]
                self.ready.append(nxt)
                self.active[session] = nxt.id
                return
        self.waiting.pop(session, None)
        del self.active[session]

    def queued_of_session(self, session: str) -> list[TurnRecord]:
        """The session's turns queued now (ready or waiting), in order."""
        found = [t for t in self.ready if t.session == session and t.state == "queued"]
        found.extend(t for t in self.waiting.get(session, ()) if t.state == "queued")
        return found
