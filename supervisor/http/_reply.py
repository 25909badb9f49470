"""What the HTTP routes answer with and how they read numbers from a query: ``ApiError`` (an error
reply: status, code, message), ``respond`` (a JSON body), and ``query_int`` / ``query_float`` (a
query parameter with its default, refused with 400 below its floor or unreadable, clamped to its
ceiling). Shared by the API (``_api``) and the dashboard's views (``_views``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

_json = msgspec.json.Encoder()


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def respond(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_json.encode(body), status_code=status, media_type="application/json", headers=headers)


def _query(
    request: Request,
    name: str,
    default: float,
    low: float,
    high: float,
    parse: Callable[[str], float],
    what: str,
) -> float:
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        value = parse(text)
    except ValueError:
        raise ApiError(400, "bad_value", f"{name} must be {what}, got {text!r}") from None
    if math.isnan(value) or value < low:
        shown = repr(text) if parse is float else str(value)
        raise ApiError(400, "bad_value", f"{name} must be >= {low:g}, got {shown}")
    return min(value, high)


def query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    return int(_query(request, name, default, low, high, int, "an integer"))


def query_float(request: Request, name: str, default: float, low: float, high: float) -> float:
    return _query(request, name, default, low, high, float, "a number")
