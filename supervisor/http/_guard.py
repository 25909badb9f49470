"""Who may call the HTTP API: bearer token, Host and Origin checks, as one ASGI middleware.

* **Token.** With ``--http-token`` every ``/v1`` request needs ``Authorization: Bearer <token>``,
  compared in constant time (``hmac.compare_digest``); otherwise ``401``. The dashboard's static
  files (``/``, ``/static/…``) hold no data and are served without it: the page asks for the token.
* **Host** (loopback listeners without a token). A page on another site can make a browser send
  requests to ``127.0.0.1`` — and, by DNS rebinding, even read the answers under its own name. Only
  a loopback ``Host`` (``127.x``, ``localhost``, ``[::1]``) is served there; anything else is ``403``.
* **Origin.** A request that changes something (``POST``) and carries an ``Origin`` header must come
  from this very server (``Origin`` matches ``Host``): another site cannot submit or cancel through
  a visitor's browser. Programs (curl, SDKs) send no ``Origin`` and are unaffected.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

import msgspec

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


def _host_name(host_header: str) -> str:
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rpartition(":")[0] if host_header.count(":") == 1 else host_header


def _loopback_name(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


async def reply_error(
    send: Any, status: int, code: str, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = msgspec.json.encode({"error": {"code": code, "message": message}})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware in front of the app (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, token: str | None, loopback: bool) -> None:
        self.app = app
        self.token = token.encode() if token is not None else None
        self.check_host = loopback and token is None
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for key, value in scope["headers"]:
            headers.setdefault(key, value)
        host = headers.get(b"host", b"").decode("latin-1")
        if self.check_host and not _loopback_name(_host_name(host)):
            self.refused += 1
            await reply_error(send, 403, "forbidden", "this listener serves only loopback Host names")
            return
        origin = headers.get(b"origin")
        if origin is not None and scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            parts = urlsplit(origin.decode("latin-1"))
            if parts.netloc != host:
                self.refused += 1
                await reply_error(
                    send, 403, "forbidden", f"cross-origin request from {parts.netloc or 'null'} refused"
                )
                return
        if self.token is not None and scope["path"].startswith("/v1"):
            given = headers.get(b"authorization", b"")
            scheme, _, value = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(value.strip(), self.token):
                self.refused += 1
                await reply_error(
                    send,
                    401,
                    "unauthorized",
                    "this API needs Authorization: Bearer <token>",
                    [(b"www-authenticate", b'Bearer realm="turnpool"')],
                )
                return
        await self.app(scope, receive, send)
