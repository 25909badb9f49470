"""Agents for tests/test_durability.py: a 3-tool ``AgentLoop`` turn that can be killed at a chosen
boundary, once, by SIGKILL to its worker or to the daemon that runs it.

Input: ``{"dir": path, "kill": boundary | None, "pid": pid to kill (0: this worker),
"on_unknown": "tell_model" | "fail", "pause": a ``model*`` boundary to wait at until ``dir/go``
exists}``. Boundaries: ``model1`` … ``model4`` (as the n-th model
call opens, before its response), ``in_charge`` / ``in_reserve`` / ``in_lookup`` (inside the tool,
after its effect), ``after_charge`` / ``after_reserve`` / ``after_lookup`` (the tool returned,
its record not sent yet), ``end`` (after the last step, before the agent returns). The kill happens
once: a file ``killed`` made with O_EXCL says it did.

Every effect is a line appended to a file in ``dir``: ``opens`` (each model call), ``charges``
(``charge``: not idempotent), ``reserves`` (``reserve``: idempotent, the line is its key),
``lookups`` (``lookup``: not idempotent). The model answers by how many tool outputs it was given,
not by how often it was called, so a resumed attempt's model answers as the first one's would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import worker
from worker.agent import (
    AgentLoop,
    Finish,
    FunctionCallOutput,
    ModelRequest,
    Response,
    ScriptedModel,
    TextDelta,
    ToolCall,
    current_call,
    tool,
)

CALLS = [("c1", "charge", {"amount": 5}), ("c2", "reserve", {"seat": "12A"}), ("c3", "lookup", {"q": "fare"})]


_PLAN: dict[str, Any] = {}


def _append(name: str, line: str) -> None:
    with open(Path(_PLAN["dir"]) / name, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _kill_now() -> None:
    os.kill(_PLAN.get("pid") or os.getpid(), signal.SIGKILL)


def _first_time() -> bool:
    try:
        fd = os.open(Path(_PLAN["dir"]) / "killed", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _maybe_kill(where: str) -> None:
    """Kill at ``where`` now (``in_*``, ``model*``, ``end``), or as soon as the tool returned and
    before anything else runs (``after_*``: the call_soon'd kill runs before the flush of the
    record the loop posts right after the tool returns)."""
    kill = _PLAN.get("kill")
    if kill == where and _first_time():
        _kill_now()
    elif where.startswith("in_") and kill == "after_" + where[3:] and _first_time():
        asyncio.get_running_loop().call_soon(_kill_now)


async def _maybe_hang(where: str) -> None:
    """``input["hang"] == where``, first attempt: say so in ``dir/hanging`` and wait there until
    the test takes the turn's node (or worker) away."""
    if _PLAN.get("hang") == where and _first_time():
        (Path(_PLAN["dir"]) / "hanging").write_text(str(os.getpid()))
        await asyncio.sleep(3600)  # allowed: the agent's own work under test (until its node is lost)


async def _maybe_pause(where: str) -> None:
    """``input["pause"] == where``, first attempt: say so in ``dir/paused`` and wait there until the
    test makes ``dir/go`` (a full disk under the journal, made meanwhile)."""
    if _PLAN.get("pause") == where and not (Path(_PLAN["dir"]) / "paused").exists():
        (Path(_PLAN["dir"]) / "paused").write_text(str(os.getpid()))
        while not (Path(_PLAN["dir"]) / "go").exists():  # noqa: ASYNC110 - a file: no event to wait on
            await asyncio.sleep(0.01)  # allowed: the agent's own wait for the test's go-ahead


@tool
async def charge(amount: int) -> dict[str, Any]:
    """Charge the card (not idempotent)."""
    _append("charges", f"{current_call().idempotency_key} {amount}")
    _maybe_kill("in_charge")
    return {"charged": amount}


@tool(idempotent=True)
async def reserve(seat: str) -> dict[str, Any]:
    """Reserve a seat (idempotent: keyed)."""
    _append("reserves", current_call().idempotency_key)
    _maybe_kill("in_reserve")
    return {"reserved": seat}


@tool
async def lookup(q: str) -> dict[str, Any]:
    """Look a fare up (not idempotent)."""
    _append("lookups", current_call().idempotency_key)
    _maybe_kill("in_lookup")
    await _maybe_hang("in_lookup")
    return {"found": q, "fare": 120}


class PlannedModel:
    """Answers by the tool outputs it was given: the next call, or the final text naming them."""

    supported_settings = None

    async def open(self, request: ModelRequest) -> Any:
        outputs = [m.output for m in request.messages if isinstance(m, FunctionCallOutput)]
        n = len(outputs) + 1
        _append("opens", str(n))
        _maybe_kill(f"model{n}")
        await _maybe_pause(f"model{n}")
        if n <= len(CALLS):
            call_id, name, args = CALLS[n - 1]
            events: list[Any] = [
                TextDelta(f"step {n}. "),
                ToolCall(call_id, name, args),
                Finish("tool_calls"),
            ]
        else:
            events = [TextDelta("Done: " + json.dumps(outputs, sort_keys=True)), Finish("stop")]
        return await ScriptedModel([Response(events)]).open(request)


async def trip(turn: worker.Turn) -> dict[str, Any]:
    _PLAN.clear()
    _PLAN.update(turn.input)
    loop = AgentLoop(
        PlannedModel(),
        [charge, reserve, lookup],
        turn=turn,
        on_unknown_outcome=_PLAN.get("on_unknown", "tell_model"),
    )
    result = await loop.run("book the trip")
    _maybe_kill("end")
    return {"text": result.text}


async def big_output(turn: worker.Turn) -> dict[str, Any]:
    """A tool returning more than a step record may hold: the model still gets it."""

    @tool
    async def dump() -> str:
        return "x" * (5 * 1024 * 1024)

    class Model:
        supported_settings = None

        async def open(self, request: ModelRequest) -> Any:
            outputs = [m.output for m in request.messages if isinstance(m, FunctionCallOutput)]
            if not outputs:
                events: list[Any] = [ToolCall("d1", "dump", {}), Finish("tool_calls")]
            else:
                events = [TextDelta(f"got {len(outputs[0])} chars"), Finish("stop")]
            return await ScriptedModel([Response(events)]).open(request)

    _PLAN.clear()
    _PLAN.update(turn.input)
    result = await AgentLoop(Model(), [dump], turn=turn).run("dump")
    _maybe_kill("end")
    return {"text": result.text}


async def raw_steps(turn: worker.Turn) -> dict[str, Any]:
    """Sends step records past the supervisor's checks (a hostile agent's own ``worker_link.Step``s): one
    out of order, one over the record limit, then 4 MiB records until the turn's total refuses one.
    Returns the refusals' reasons, in order."""
    import msgspec

    from wire import worker_link

    conn = turn._conn
    log = turn._steps()
    errors: list[str] = []

    async def send(seq: int, size: int) -> None:
        fut = conn._loop.create_future()
        log.waiters.append((seq, fut))
        conn.post(worker_link.Step(turn.id, seq, 0, "model", msgspec.Raw(msgspec.msgpack.encode("x" * size))))
        await fut
        if log.error is not None:
            errors.append(log.error)
            log.error = None

    await send(5, 10)  # out of order: the turn has none yet
    await send(0, 5 * 1024 * 1024)  # over the record limit
    seq = 0
    while len(errors) < 3:
        await send(seq, 4 * 1024 * 1024 - 64)
        seq += 1
    return {"errors": errors}
