"""The two backends the caller-ownership tests run against (an embedded pool, a daemon's client),
and whether a process is gone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psutil

from supervisor import Client, Supervisor
from tests.support.daemonkit import FAST, serving


@asynccontextmanager
async def backend(kind: str) -> AsyncIterator[Any]:
    """``"supervisor"``: an embedded pool of two workers (grace and kill_after 0.3 s); otherwise a
    ``Client`` of a ``turnpool serve`` started for the block."""
    if kind == "supervisor":
        async with Supervisor(workers=2, spares=0, grace=0.3, kill_after=0.3) as sup:
            yield sup
    else:
        with serving(*FAST) as d:
            async with Client.connect(d.endpoint) as client:
                yield client


def gone(pid: int) -> bool:
    """The process is reaped or a zombie."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
