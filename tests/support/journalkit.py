"""Records and results to feed a ``Journal`` directly in tests (no supervisor around it)."""

from __future__ import annotations

from typing import Any

import wire
from supervisor.lowlevel import TurnRecord


def record(
    turn_id: str, session: str | None = None, retry: bool = False, *, tag: bytes | None = None
) -> TurnRecord:
    """A queued echo turn's record, as the engine would hand it to the journal; ``tag`` makes
    its input differ from another record's of the same id (a conflicting request)."""
    inp: dict[str, Any] = {"id": turn_id} if tag is None else {"id": turn_id, "tag": tag.hex()}
    t = TurnRecord(
        turn_id=turn_id,
        agent="examples.agents:echo",
        input=wire.encode_payload(inp),
        session=session,
        parent=None,
        timeout=None,
        grace=5.0,
        kill_after=2.0,
        now=0.0,
    )
    t.retry = retry
    return t


def completed(turn_id: str) -> wire.TurnResult:
    """A completed result for ``turn_id``."""
    return wire.TurnResult(turn_id=turn_id, outcome="completed", output={"out": turn_id}, started=True)
