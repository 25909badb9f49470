"""A service that streams a turn to a browser and stops the turn when the browser goes away.

``POST /turns`` with a JSON body submits one turn of ``agent`` and answers with its events as
server-sent events (``data: {...}`` lines), then an ``end`` event with the outcome. The turn is
owned by the response: ``sup.stream`` cancels it (cause ``user``) and waits for it to be quiescent
when the client disconnects mid-stream, so no tokens are spent on a reader who left. Run it with::

    uvicorn --factory examples.stream_service:app

(``turnpool[http]`` brings Starlette and uvicorn; with FastAPI the endpoint body is the same.)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from supervisor import Supervisor


def make_app(sup: Any, agent: str) -> Starlette:
    """The app around a running ``Supervisor`` (or a daemon's ``Client``)."""

    async def turn(request: Request) -> StreamingResponse:
        body = await request.json()
        # Entered here, not in the generator: the turn id goes out in a header, and a submit the
        # backend refuses (a full queue) is an error answer rather than a broken stream.
        owned = sup.stream(agent, body)
        events = await owned.__aenter__()

        async def sse() -> AsyncIterator[str]:
            try:
                async for event in events:
                    yield f"data: {json.dumps(event)}\n\n"
                result = await events.result()
                yield f"event: end\ndata: {json.dumps({'outcome': result.outcome})}\n\n"
            except BaseException as exc:  # the client went away: Starlette cancels this generator
                await owned.__aexit__(type(exc), exc, exc.__traceback__)
                raise
            await owned.__aexit__(None, None, None)

        return StreamingResponse(sse(), media_type="text/event-stream", headers={"x-turn-id": events.turn_id})

    return Starlette(routes=[Route("/turns", turn, methods=["POST"])])


def app() -> Starlette:
    """``uvicorn --factory examples.stream_service:app``: an embedded pool of two workers running
    ``examples.agents:streamer``, started and disposed of with the app."""
    sup = Supervisor(workers=2)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with sup:
            yield

    inner = make_app(sup, "examples.agents:streamer")
    inner.router.lifespan_context = lifespan
    return inner
