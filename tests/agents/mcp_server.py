"""A real MCP server (the ``mcp`` package's ``MCPServer``) over stdio, for ``worker.mcp``'s tests.

Tools: ``add``; ``pid`` (this server's pid); ``parent`` (its parent's pid); ``slow`` (writes
"started" to ``mark``, sleeps until cancelled; on ``notifications/cancelled`` it writes
"cancelled" there); ``stubborn`` (swallows the cancel and blocks in C). With ``STUBBORN=1`` in its
environment it also ignores SIGTERM and stdin EOF; with ``NEVER_EOF=1`` it never sees stdin's EOF
(the client's close then ends it with SIGTERM). ``allocate`` writes 2 GiB in a ``worker.isolated`` call
limited to 256 MiB (a call forked by this server, which is not a worker): killed alone, the server goes on.
"""

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer

import worker

app = MCPServer("turnpool-test")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@app.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@app.tool()
def parent() -> int:
    """The pid of the process that started this server."""
    return os.getppid()


@app.tool()
async def slow(mark: str) -> str:
    """Say "started" in ``mark``, sleep until cancelled, then say "cancelled"."""
    Path(mark).write_text("started")  # noqa: ASYNC240 - one small write
    try:
        await anyio.sleep(1000)  # allowed: the agent's or tool's own work under test, not a wait
    except anyio.get_cancelled_exc_class():
        Path(mark).write_text("cancelled")  # noqa: ASYNC240 - one small write as the tool unwinds
        raise
    return "done"


@app.tool()
def stubborn(mark: str) -> str:
    """Block in C whatever happens (a sync tool: the server cannot cancel it)."""
    with open(mark, "w") as f:
        f.write("started")
    time.sleep(1000)  # allowed: the agent's or tool's own work under test, not a wait
    return "done"


@worker.isolated(memory_mb=256)
def _hog() -> int:
    return len(b"\x01" * (2 << 30))


@app.tool()
def allocate() -> int:
    """Allocate a lot of memory, in a process of its own."""
    return int(_hog())


def _never_eof() -> None:
    """The server never sees its stdin's EOF: what the client writes is pumped on through a pipe
    this process keeps open, so only ``notifications/cancelled`` can cancel a call in flight."""
    original, (r, w) = os.dup(0), os.pipe()

    def pump() -> None:
        while chunk := os.read(original, 65536):
            os.write(w, chunk)

    threading.Thread(target=pump, daemon=True).start()
    os.dup2(r, 0)


if __name__ == "__main__":
    if os.environ.get("NEVER_EOF") == "1":
        _never_eof()
        # Only notifications/cancelled ends a call here, and the frameworks' MCP client gives a server
        # 2 s after closing its stdin before its SIGTERM: on a loaded machine (load 300 on 2 cores) a
        # server at niceness 0 may not get the CPU to handle the notification (and say "cancelled")
        # within them. Ahead of the load where allowed, so the tests see what the server was sent.
        with contextlib.suppress(OSError):
            os.nice(-10)
    stubborn_server = os.environ.get("STUBBORN") == "1"
    if stubborn_server:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    app.run("stdio")
    while stubborn_server:  # stdin closed: a well-behaved server exits here
        time.sleep(1)  # allowed: the agent's or tool's own work under test, not a wait
