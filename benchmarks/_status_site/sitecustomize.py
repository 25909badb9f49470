"""The daemon's side of ``benchmarks.status_probe``: put on ``PYTHONPATH`` with ``TURNPOOL_STATUS_PROBE``
naming a file, it wraps (in a ``turnpool serve`` process only) the daemon's answer to ``status()`` and the
memory sample behind it, and appends one line per answer: CPU (``time.thread_time``) and wall time of
the handler, of building the answer and of encoding it, when the request was read and when its reply was
flushed (``time.monotonic``, the clock the probe's clients read too); and one line per memory sample."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

_PATH = os.environ.get("TURNPOOL_STATUS_PROBE")


def _write(line: str) -> None:
    assert _PATH is not None
    with open(_PATH, "a") as f:
        f.write(line + "\n")


def _install() -> None:
    from supervisor.daemon import requests, server
    from supervisor.lowlevel import treemem
    from wire import client_link

    pending: dict[Any, Any] = {}
    handle_now = requests.Requests._handle_now

    def timed_handle(self: Any, ident: bytes, msg: Any) -> None:
        if type(msg) is not client_link.GetStatus:
            handle_now(self, ident, msg)
            return
        t_in, c0 = time.monotonic(), time.thread_time()
        handle_now(self, ident, msg)
        pending[(ident, msg.req)] = (t_in, time.thread_time() - c0)

    status = server.Daemon.status

    def timed_status(self: Any) -> dict[str, Any]:
        c0, w0 = time.thread_time(), time.perf_counter()
        out = status(self)
        pending["build"] = (time.thread_time() - c0, time.perf_counter() - w0)
        return out

    encode = server.Daemon._encode_reply

    def timed_encode(self: Any, msg: Any, peer: Any) -> bytes:
        if type(msg) is not client_link.Status:
            return encode(self, msg, peer)
        c0 = time.thread_time()
        out = encode(self, msg, peer)
        pending["encode"] = (time.thread_time() - c0, len(out))
        return out

    flush = server.Daemon._flush

    def timed_flush(self: Any) -> None:
        answered = [k for k in pending if isinstance(k, tuple)]
        flush(self)
        if not answered:
            return
        t_out = time.monotonic()
        build, enc = pending.pop("build", (0.0, 0.0)), pending.pop("encode", (0.0, 0))
        for key in answered:
            t_in, cpu = pending.pop(key)
            _write(
                f"answer req={key[1]} t_in={t_in:.6f} t_out={t_out:.6f} handle_cpu={cpu * 1e3:.3f} "
                f"build_cpu={build[0] * 1e3:.3f} build_wall={build[1] * 1e3:.3f} "
                f"encode_cpu={enc[0] * 1e3:.3f} bytes={enc[1]}"
            )

    sample = treemem.TreeMemory._sample
    measure = getattr(treemem.TreeMemory, "_measure", None)

    def timed_measure(self: Any, pids: list[int]) -> Any:
        assert measure is not None
        fresh, cost = measure(self, pids)
        _write(f"sample workers={len(pids)} cpu={cost * 1e3:.1f}")
        return fresh, cost

    async def timed_sample(self: Any, *args: Any) -> None:
        w0 = time.monotonic()
        await sample(self, *args)
        _write(f"sampled wall={(time.monotonic() - w0) * 1e3:.1f}")

    requests.Requests._handle_now = timed_handle  # type: ignore[method-assign]
    server.Daemon.status = timed_status  # type: ignore[method-assign]
    server.Daemon._encode_reply = timed_encode  # type: ignore[method-assign]
    server.Daemon._flush = timed_flush  # type: ignore[method-assign]
    if hasattr(treemem.TreeMemory, "_measure"):  # (a daemon before MEM-STATUS-SHARE: answers only)
        treemem.TreeMemory._sample = timed_sample  # type: ignore[method-assign,assignment]
        treemem.TreeMemory._measure = timed_measure  # type: ignore[method-assign]


if _PATH and "serve" in sys.argv:
    _install()
