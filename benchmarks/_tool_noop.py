"""The no-op tool of ``bench_tools``'s isolated-call rows, in a module that imports only ``worker`` (as an
agent's tool module does): a call's template imports the module its function is in, so the function must
not live in the benchmark itself, whose imports (the supervisor's side, the pool's low-level face) a real
tool's template would not hold."""

from __future__ import annotations

import worker  # noqa: F401 - as a tool module does (the benchmark wraps ``noop`` with each row's options)


def noop() -> None:
    return None
