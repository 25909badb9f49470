"""``submit_many`` and ``results`` through the daemon, pipelined (API-MANY).

Every request of the call leaves at once (``Client._post_frame`` packs them into batch frames, CLIENT-BATCHES)
and one ``_Many`` waits for all their replies: no task, future or round trip per turn. With a
task per ``submit`` (``asyncio.gather``), a caller's 20,000 tasks were most of a turn's cost
through the daemon: every garbage collection walked them (issue 16). Mixed into ``Client``, whose
connection, request ids and reply routing these use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import count
from typing import TYPE_CHECKING, Any

from wire import TurnResult, client_link

from .._checks import check_agent
from .._errors import DaemonUnavailable, ProtocolError
from .._handle import TurnHandle
from .._many import ManyTurns, check_many, refused, turn_ids_of
from .._tracing import caller_trace
from .replies import _error, _Lost, _Many, _Replies, _Reply, _submit_options

if TYPE_CHECKING:
    import asyncio


class PipelinedMany(ManyTurns):
    """``Client``'s ``submit_many`` and ``results``; see the module docstring."""

    if TYPE_CHECKING:  # what ``Client`` provides
        endpoint: str
        request_timeout: float | None
        _loop: asyncio.AbstractEventLoop | None
        _reqs: count[int]
        _pending: dict[int, _Reply | _Replies | _Many]
        _check_open: Callable[[], None]
        _encode: Callable[[Any], bytes]
        _post_frame: Callable[[bytes], None]
        _bound: Callable[[Any, float | None], None]
        _reply: Callable[[Any, str | None], Any]
        _abandon: Callable[[int], None]
        _no_answer: Callable[[], DaemonUnavailable]

    async def submit_many(
        self,
        agent: str,
        inputs: Iterable[Any],
        *,
        session: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 — the turns' timeout (Supervisor.submit_many's)
        grace: float | None = None,
        kill_after: float | None = None,
        turn_ids: Sequence[str | None] | None = None,
        retry: bool = False,
    ) -> list[TurnHandle]:
        """``Supervisor.submit_many`` through the daemon, pipelined (API-MANY): every submit leaves at
        once, in batch frames, and one object waits for all the acknowledgements - no task, future
        or round trip per turn. Every input is checked and every request encoded (and held to the
        daemon's size limit) before any is sent. A refusal raises as ``ManyTurns.submit_many``
        says, with ``.handles``. Bounded by ``request_timeout`` as ``submit`` is."""
        check_agent(agent)
        session, timeout, grace, kill_after, retry = _submit_options(
            session=session, timeout=timeout, grace=grace, kill_after=kill_after, retry=retry
        )
        _, raws, ids = check_many(inputs, turn_ids)
        self._check_open()
        if not raws:
            return []
        base = self._take_reqs(len(raws))
        submit, encode, trace = client_link.Submit, self._encode, caller_trace()  # OBS-TRACE
        frames = [
            encode(
                submit(base + i, agent, raw, session, timeout, grace, kill_after, tid, False, retry, trace)
            )
            for i, (raw, tid) in enumerate(zip(raws, ids, strict=True))
        ]
        many = self._send_many(base, frames, stop_on_error=False)
        self._bound(many, self.request_timeout)
        try:
            lost = await many.fut
        except TimeoutError:
            raise self._no_answer() from None
        finally:
            self._forget_many(many, abandon=False)
        if isinstance(lost, _Lost):
            self._reply(lost, None)
        handles: list[TurnHandle | None] = []
        backend: Any = self  # a Client
        first: Exception | None = None
        for reply, tid in zip(many.replies, ids, strict=True):
            if type(reply) is client_link.Accepted:
                handles.append(TurnHandle(backend, reply.turn_id))
                continue
            handles.append(None)
            if first is None:
                first = (
                    _error(reply, tid, self.endpoint)
                    if isinstance(reply, client_link.Error)
                    else ProtocolError(f"unexpected reply to submit: {type(reply).__name__}")
                )
        if first is None:
            return handles  # type: ignore[return-value]
        if all(h is None for h in handles):
            raise first
        raise refused(first, handles)

    async def results(self, turns: Iterable[TurnHandle | str]) -> list[TurnResult]:
        """``Supervisor.results`` through the daemon, pipelined (API-MANY): every wait leaves at once
        and one object collects the results, in the order given. Raises ``UnknownTurn`` for the
        first unknown id (and drops the other waits). Cancelling it leaves the turns running."""
        ids = turn_ids_of(turns)
        self._check_open()
        if not ids:
            return []
        base = self._take_reqs(len(ids))
        frames = [self._encode(client_link.GetResult(base + i, tid)) for i, tid in enumerate(ids)]
        many = self._send_many(base, frames, stop_on_error=True)
        try:
            lost = await many.fut
        finally:
            self._forget_many(many, abandon=True)
        if isinstance(lost, _Lost):
            self._reply(lost, None)
        replies = many.replies
        if many.left:  # the wait stopped at an error: raise the first one, typed
            for reply, tid in zip(replies, ids, strict=True):
                if type(reply) is client_link.Error:
                    self._reply(reply, tid)
        out = []
        for reply in replies:
            if type(reply) is not client_link.Result:
                raise ProtocolError(f"unexpected reply to result: {type(reply).__name__}")
            out.append(reply.result)
        return out

    def _take_reqs(self, n: int) -> int:
        """``n`` consecutive request ids (nothing else runs in between: no await); the first."""
        reqs = self._reqs
        base = next(reqs)
        for _ in range(n - 1):
            next(reqs)
        return base

    def _send_many(self, base: int, frames: list[bytes], *, stop_on_error: bool) -> _Many:
        assert self._loop is not None
        many = _Many(self._loop, base, len(frames), stop_on_error=stop_on_error)
        pending, post = self._pending, self._post_frame
        for i, frame in enumerate(frames):
            pending[base + i] = many
            post(frame)
        return many

    def _forget_many(self, many: _Many, *, abandon: bool) -> None:
        """The wait for ``many`` is over: forget its requests still unanswered, and with
        ``abandon`` tell the daemon to free them."""
        many.deadline = 0.0
        pending = self._pending
        for i, reply in enumerate(many.replies):
            if reply is None and pending.pop(many.base + i, None) is not None and abandon:
                self._abandon(many.base + i)
