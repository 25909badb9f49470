"""``TurnHandle``: follow, await and cancel one turn, embedded or through a daemon client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from wire import Cause, TurnResult

if TYPE_CHECKING:
    from ._backend import Backend


class TurnHandle:
    """A handle on one turn. Cheap: holds the turn id, who owns the turn and, for an embedded
    supervisor, the turn's record, so its result stays available while the handle exists even
    past ``keep_results`` (API-HANDLE-KEEPS)."""

    __slots__ = ("_backend", "_pin", "turn_id")

    def __init__(self, backend: Backend, turn_id: str, *, pin: object = None) -> None:
        self.turn_id = turn_id
        self._backend = backend
        self._pin = pin

    def events(self) -> AsyncIterator[Any]:
        """The events the agent emitted, in order, from the turn's start (up to the retained
        bound); the iteration ends when the turn ends."""
        return self._backend.events(self.turn_id)

    async def result(self) -> TurnResult:
        """Wait for the turn's one outcome. Returns only once the turn is quiescent."""
        return await self._backend.result(self.turn_id)

    async def cancel(self, cause: Any = None) -> Cause | None:
        """Cancel the turn (default cause ``{"kind": "user"}``); returns the winning cause."""
        return await self._backend.cancel(self.turn_id, cause)

    def __repr__(self) -> str:
        return f"TurnHandle({self.turn_id!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TurnHandle)
            and other.turn_id == self.turn_id
            and other._backend is self._backend
        )

    def __hash__(self) -> int:
        return hash(self.turn_id)
