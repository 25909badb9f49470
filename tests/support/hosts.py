"""A user's script driving the async API under one event-loop host (issue 15, item 1).

Run as ``python -m tests.support.hosts HOST TARGET [ENDPOINT]``: HOST is ``asyncio_run`` (plain
``asyncio.run``), ``uvloop`` (an ``asyncio.Runner`` with uvloop's loop), ``thread_loop`` (a loop already
running in another thread, code handed to it with ``run_coroutine_threadsafe``: how Jupyter's
kernel and servers such as uvicorn hold a loop the user did not start), ``nested_tasks``
(``asyncio.run`` with the supervisor opened in one task and used from others created with
``asyncio.create_task``) or ``trio`` (refused at once, by design); TARGET is ``supervisor``
(embedded) or ``client`` (the daemon at ENDPOINT). It prints one line ``OK <facts>`` when every
step gave the expected answer, or ``REFUSED <message>`` for a refused host, and exits 0.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parents[2])


async def _first_event(handle: Any) -> Any:
    events = handle.events()
    try:
        async for event in events:
            return event
    finally:
        await events.aclose()
    raise AssertionError("the turn ended without emitting")


async def scenario(backend: Any) -> dict[str, Any]:
    """Every kind of call: run, follow, cancel (escalated to a kill when embedded), crash, status."""
    facts: dict[str, Any] = {}
    echo = await backend.run("examples.agents:echo", {"text": "hi"})
    assert echo.outcome == "completed" and echo.output == {"text": "hi"}, echo
    handle = await backend.submit("examples.agents:streamer", {"count": 3})
    events = [e async for e in handle.events()]
    assert len(events) == 3, events
    assert (await handle.result()).outcome == "completed"
    stubborn = await backend.submit("examples.agents:stubborn", {"seconds": 60})
    await _first_event(stubborn)
    assert (await stubborn.cancel()) == {"kind": "user"}
    ended = await stubborn.result()
    facts["cancelled"] = ended.outcome
    crashed = await backend.run("examples.agents:crasher", {"code": 3})
    assert crashed.outcome == "crashed", crashed
    status = await backend.status()
    assert isinstance(status, dict) and status["workers"], status
    await backend.when_idle()
    facts["outcomes"] = [echo.outcome, ended.outcome, crashed.outcome]
    return facts


async def use(target: str, endpoint: str | None) -> dict[str, Any]:
    from supervisor import Client, Supervisor

    if target == "client":
        async with Client.connect(endpoint) as client:
            return await scenario(client)
    async with Supervisor(
        workers=2, spares=0, grace=0.3, kill_after=0.3, agent_path=[ROOT], start_timeout=20
    ) as sup:
        return await scenario(sup)


async def nested(target: str, endpoint: str | None) -> dict[str, Any]:
    """Open the backend in one task, use it from tasks created by the first with asyncio."""
    from supervisor import Client, Supervisor

    async def opened() -> Any:
        if target == "client":
            return await Client.connect(endpoint)
        sup = Supervisor(workers=2, spares=0, grace=0.3, kill_after=0.3, agent_path=[ROOT])
        await sup.start()
        return sup

    backend = await asyncio.create_task(opened())
    try:
        return await asyncio.create_task(scenario(backend))
    finally:
        await asyncio.create_task(backend.aclose())


def main() -> None:
    # A hang shows where it is (every thread's stack) before the test's own bound ends the script.
    faulthandler.dump_traceback_later(75, exit=True)
    host, target = sys.argv[1], sys.argv[2]
    endpoint = sys.argv[3] if len(sys.argv) > 3 else None
    started = time.monotonic()
    if host == "asyncio_run":
        facts = asyncio.run(use(target, endpoint))
    elif host == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            facts = runner.run(use(target, endpoint))
    elif host == "nested_tasks":
        facts = asyncio.run(nested(target, endpoint))
    elif host == "thread_loop":
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            facts = asyncio.run_coroutine_threadsafe(use(target, endpoint), loop).result(timeout=120)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
    elif host == "trio":
        import trio

        try:
            facts = trio.run(use, target, endpoint)
        except RuntimeError as exc:
            print("REFUSED", str(exc), f"after {time.monotonic() - started:.2f}s", flush=True)
            return
    else:
        raise SystemExit(f"unknown host {host}")
    print("OK", json.dumps(facts), flush=True)


if __name__ == "__main__":
    main()
