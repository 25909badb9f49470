"""The HTTP front end (``serve --http``) against the ``Client`` path, on one daemon, in one run.

* round trip: submit ``examples.agents:noop`` and wait for its result, one after another —
  ``POST /v1/turns`` + ``GET /v1/turns/{id}?wait=`` (httpx, keep-alive) vs ``Client.run`` —
  median and p99;
* throughput: 50 concurrent callers × ``per`` noop turns each (submit, then wait for the result),
  turns/s;
* events/s to one follower: a ``streamer`` turn of ``events`` small events, followed live from
  its submission — ``GET /v1/turns/{id}/events`` (SSE) vs ``handle.events()`` over ZeroMQ.

Both paths run against the same daemon (2 workers), interleaved per repeat. The HTTP side is
driven by a minimal keep-alive HTTP/1.1 client on asyncio streams (``_Conn``), not httpx: httpx
spends ≈1.7 ms of CPU per request here, which would measure the client, not the daemon.
"""

from __future__ import annotations

import asyncio
import json
import time

import anyio

from ._common import command, med, ms, pct, rate, ratio, table

WORKERS = 2
CALLERS = 50


class _Conn:
    """One keep-alive HTTP/1.1 connection: a request, then its response (Content-Length bodies, or
    a streamed body read to the end); just enough for the benchmark."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> _Conn:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
        return self

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)
        status, length = await self._head()
        return status, await self.reader.readexactly(length)

    async def _head(self) -> tuple[int, int]:
        assert self.reader is not None
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = -1
        for line in lines[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, length

    async def count_events(self, path: str) -> int:
        """GET an event stream (chunked) and count its ``event: event`` lines until it ends."""
        assert self.reader is not None and self.writer is not None
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
        status, _ = await self._head()
        assert status == 200
        seen, tail = 0, b""
        while True:
            size = int((await self.reader.readuntil(b"\r\n"))[:-2], 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                return seen
            text = tail + chunk
            seen += text.count(b"event: event\n") - tail.count(b"event: event\n")
            tail = text[-16:]


NOOP = json.dumps({"agent": "examples.agents:noop"}).encode()


async def _turn(conn: _Conn) -> None:
    status, body = await conn.request("POST", "/v1/turns", NOOP)
    assert status == 201, body
    turn_id = json.loads(body)["turn_id"]
    status, body = await conn.request("GET", f"/v1/turns/{turn_id}?wait=60")
    assert status == 200, body


async def _rtt_http(conn: _Conn, n: int) -> list[float]:
    ts = []
    for i in range(n + 20):
        t0 = time.perf_counter()
        await _turn(conn)
        if i >= 20:
            ts.append(time.perf_counter() - t0)
    return ts


async def _rtt_client(client: object, n: int) -> list[float]:
    run = client.run  # type: ignore[attr-defined]
    ts = []
    for i in range(n + 20):
        t0 = time.perf_counter()
        await run("examples.agents:noop")
        if i >= 20:
            ts.append(time.perf_counter() - t0)
    return ts


async def _many_http(conns: list[_Conn], per: int) -> float:
    async def one(conn: _Conn) -> None:
        ids = []
        for _ in range(per):
            status, body = await conn.request("POST", "/v1/turns", NOOP)
            assert status == 201
            ids.append(json.loads(body)["turn_id"])
        for turn_id in ids:
            status, _ = await conn.request("GET", f"/v1/turns/{turn_id}?wait=60")
            assert status == 200

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for conn in conns:
            tg.start_soon(one, conn)
    return CALLERS * per / (time.perf_counter() - t0)


async def _many_client(client: object, per: int) -> float:
    async def one() -> None:
        handles = [await client.submit("examples.agents:noop") for _ in range(per)]  # type: ignore[attr-defined]
        for h in handles:
            await h.result()

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(CALLERS):
            tg.start_soon(one)
    return CALLERS * per / (time.perf_counter() - t0)


async def _events_http(conn: _Conn, events: int) -> float:
    t0 = time.perf_counter()
    body = json.dumps({"agent": "examples.agents:streamer", "input": {"count": events}}).encode()
    status, reply = await conn.request("POST", "/v1/turns", body)
    assert status == 201
    seen = await conn.count_events(f"/v1/turns/{json.loads(reply)['turn_id']}/events")
    assert seen == events, (seen, events)
    return events / (time.perf_counter() - t0)


async def _events_client(client: object, events: int) -> float:
    t0 = time.perf_counter()
    handle = await client.submit("examples.agents:streamer", {"count": events})  # type: ignore[attr-defined]
    seen = 0
    async for _ in handle.events():
        seen += 1
    assert seen == events, (seen, events)
    return events / (time.perf_counter() - t0)


async def _main(quick: bool) -> str:
    from supervisor import Client
    from tests.support import daemonkit

    n, per, events, repeats = (200, 10, 10_000, 3) if quick else (1000, 40, 50_000, 5)
    rtt = {"http": [], "client": []}  # type: dict[str, list[float]]
    many = {"http": [], "client": []}  # type: dict[str, list[float]]
    evs = {"http": [], "client": []}  # type: dict[str, list[float]]
    with daemonkit.serving(
        "--workers",
        str(WORKERS),
        "--spares",
        "0",
        "--drain",
        "0",
        "--no-journal",
        "--max-events",
        str(events * 2),
        "--http",
        "127.0.0.1:0",
    ) as served:
        host, port = served.http_url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        conns = [await _Conn(host, int(port)).open() for _ in range(CALLERS)]
        try:
            async with Client.connect(served.endpoint) as client:
                for _ in range(repeats):
                    rtt["http"] += await _rtt_http(conns[0], n)
                    rtt["client"] += await _rtt_client(client, n)
                    many["http"].append(await _many_http(conns, per))
                    many["client"].append(await _many_client(client, per))
                    evs["http"].append(await _events_http(conns[1], events))
                    evs["client"].append(await _events_client(client, events))
        finally:
            for conn in conns:
                conn.close()
    rows = [
        [
            "round trip (submit + result), median",
            ms(med(rtt["http"])),
            ms(med(rtt["client"])),
            ratio(med(rtt["http"]) / med(rtt["client"])),
        ],
        [
            "round trip, p99",
            ms(pct(rtt["http"], 99)),
            ms(pct(rtt["client"], 99)),
            ratio(pct(rtt["http"], 99) / pct(rtt["client"], 99)),
        ],
        [
            f"{CALLERS} callers × {per} turns: turns/s (median)",
            rate(med(many["http"])),
            rate(med(many["client"])),
            ratio(med(many["client"]) / med(many["http"])),
        ],
        [
            f"events/s to one follower ({events:,} events, live)",
            rate(med(evs["http"])),
            rate(med(evs["client"])),
            ratio(med(evs["client"]) / med(evs["http"])),
        ],
    ]
    runs = "; ".join(
        f"{k}: " + ", ".join(f"{x:,.0f}" for x in v)
        for k, v in (
            ("HTTP turns/s", many["http"]),
            ("Client turns/s", many["client"]),
            ("HTTP events/s", evs["http"]),
            ("Client events/s", evs["client"]),
        )
    )
    return (
        "## http: the HTTP/SSE API vs the `Client` path, same daemon, same run\n\n"
        f"{WORKERS} workers, noop turns; {n:,} sequential round trips per path after 20 warm-ups, {repeats} "
        "repeats interleaved (the latency rows pool every sample). A minimal keep-alive HTTP/1.1 "
        "client for HTTP (one connection per caller), `Client` over ipc. The ratio column is how many "
        "times the `Client` path is better.\n\n"
        + table(["measure", "HTTP", "Client (ZeroMQ)", "ratio"], rows)
        + f"\n\nPer-repeat figures — {runs}.\n\n"
        f"Command: {command('http', quick)}."
    )


def run(quick: bool) -> str:
    return anyio.run(_main, quick, backend="asyncio")


if __name__ == "__main__":
    import sys

    print(run("--quick" in sys.argv))
