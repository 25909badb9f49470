"""The OpenAPI document covers the server: every route the app serves, with every status it can answer.

Walks the Starlette app's routes against ``GET /v1/openapi.json``'s document: each route and method
is documented and each documented operation is served; the statuses an endpoint raises
(``ApiError(NNN, …)`` in its own code and in the module's helpers it calls), the guard's 401/403
and the catch-all 500 are all among the operation's documented responses.
"""

from __future__ import annotations

import inspect
import re
import sys
from types import SimpleNamespace
from typing import Any

from starlette.routing import Route

from supervisor.http import build_app, openapi

_RAISES = re.compile(r"ApiError\(\s*(\d{3})")
_CALLS = re.compile(r"\b(_[a-z]\w*)\(")
GUARD = {"403", "500"}  # every route: the peer/Host/Origin checks, an unexpected error
API_GUARD = GUARD | {"401"}  # /v1 routes: the bearer token too


def _app_routes() -> list[Route]:
    front: Any = SimpleNamespace(token=None, loopback=True, daemon=SimpleNamespace(end_hooks=[]))
    app, _ = build_app(front)
    inner = app
    while not hasattr(inner, "routes"):  # the guard (and the id-path layer) wrap Starlette's app
        inner = inner.app
    return [route for route in inner.routes if isinstance(route, Route)]


def _raised(fn: Any, seen: set[str] | None = None) -> set[str]:
    """The statuses ``fn`` raises, directly or through the module's helpers it calls."""
    seen = set() if seen is None else seen
    source = inspect.getsource(fn)
    codes = set(_RAISES.findall(source))
    for name in set(_CALLS.findall(source)) - seen:
        seen.add(name)
        helper = getattr(sys.modules[fn.__module__], name, None)
        if inspect.isfunction(helper):
            codes |= _raised(helper, seen)
    return codes


def test_every_route_is_documented_with_every_status_it_can_answer() -> None:
    doc = openapi()
    served: set[tuple[str, str]] = set()
    for route in _app_routes():
        methods = {m.lower() for m in route.methods or ()} - {"head"}
        for method in methods:
            served.add((route.path, method))
            operation = doc["paths"].get(route.path, {}).get(method)
            assert operation is not None, f"{method.upper()} {route.path} is served but not documented"
            documented = set(operation["responses"])
            guard = API_GUARD if route.path.startswith("/v1/") else GUARD
            missing = (_raised(route.endpoint) | guard) - documented
            assert not missing, f"{method.upper()} {route.path} can answer {sorted(missing)}, undocumented"
    documented_ops = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert documented_ops == served, documented_ops ^ served


def test_the_document_is_valid_openapi() -> None:
    """What generators of other languages' clients read (openapi-typescript, openapi-generator)."""
    from openapi_spec_validator import validate

    validate(openapi())  # raises, naming the path, on an invalid document
