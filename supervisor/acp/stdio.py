"""``turnpool acp``: an Agent Client Protocol agent over stdio, for editors.

This module owns the process: the stdio channel, the backend (an embedded ``Supervisor`` or,
with ``--connect``, the serve daemon's ``Client``), signals and shutdown; the command (its
options and their checks) is ``supervisor/cli/acp.py``. The protocol logic lives in ``agent.py``
(sessions, prompts, cancel) and ``events.py`` (turn events → ``session/update``). The
``agent-client-protocol`` package (the ``acp`` extra) is imported only when the command runs, so
the rest of the CLI works without it.

The stdio channel is private: at start the protocol's stdin and stdout are moved to fresh,
non-inheritable descriptors; fd 0 becomes ``/dev/null`` and fd 1 a copy of stderr. Whatever
this process, a worker or any descendant prints or reads on the standard streams then lands on
stderr or reads nothing: it can never corrupt or steal a protocol frame.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import stat
import sys
import threading
from typing import Any, cast

import anyio
import anyio.to_thread

from .._backend import open_backend
from .._errors import InvalidAgent
from .._exitcodes import EXIT_OK
from .frames import screened

log = logging.getLogger("turnpool.acp")


# One ACP message is one line: the reader must hold the largest one. Above the largest frame
# the pool carries (wire.MAX_MESSAGE_SIZE, 32 MiB), far above asyncio's default of 64 KiB.
STREAM_LIMIT = 64 * 1024 * 1024

# Seconds allowed at exit for a bridged output file to take what was written (ACP-FILES).
FLUSH_BOUND = 30.0


def claim_stdio() -> tuple[int, int]:
    """Take the protocol's stdin/stdout for this process alone; returns their new descriptors.

    fd 0 becomes ``/dev/null`` and fd 1 a copy of fd 2, so ``print``, C-level writes and every
    child (workers inherit fds 0–2) are kept off the channel. The returned descriptors are not
    inheritable.
    """
    sys.stdout.flush()
    proto_in = os.dup(0)
    proto_out = os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return proto_in, proto_out


def _pollable(fd: int) -> bool:
    """Whether asyncio can watch ``fd`` itself: a pipe or a socket. A regular file (``< in.jsonl``,
    ``> out.jsonl``), ``/dev/null`` or a terminal is bridged through a pipe instead (ACP-FILES)."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _copy(src: int, dst: int) -> None:
    """Copy ``src`` to ``dst`` until EOF (or either end fails), then close both."""
    try:
        while chunk := os.read(src, 1 << 16):
            view = memoryview(chunk)
            while view:
                view = view[os.write(dst, view) :]
    except OSError:
        pass  # the other end is gone: nothing more can be carried
    finally:
        os.close(src)
        os.close(dst)


def _bridge(src: int, dst: int, name: str) -> threading.Thread:
    thread = threading.Thread(target=_copy, args=(src, dst), name=name, daemon=True)
    thread.start()
    return thread


async def open_stdio(
    proto_in: int, proto_out: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, list[threading.Thread]]:
    """asyncio streams on the claimed descriptors, the reader's limit set to ``STREAM_LIMIT``.

    ACP-FILES: a side that is not a pipe or a socket (a file, ``/dev/null``, a terminal) is carried
    by a thread through a pipe of our own, since asyncio's pipe transports refuse it. The returned
    threads are the output's copiers: join them after closing the writer, so nothing written is lost.
    """
    loop = asyncio.get_running_loop()
    flushers: list[threading.Thread] = []
    if not _pollable(proto_in):
        read_end, write_end = os.pipe()
        _bridge(proto_in, write_end, "acp-stdin")
        proto_in = read_end
    if not _pollable(proto_out):
        read_end, write_end = os.pipe()
        flushers.append(_bridge(read_end, proto_out, "acp-stdout"))
        proto_out = write_end
    reader = asyncio.StreamReader(limit=STREAM_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(proto_in, "rb", 0))
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(proto_out, "wb", 0)
    )
    return reader, asyncio.StreamWriter(transport, protocol, None, loop), flushers


async def serve(args: argparse.Namespace, proto_in: int, proto_out: int) -> int:
    """Serve ACP on the claimed descriptors until the editor goes away or a signal comes;
    returns the exit code (the command is ``supervisor/cli/acp.py``)."""
    import acp

    from .agent import TurnpoolAgent

    # Workers' output goes to our stderr through the pump (never onto the protocol's stdout).
    async with open_backend(
        workers=args.workers,
        connect=args.connect,
        spares=args.spares,
        agent_path=tuple(args.path or ()),
        grace=args.grace,
        kill_after=args.kill_after,
    ) as backend:
        await refuse_unrunnable(backend, args.agent)
        # Given explicitly, the times go with every turn: they then hold on a daemon too.
        agent = TurnpoolAgent(backend, args.agent, grace=args.grace, kill_after=args.kill_after)
        raw, writer, flushers = await open_stdio(proto_in, proto_out)
        reader, pump = screened(raw, writer, STREAM_LIMIT)  # ACP-SCREEN: only JSON objects go on
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signal, tg.cancel_scope)
            # Returns at EOF on stdin (the editor went away); in-flight prompts are then cancelled.
            # TurnpoolAgent implements the Agent methods it serves; the router answers the rest.
            await acp.run_agent(cast(Any, agent), writer, reader)
            tg.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            if agent.cleanup:
                await asyncio.gather(*agent.cleanup, return_exceptions=True)
            pump.cancel()
            writer.close()  # flushes what is buffered, then closes (a bridged file's copier sees EOF)
            for flusher in flushers:
                await anyio.to_thread.run_sync(flusher.join, FLUSH_BOUND)
    # Leaving the backend disposes the embedded pool: every turn stopped, every worker reaped.
    return EXIT_OK


async def refuse_unrunnable(backend: Any, agent: str) -> None:
    """ADAPT-PROBE: on its own pool, ``InvalidAgent`` before the editor is served when the agent name
    points at what no worker can run (the probe's answer, as a submit would get it). Connected to
    a daemon, the daemon's probe answers each prompt's submit instead."""
    learn = getattr(backend, "learn_agent", None)
    if learn is None:
        return
    await learn(agent)
    refusal = backend.agents_known.get(agent)
    if refusal is not None:
        raise InvalidAgent(refusal)


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s: shutting down", signal.Signals(signum).name)
            scope.cancel()
            return
