"""The HTTP/SSE front end of ``turnpool serve --http HOST:PORT``: a JSON API, Server-Sent Events
and a live dashboard, on the daemon's own event loop (Starlette routes served by uvicorn).

Layers: ``_listen`` (where to listen, loopback or token, the token file), ``_guard`` (bearer
token, Host and Origin checks), ``_bounds`` (what a connection may cost before those: size and time of
request line, headers and body, connections), ``_schema`` (request and reply types; the OpenAPI document is
generated from them), ``_sse`` (a turn's events as an event stream), ``_api`` (the routes),
``_views`` (the dashboard's paged lists, history, per-agent figures and worker log),
``_server`` (``HttpFrontEnd``: uvicorn inside the daemon's task group; ``attach_http``),
``static/`` (the dashboard: one HTML page, one script, one stylesheet; no build step, no CDN).

It is one more front end against public methods of the engine (``Daemon.submit``,
``Daemon.status``, ``Supervisor.handle/cancel/cancel_session/follow_raw/turn_info/turns``).
Needs the ``http`` extra (``pip install 'turnpool[http]'``). See ``docs/http.md``.
"""

from ._api import build_app
from ._bounds import HttpLimits
from ._listen import is_loopback, parse_listen, read_token
from ._schema import (
    AgentFigures,
    ErrorReply,
    HistoryPage,
    HistoryTurn,
    LivePage,
    Submitted,
    TurnList,
    TurnState,
    WorkerLogTail,
    openapi,
)
from ._server import HttpFrontEnd, attach_http

# The reply types are the API's own documents (the OpenAPI schema is generated from them).
__all__ = [
    "AgentFigures",
    "ErrorReply",
    "HistoryPage",
    "HistoryTurn",
    "HttpFrontEnd",
    "HttpLimits",
    "LivePage",
    "Submitted",
    "TurnList",
    "TurnState",
    "WorkerLogTail",
    "attach_http",
    "build_app",
    "is_loopback",
    "openapi",
    "parse_listen",
    "read_token",
]
