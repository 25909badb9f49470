"""The daemon's answers to client requests: one ``case`` per request type of ``wire``'s client
protocol (``wire/_client_protocol.py``), and the requests that wait (a result, a follow, an idle
wait) as tasks registered under their client.

``Requests`` is composed by ``Daemon`` (``server.py``) once its supervisor runs; the daemon owns the
client link and calls ``handle`` for each decoded request. Its collaborators: the ``Supervisor``, the
``ClientTable`` (clients, follow streams), ``send`` (one reply), ``task`` (a request that waits, under
its client), ``abandon`` (``ClientWatch``), and the daemon's acceptance path — ``admit``,
``answer_result``, ``ack_when_done``, ``cancel_timed`` — its ``status`` and the journal's ``lookup``. Rules
kept here: a client never owns a turn (a cancel is always explicit), a submit is acknowledged only
once its journal row is committed (JOURNAL-ACK, ``Daemon._admit``), a result evicted from memory is answered
from the journal (JOURNAL-LOOKUP), and a follower that falls behind the kept events is told so, never given a
silent gap (CLIENT-NO-SKIP), in batches that never crowd out the workers or other clients (CLIENT-ISOLATED).
"""

from __future__ import annotations

import asyncio
import logging
import os
from bisect import bisect_right
from collections import deque
from collections.abc import Awaitable, Callable
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import msgspec

import wire
from wire import client_link

from .._errors import (
    SUBMIT_ERROR_CODES,
    JournalUnavailable,
    UnknownTurn,
)
from .._tracing import CALLER_TRACE, valid_traceparent
from .clients import (
    BATCH_EVENTS,
    COALESCE,
    COALESCE_FULL,
    EVENTS_BATCH_BYTES,
    WINDOWLESS_BATCH_BYTES,
    FollowStream,
    Gate,
)

if TYPE_CHECKING:
    from .._engine import TurnRecord
    from .._engine.supervisor import Supervisor
    from .clients import ClientTable

log = logging.getLogger("turnpool.daemon")

_SUBMIT_ERRORS = tuple(kind for kind, _ in SUBMIT_ERROR_CODES)
PROBED_SLICE = 64  # submits admitted from behind a probe per loop pass


