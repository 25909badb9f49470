"""What one HTTP connection may cost before anything looks at who sent it (HTTP-BOUND).

uvicorn's ``httptools`` parser keeps a header that never ends in memory without limit (four
connections streaming one grew a daemon from 45 to 361 MiB), and neither it nor uvicorn times out a
request whose headers arrive a byte at a time, nor caps the connections it accepts (its
``limit_concurrency`` acts only once headers are complete). ``h11`` bounds only the size of an
incomplete event, and is several times slower. So the bounds are kept here, in front of the parser,
by a protocol mixin that sees every byte before ``httptools`` does — all of them before the token,
Host and Origin checks (``_guard``) and before the app:

* **connections**: at most ``connections`` open at once (the HTTP share of the descriptor budget,
  ``supervisor/_fds.py``); one more is answered ``503`` and closed at once, by the listening socket
  itself (``CappedSocket``), before the event loop makes a transport of it;
* **request line**: at most ``request_line`` bytes, else ``414``;
* **headers**: at most ``header_bytes`` bytes from the first byte of the request to the blank line
  that ends its headers, and at most ``header_count`` header lines, else ``431``; the bytes past the
  bound are never handed to the parser;
* **time to headers**: the headers complete within ``header_timeout`` seconds of the request's first
  byte (of the connection, for its first request), else ``408`` and the connection is closed;
* **time to body**: the body completes within ``body_timeout`` seconds of the headers, else the
  connection is closed (the app may be reading it: no second response is written);
* **keep-alive**: an idle connection between requests is closed after ``keep_alive`` seconds
  (uvicorn's ``timeout_keep_alive``).

A refusal is answered only when no response of this connection is under way (pipelining); otherwise
the connection is closed. Each refusal is counted by why (``HttpFrontEnd.status()['bounds']``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import errno
import logging
import socket
from typing import Any

import msgspec

log = logging.getLogger("turnpool.http")

REASONS = {
    408: b"Request Timeout",
    413: b"Content Too Large",
    414: b"URI Too Long",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


@dataclasses.dataclass(frozen=True)
class HttpLimits:
    """The bounds of the HTTP front end (see the module docstring); every one is checked before
    authentication."""

    connections: int = 1024
    request_line: int = 8 * 1024
    header_bytes: int = 32 * 1024
    header_count: int = 100
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    keep_alive: float = 5.0

    def __post_init__(self) -> None:
        for name in ("connections", "request_line", "header_bytes", "header_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"HTTP {name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout", "body_timeout", "keep_alive"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise ValueError(f"HTTP {name} must be a number of seconds > 0, got {value}")


def _response(status: int, code: str, message: str) -> bytes:
    body = msgspec.json.encode({"error": {"code": code, "message": message}})
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % (status, REASONS[status], len(body))
    )
    return head + body


class AcceptGate:
    """How many connections are open (accepted, not yet lost) against the cap."""

    def __init__(self, cap: int, counts: collections.Counter[str]) -> None:
        self.cap = cap
        self.open = 0
        self.counts = counts


class CappedSocket(socket.socket):
    """A listening socket whose ``accept`` hands the event loop no connection past ``gate.cap``.

    asyncio accepts up to its backlog (100) connections in one pass before any protocol sees one,
    so a cap checked in ``connection_made`` comes too late: the descriptors are taken already, and
    libzmq aborts the process when one of its own accepts then finds none. Here each connection past
    the cap is answered 503 (best effort, non-blocking) and closed before the next is accepted: a
    flood holds at most one descriptor more than the cap."""

    gate: AcceptGate

    def accept(self) -> tuple[socket.socket, Any]:
        while True:
            try:
                conn, addr = super().accept()  # BlockingIOError when none is waiting: asyncio's "done"
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self.gate.counts["accept_shortage"] += 1  # asyncio retries the accept a second later
                raise
            if self.gate.open < self.gate.cap:
                self.gate.open += 1
                return conn, addr
            self.gate.counts["connections"] += 1
            with contextlib.suppress(OSError):
                conn.setblocking(False)
                conn.send(_response(503, "busy", f"this server holds {self.gate.cap} connections already"))
            conn.close()


class BoundsMixin:
    """Put before uvicorn's ``HttpToolsProtocol`` in a protocol class with ``limits`` and ``counts``
    (a ``Counter`` of refusals by why) as class attributes."""

    limits: HttpLimits
    counts: collections.Counter[str]
    gate: AcceptGate
    transport: asyncio.Transport
    connections: set[Any]
    cycle: Any

    _in_head = True
    _head_bytes = 0
    _head_lines = 0
    _line_done = False
    _tail = b""
    _refused = False
    _head_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.gate.open -= 1  # taken by ``CappedSocket.accept``
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head and not self._count_head(data):
            return
        super().data_received(data)  # type: ignore[misc]

    def _count_head(self, data: bytes) -> bool:
        """Count the bytes and lines of the head in ``data``; ``False`` once a bound is passed (the
        connection is then refused and ``data`` is not parsed)."""
        limits = self.limits
        if self._head_timer is None:
            self._arm_head()  # a new request's first byte on a kept-alive connection
        seen = self._tail + data
        end = seen.find(b"\r\n\r\n")
        if end < 0:
            end = seen.find(b"\n\n")
            stop = end + 2 if end >= 0 else len(seen)
        else:
            stop = end + 4
        head = seen[len(self._tail) : stop] if stop > len(self._tail) else b""
        if not self._line_done:
            first = (self._tail + head).find(b"\n")
            line_len = self._head_bytes + (first if first >= 0 else len(head))
            if line_len > limits.request_line:
                self._refuse(414, "uri_too_long", f"the request line passes {limits.request_line} bytes")
                return False
            self._line_done = first >= 0
        self._head_bytes += len(head)
        self._head_lines += head.count(b"\n")
        if self._head_bytes > limits.header_bytes:
            self._refuse(431, "headers_too_large", f"the request's headers pass {limits.header_bytes} bytes")
            return False
        if self._head_lines > limits.header_count + 2:  # the request line and the blank line
            self._refuse(431, "too_many_headers", f"the request has more than {limits.header_count} headers")
            return False
        if end >= 0:
            self._end_head()
        else:
            self._tail = seen[-3:]
        return True

    def _end_head(self) -> None:
        self._in_head = False
        self._tail = b""
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._body_timer is None:
            loop = asyncio.get_running_loop()
            self._body_timer = loop.call_later(self.limits.body_timeout, self._body_late)

    def on_headers_complete(self) -> None:
        if self._in_head:  # an end of head the scan did not take as one: the parser knows best
            self._end_head()
        super().on_headers_complete()  # type: ignore[misc]

    def on_message_complete(self) -> None:
        super().on_message_complete()  # type: ignore[misc]
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._in_head = True
        self._head_bytes = self._head_lines = 0
        self._line_done = False
        self._tail = b""

    def _arm_head(self) -> None:
        loop = asyncio.get_running_loop()
        self._head_timer = loop.call_later(self.limits.header_timeout, self._head_late)

    def _disarm(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._refused or not self._in_head:
            return
        late = f"the request's headers did not arrive within {self.limits.header_timeout}s"
        self._refuse(408, "timeout", late)

    def _body_late(self) -> None:
        self._body_timer = None
        if self._refused or self._in_head:
            return
        self.counts["body_timeout"] += 1
        self._refused = True
        self._disarm()
        self.transport.abort()

    def _refuse(self, status: int, code: str, message: str) -> None:
        self._refused = True
        self._disarm()
        self.counts[{503: "connections", 408: "header_timeout"}.get(status, code)] += 1
        cycle = getattr(self, "cycle", None)
        if cycle is not None and not cycle.response_complete:
            self.transport.abort()  # a response is under way: a second one would corrupt it
            return
        log.debug("HTTP %d for %s: %s", status, self.transport.get_extra_info("peername"), message)
        self.transport.write(_response(status, code, message))
        self.transport.close()
