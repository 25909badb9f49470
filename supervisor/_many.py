"""Many turns in one call: ``submit_many`` and ``results``, for every backend.

A caller with thousands of turns to submit should not need a task per submit (``asyncio.gather``
over ``submit`` calls): each task, its coroutine and its future are objects that every garbage
collection walks while they live, and through a daemon that cost is most of a turn's (issue 16).
``submit_many`` takes every input at once and ``results`` waits for many turns at once. This module
holds what is the same everywhere: the checks made before anything is submitted, the error that
reports a partial refusal, and the plain loops an embedded pool needs (its ``submit`` is a local
call, so a loop is already as fast as it gets). ``Client`` overrides both to pipeline its requests
(every request in flight at once, one object waiting for all the replies).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import wire

from ._checks import check_optional_str
from ._errors import TurnpoolError, shown_id

if TYPE_CHECKING:
    from ._handle import TurnHandle


def turn_ids_of(turns: Iterable[Any]) -> list[str]:
    """The ids of ``turns`` (handles, blocking handles or id strings); ``TypeError`` at the call
    for anything else."""
    if isinstance(turns, str | bytes):
        raise TypeError("results() takes an iterable of handles or turn ids, not one string")
    ids = []
    for turn in turns:
        tid = turn if isinstance(turn, str) else getattr(turn, "turn_id", None)
        if not isinstance(tid, str) or not tid:
            raise TypeError(f"results() takes handles or non-empty turn id strings, got {shown_id(turn)}")
        ids.append(tid)
    return ids


def check_many(
    inputs: Iterable[Any], turn_ids: Sequence[str | None] | None
) -> tuple[list[Any], list[Any], list[Any]]:
    """Every input and its turn id (``None``: one is made), checked before any is submitted:
    ``TypeError`` for a bad ``turn_ids`` or a non-encodable input, ``ValueError`` for a length
    mismatch or an input above the size limit. Returns (inputs, encoded inputs, turn ids)."""
    if isinstance(inputs, str | bytes | dict):
        raise TypeError(
            f"submit_many() takes an iterable of inputs (one turn each), not a {type(inputs).__name__}"
        )
    items = list(inputs)
    raws = [wire.encode_payload(item, what=f"turn input #{i}", exact=True) for i, item in enumerate(items)]
    if turn_ids is None:
        return items, raws, [None] * len(raws)
    if isinstance(turn_ids, str | bytes):
        raise TypeError("turn_ids must be a sequence of turn ids (one per input), not one string")
    ids = list(turn_ids)
    if len(ids) != len(raws):
        raise ValueError(f"turn_ids has {len(ids)} ids for {len(raws)} inputs: give one per input")
    for tid in ids:
        if tid is not None and (not isinstance(tid, str) or not tid):
            raise TypeError(f"each of turn_ids must be a non-empty string or None, got {shown_id(tid)}")
        check_optional_str("turn_id", tid)  # LINK-TURN-ID, before any is submitted
    return items, raws, ids


def refused(first: Exception, handles: list[TurnHandle | None]) -> Exception:
    """The error ``submit_many`` raises when some submits were refused: the first refusal, with
    ``.handles`` (in input order: the handle of each turn that was accepted, ``None`` for each
    that was not). The accepted turns run as if submitted one by one."""
    accepted = sum(h is not None for h in handles)
    first.handles = handles  # type: ignore[attr-defined]
    first.add_note(
        f"submit_many: {accepted} of {len(handles)} turns were accepted and run; "
        "their handles are in this error's .handles (None where refused)"
    )
    return first


class ManyTurns:
    """``submit_many`` and ``results`` as plain loops over ``submit`` and ``result``: right for a
    backend whose calls are local (the embedded pool) or already batched below (a Ray cluster)."""

    async def _submit_checked(
        self, agent: str, item: Any, raw: Any, turn_id: str | None, options: dict[str, Any]
    ) -> TurnHandle:
        """Submit one input already checked (``raw``: its encoding). An embedded pool accepts
        ``raw`` as is instead of encoding the input again."""
        backend: Any = self  # the class this is mixed into has ``submit``
        handle: TurnHandle = await backend.submit(agent, item, turn_id=turn_id, **options)
        return handle

    async def submit_many(
        self,
        agent: str,
        inputs: Iterable[Any],
        *,
        session: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the turns' timeout, not this call's
        grace: float | None = None,
        kill_after: float | None = None,
        turn_ids: Sequence[str | None] | None = None,
        retry: bool = False,
    ) -> list[TurnHandle]:
        """Submit one turn of ``agent`` per input, with the same options; returns their handles in
        input order. Every input is checked before any turn is submitted (the errors ``submit``
        raises at the call). ``turn_ids`` (optional, one per input, ``None`` for a fresh one)
        makes each submit idempotent as ``submit``'s ``turn_id`` does. If some are refused
        (``QueueFull``, shutting down), the first refusal is raised with ``.handles``: the
        accepted turns' handles (``None`` where refused); the accepted turns run."""
        items, raws, ids = check_many(inputs, turn_ids)
        handles: list[TurnHandle | None] = []
        options = dict(session=session, timeout=timeout, grace=grace, kill_after=kill_after, retry=retry)
        for item, raw, tid in zip(items, raws, ids, strict=True):
            try:
                handles.append(await self._submit_checked(agent, item, raw, tid, options))
            except (TurnpoolError, ValueError, TypeError) as exc:
                if not handles:
                    raise  # nothing was accepted: the plain error, as submit raises it
                raise refused(exc, handles + [None] * (len(raws) - len(handles))) from None
        return handles  # type: ignore[return-value]

    async def results(self, turns: Iterable[TurnHandle | str]) -> list[wire.TurnResult]:
        """Wait for every turn's one outcome; returns the results in the order given. Takes handles
        or turn ids; raises ``UnknownTurn`` for an id nobody knows. Cancelling the wait leaves the
        turns running (a handle only observes)."""
        backend: Any = self  # the class this is mixed into has ``result``
        return [await backend.result(tid) for tid in turn_ids_of(turns)]