class Requests:
    """Answers client requests for a ``Daemon``; see the module docstring."""

    def __init__(
        self,
        sup: Supervisor,
        clients: ClientTable,
        *,
        send: Callable[[bytes, Any], bool],
        send_alone: Callable[[bytes, Any], bool],
        task: Callable[..., None],
        abandon: Callable[[bytes, int], None],
        admit: Callable[..., tuple[str, bool, list[Awaitable[Any]]]],
        answer_result: Callable[[bytes, int, str, Callable[..., Any]], None],
        ack_when_done: Callable[..., None],
        cancel_timed: Callable[[Callable[[], Any], list[str]], Any],
        status: Callable[[], dict[str, Any]],
        lookup: Callable[[str], tuple[str, bytes, Any] | None],
    ) -> None:
        self.sup = sup
        self.clients = clients
        self.send = send
        self.send_alone = send_alone  # CLIENT-NO-WINDOW: a reply in a frame of its own
        self.task = task
        self.abandon = abandon
        self.admit = admit
        self.answer_result = answer_result
        self.ack_when_done = ack_when_done
        self.cancel_timed = cancel_timed
        self.status = status
        self.lookup = lookup
        self._fallback = self._result  # one bound method, not one per waiting request (JOURNAL-GATE-WAIT)
        self._probing: dict[bytes, deque[Any]] = {}  # ADAPT-PROBE: a client's requests held behind a probe

    # CLIENT-MULTIPLEX: requests are multiplexed by req, each answered with its typed reply.
    def handle(self, ident: bytes, msg: Any) -> None:
        """Answer one decoded request from the client ``ident``.

        ADAPT-PROBE: a submit of an agent name not known yet waits (bounded) for the probe that says
        whether a worker can run it; every request read after it waits its turn behind it, so that
        the client's requests are still handled in the order it sent them (a session's order, a
        cancel right behind its submit). Other clients' requests go on meanwhile."""
        sup = self.sup
        held = self._probing.get(ident)
        if held is not None or (type(msg) is client_link.Submit and msg.agent not in sup.agents_known):
            if held is None:
                held = self._probing[ident] = deque()
                self.task(self._handle_probed, ident, held)
            held.append(msg)
            return
        self._handle_now(ident, msg)

    def _handle_now(self, ident: bytes, msg: Any) -> None:
        sup = self.sup
        match msg:
            case client_link.Hello(req=req, version=version):
                if (
                    not client_link.MIN_CLIENT_PROTOCOL_VERSION
                    <= version
                    <= client_link.CLIENT_PROTOCOL_VERSION
                ):
                    why = (
                        f"the daemon speaks client protocol {client_link.MIN_CLIENT_PROTOCOL_VERSION} to "
                        f"{client_link.CLIENT_PROTOCOL_VERSION}, the client {version}"
                    )
                    self.send(ident, client_link.Error(req, "protocol", why))
                else:
                    peer = self.clients.peers.get(ident)
                    if peer is not None:
                        peer.version = version
                    self.send(ident, client_link.Welcome(req, version, wire.MAX_MESSAGE_SIZE, os.getpid()))
            case client_link.Submit():
                self._accept(ident, msg)
            case client_link.Cancel(req=req, turn_id=turn_id, cause=cause):
                turn = self._record(ident, req, turn_id)
                if turn is None:
                    return
                winner = self.cancel_timed(lambda: sup.cancel_record(turn, cause), [turn_id])
                self.send(ident, client_link.Cancelled(req, winner))
            case client_link.CancelSession(req=req, session=session, cause=cause):
                if not session:
                    self.send(
                        ident, client_link.Error(req, "bad_value", "session must be a non-empty string")
                    )
                    return
                ids: list[str] = []

                def cancel_session() -> None:
                    ids.extend(sup.cancel_session_now(session, cause))

                self.cancel_timed(cancel_session, ids)
                self.send(ident, client_link.SessionCancelled(req, ids))
            case client_link.GetResult(req=req, turn_id=turn_id):
                self.answer_result(ident, req, turn_id, self._fallback)
            case client_link.Follow(req=req, turn_id=turn_id, window=window):
                followed = self._record(ident, req, turn_id)
                if followed is None:
                    return
                if window < 0:
                    self.send(
                        ident, client_link.Error(req, "bad_value", f"window must be >= 0, got {window}")
                    )
                    return
                stream = FollowStream(window, turn_id)
                self.clients.streams[(ident, req)] = stream
                self.clients.turn_streams.setdefault(turn_id, set()).add(stream)
                self.task(
                    self._follow, ident, req, followed, stream, key=(ident, req, "follow"), scope=stream.scope
                )
            case client_link.Credit(req=req, n=n):
                credited = self.clients.streams.get((ident, req))
                if credited is not None and n > 0:
                    credited.grant(n)
            case client_link.Unfollow(req=req) | client_link.Abandon(req=req):
                self.abandon(ident, req)
            case client_link.Lookup(req=req, turn_id=turn_id):
                if sup.find(turn_id) is not None or self.lookup(turn_id) is not None:
                    self.send(ident, client_link.Ok(req))
                else:
                    self.send(ident, client_link.Error(req, "unknown_turn", str(UnknownTurn(turn_id))))
            case client_link.GetStatus(req=req):
                self.send(ident, client_link.Status(req, self.status()))
            case client_link.WhenIdle(req=req):
                self.task(self._when_idle, ident, req, key=(ident, req, "when_idle"))
            case client_link.Reload(req=req):
                done = sup.recycle_workers()  # WORKER-RELOAD
                self.send(ident, client_link.Reloaded(req, done["workers"], done["busy"]))

    def _record(self, ident: bytes, req: int, turn_id: str) -> TurnRecord | None:
        """The record of ``turn_id``, or ``None`` once ``unknown_turn`` is answered."""
        try:
            return self.sup.record(turn_id)
        except UnknownTurn as exc:
            self.send(ident, client_link.Error(req, "unknown_turn", str(exc)))
            return None

    async def _handle_probed(self, ident: bytes, waiting: deque[Any]) -> None:
        """ADAPT-PROBE: handle the requests of client ``ident`` held behind a submit of an agent name not
        known yet, in the order they came, each such submit once its name's probe has answered."""
        sup = self.sup
        handled = 0
        try:
            while waiting:
                msg = waiting[0]
                if type(msg) is client_link.Submit and msg.agent not in sup.agents_known:
                    await sup.learn_agent(msg.agent)
                elif handled % PROBED_SLICE == PROBED_SLICE - 1:
                    await anyio.lowlevel.checkpoint()  # DAEMON-INTAKE-FAIR: other work between slices
                handled += 1
                waiting.popleft()
                try:
                    self._handle_now(ident, msg)
                except Exception as exc:  # a bug here costs one request, never the requests behind it
                    log.exception("request %r failed", msg)
                    self.send(ident, client_link.Error(msg.req, "internal", f"{type(exc).__name__}: {exc}"))
        finally:
            del self._probing[ident]

    def _accept(self, ident: bytes, msg: client_link.Submit) -> None:
        req = msg.req
        # OBS-TRACE: the client's trace context, for the acceptance below (an invalid one is ignored).
        traced = CALLER_TRACE.set(valid_traceparent(msg.trace)) if msg.trace is not None else None
        try:
            turn_id, existed, gates = self.admit(
                msg.agent,
                msg.input,
                session=msg.session,
                timeout=msg.timeout,
                grace=msg.grace,
                kill_after=msg.kill_after,
                turn_id=msg.turn_id,
                retry=msg.retry,
            )
        except _SUBMIT_ERRORS as exc:
            code = next(code for kind, code in SUBMIT_ERROR_CODES if isinstance(exc, kind))
            self.send(ident, client_link.Error(req, code, str(exc)))
            return
        finally:
            if traced is not None:
                CALLER_TRACE.reset(traced)
        if gates and all(type(gate) is Gate or isinstance(gate, asyncio.Future) for gate in gates):
            self.ack_when_done(ident, req, turn_id, gates, msg.wait, existed, self._fallback)
        elif gates:
            self.task(
                self._ack_after, ident, req, turn_id, gates, msg.wait, existed, key=(ident, req, "result")
            )
        else:
            self.send(ident, client_link.Accepted(req, turn_id, existed))
            if msg.wait:
                self.answer_result(ident, req, turn_id, self._fallback)

    async def _ack_after(
        self,
        ident: bytes,
        req: int,
        turn_id: str,
        gates: list[Awaitable[Any]],
        wait: bool,
        existing: bool = False,
    ) -> None:
        """Acknowledge a submit only once every accept hook's awaitable is done (a journal's commit)."""
        for gate in gates:
            try:
                await gate
            # not durable, so not acknowledged; it never ran (JOURNAL-UNAVAILABLE)
            except JournalUnavailable as exc:
                self.send(ident, client_link.Error(req, "journal_unavailable", str(exc)))
                return
            except ValueError as exc:  # the id was recorded meanwhile by another submit (JOURNAL-LOOKUP)
                self.send(ident, client_link.Error(req, "bad_value", str(exc)))
                return
            except Exception as exc:
                log.exception("accept hook failed for turn %s", turn_id)
                why = f"turn {turn_id} accepted but not recorded: {exc}"
                self.send(ident, client_link.Error(req, "internal", why))
                return
        self.send(ident, client_link.Accepted(req, turn_id, existing))
        if wait:
            await self._result(ident, req, turn_id)

    async def _result(self, ident: bytes, req: int, turn_id: str) -> None:
        try:
            result = await self.sup.result(turn_id)
        except UnknownTurn as exc:
            try:
                found = self.lookup(turn_id)
            except Exception:  # an unreadable journal: the id is as unknown as it was
                log.warning("journal lookup of turn %s failed", turn_id, exc_info=True)
                found = None
            if found is None or found[2] is None:
                self.send(ident, client_link.Error(req, "unknown_turn", str(exc)))
                return
            result = found[2]  # evicted from memory, kept in the journal
        self.send(ident, client_link.Result(req, result))

    async def _follow(self, ident: bytes, req: int, turn: TurnRecord, stream: FollowStream) -> None:
        """Stream ``turn``'s events from the oldest kept one, in batches, within the client's window.

        A follower whose next event was dropped from the turn's buffer (it fell more than
        ``max_events`` behind) goes on from the oldest kept event; the jump in ``seq`` is the gap
        its client reports (EVENTS-GAP-WHERE, CLIENT-NO-SKIP: never a silent gap). Each batch is one send,
        then a checkpoint, so followers never crowd out the workers' frames or other clients
        (CLIENT-ISOLATED).
        """
        sup = self.sup
        seq = turn.events_base  # a late follower starts at the oldest event kept
        sent_at = -COALESCE
        reader = sup.table.add_reader(turn, seq)  # EVENTS-KEEP: while it moves, its events are kept
        try:
            while True:
                reader.seq = seq
                base = turn.events_base
                if seq < base:
                    if not self.clients.speaks(ident, 3):
                        self._lagged(ident, req, turn, base - seq)
                        return
                    # EVENTS-GAP-WHERE: a version-3 follower goes on from the oldest kept event; the jump in
                    # ``seq`` is the gap its client reports (``EventsDropped``), never silent.
                    self.clients.lagged_followers += 1
                    seq = base
                    continue
                kept = len(turn.events)
                if seq < base + kept:
                    count, room = stream.allowance()
                    if count == 0:
                        await stream.wait()  # the client's credit, or the turn's end (lag check above)
                        continue
                    early = sent_at + COALESCE - anyio.current_time()
                    if early > 0 and turn.state != "ended" and kept - (seq - base) < (count or COALESCE_FULL):
                        # A busy stream sends at most one batch per COALESCE: a flood costs each
                        # follower a few hundred sends a second, whatever the event rate (CLIENT-ISOLATED).
                        # EVENTS-KEEP: unless a whole batch is waiting (all the client's credit, or
                        # COALESCE_FULL events): waiting then only lets the follower fall behind.
                        await anyio.sleep(early)
                        continue
                    # CLIENT-SLICE: the batch is cut in C (a slice of about as many events as the last
                    # batch held, the running sum of their sizes, a bisection), not with a Python
                    # step per event, which cost each follower ~60 ns per event: ten followers of a
                    # flood made the daemon fall behind the workers' frames (CLIENT-ISOLATED).
                    i = seq - base
                    stop = kept if count is None else min(kept, i + count)
                    want = min(stop, i + stream.guess)
                    # CLIENT-NO-WINDOW: a window-less follow's batches are smaller, so a client that stopped
                    # reading fills its queue (and is dropped, CLIENT-ISOLATED) after 4 MiB, not 16.
                    limit = WINDOWLESS_BATCH_BYTES if room is None else min(EVENTS_BATCH_BYTES, room)
                    batch: list[msgspec.Raw] = turn.events[i:want]
                    sizes = list(map(len, batch))
                    fit = bisect_right(list(accumulate(sizes)), limit) or 1  # at least one event
                    if fit < len(batch):
                        del batch[fit:], sizes[fit:]
                        stream.guess = max(fit + fit // 4 + 1, 64)
                    elif want < stop:
                        stream.guess = min(2 * stream.guess, BATCH_EVENTS)
                    # CLIENT-NO-WINDOW: and each goes in a frame of its own, never merged with the client's
                    # other replies: its queue holds at most 16 KiB of them per message.
                    send = self.send if room is not None else self.send_alone
                    if not send(ident, client_link.Events(req, seq, batch)):
                        return  # gone, or stopped reading (then it is owed a `lagged`)
                    stream.spent(sizes)
                    seq += len(batch)
                    sent_at = anyio.current_time()
                    if seq < turn.events_base + len(turn.events):
                        # CLIENT-ONE-STEP: more is ready (the batch was cut): let others run first.
                        await anyio.lowlevel.checkpoint()
                        continue
                    # CLIENT-ONE-STEP: all that was ready went: straight to the wait below, in the step it
                    # woke in. Yielding here, then waking to find nothing, was a second task step per
                    # event per follower: hundreds of followed turns paid two loop passes an event.
                    reader.seq = seq  # EVENTS-KEEP: what it read is no longer held for it
                if turn.state == "ended" or turn.pending_result is not None:
                    self.send(ident, client_link.FollowEnd(req))
                    return
                # DAEMON-KEEP-QUEUED: set aside for the next start, never started here
                if turn.state == "kept":
                    why = f"turn {turn.id} stays queued in the journal: it runs when the daemon starts again"
                    self.send(ident, client_link.Error(req, "shutting_down", why))
                    return
                await turn.changed()
        finally:
            sup.table.drop_reader(turn, reader)
            clients = self.clients
            if clients.streams.get((ident, req)) is stream:
                del clients.streams[(ident, req)]
            streams = clients.turn_streams.get(stream.turn_id)
            if streams is not None:
                streams.discard(stream)
                if not streams:
                    del clients.turn_streams[stream.turn_id]

    def _lagged(self, ident: bytes, req: int, turn: TurnRecord, missed: int) -> None:
        self.clients.lagged_followers += 1
        why = (
            f"this follower of turn {turn.id} fell {missed} events behind: the daemon keeps the last "
            f"{self.sup.max_events} events of a turn (--max-events); follow again to resume from "
            "the oldest one kept"
        )
        self.send(ident, client_link.Error(req, "lagged", why))

    async def _when_idle(self, ident: bytes, req: int) -> None:
        await self.sup.when_idle()
        self.send(ident, client_link.Ok(req))
