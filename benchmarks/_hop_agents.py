"""Agents for ``benchmarks._cancel_load --hops``: the ``awaiting`` and ``spin`` agents of the cancel and
kill rows, stamping on the machine's ``CLOCK_MONOTONIC`` (the supervisor's clock too) each hop
their worker passes: the ``Abort`` read, the agent's task cancelled; for a kill, the worker's SIGTERM
handler entered. Stamps are appended to the
file named in the turn's input (one ``name time`` line each; an append of a line is atomic).

The patches wrap the worker's own handlers and call them unchanged: what is measured is the
real path plus one small ``write`` per hop."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import anyio

import worker

_PATH: list[str] = [""]  # the running turn's stamp file (a worker runs one turn at a time)


def stamp(name: str, path: str | None = None) -> None:
    fd = os.open(path or _PATH[0], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{name} {time.monotonic()!r}\n".encode())
    finally:
        os.close(fd)


def _on_abort(turn: worker.Turn) -> None:
    """Stamp the ``Abort``'s arrival: the worker sets the turn's cancel signal as it reads it."""
    turn.signal.add_callback(lambda cause: stamp("w_abort_read"))


def _patch_term() -> None:
    """Stamp the worker's SIGTERM handler's start (its own SIGTERM, the handler's last act, is in the
    kernel's trace: ``--trace``)."""
    orig_handler = signal.getsignal(signal.SIGTERM)
    if getattr(orig_handler, "_hop", False):
        return

    def on_term(signum: int, frame: Any) -> None:
        stamp("w_term_handler")
        orig_handler(signum, frame)  # type: ignore[operator]

    on_term._hop = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, on_term)


async def awaiting(turn: worker.Turn) -> None:
    """``_agents.awaiting`` with stamps: emits, then awaits in a loop (1 ms sleeps)."""
    _PATH[0] = turn.input["stamps"]
    _on_abort(turn)
    await turn.emit({"pid": os.getpid()})
    try:
        while True:  # noqa: ASYNC110 - awaiting in a loop is what this agent is for
            await anyio.sleep(0.001)
    except BaseException:
        stamp("w_agent_cancelled")
        raise


async def spin(turn: worker.Turn) -> None:
    """``_agents.spin`` with stamps: emits its pid, then spins without ever awaiting."""
    _PATH[0] = turn.input["stamps"]
    _on_abort(turn)
    _patch_term()
    await turn.emit({"pid": os.getpid(), "t": time.monotonic()})
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        pass
