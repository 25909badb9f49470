"""The HTTP/SSE front end (``turnpool serve --http``) over real HTTP, against a real daemon.

Every endpoint and error code, SSE from the start / from a Last-Event-ID / to a late follower /
across a gap, hard cancellation through HTTP, the token off loopback, and slow readers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from supervisor.http import Submitted, TurnList, TurnState
from tests.support import daemonkit
from tests.support.daemonkit import FAST, HTTP, serving
from tests.support.httpkit import client, error_of, follow_all, result, sse, submit
from wire import TurnResult

pytestmark = pytest.mark.anyio


# ---- submit, result, idempotency ----------------------------------------------------------


async def test_submit_then_result_with_202_while_running_and_long_poll() -> None:
    """POST /v1/turns answers 201 {turn_id} with a Location; GET answers 202 with the turn's state
    while it runs and 200 with a TurnResult-shaped body once it ended; ?wait long-polls."""
    with serving(*FAST, *HTTP) as d:
        async with client(d) as http:
            turn_id = await submit(http, "examples.agents:slow", {"seconds": 1.5}, session="s1")
            r = await http.get(f"/v1/turns/{turn_id}")
            assert r.status_code == 202, r.text
            view = msgspec.json.decode(r.content, type=TurnState)
            assert view.turn_id == turn_id and view.state in ("queued", "running")
            assert view.agent == "examples.agents:slow" and view.session == "s1"
            assert view.input == {"seconds": 1.5}
            r = await http.get(f"/v1/turns/{turn_id}", params={"wait": 60})
            assert r.status_code == 200, r.text
            res = msgspec.json.decode(r.content, type=TurnResult)
            assert res.outcome == "completed" and res.output == {"slept": 1.5} and res.session == "s1"
            done = await submit(http, "examples.agents:echo", {"text": "hi"})
            assert (await result(http, done))["output"] == {"text": "hi"}
            state = msgspec.json.decode(
                (await http.get(f"/v1/turns/{turn_id}/state")).content, type=TurnState
            )
            assert state.state == "ended" and state.outcome == "completed" and state.input == {"seconds": 1.5}
            assert state.started_at is not None and state.ended_at is not None and state.now is not None
            r = await http.post("/v1/turns", json={"agent": "examples.agents:echo", "input": 1})
            assert r.headers["location"] == f"/v1/turns/{r.json()['turn_id']}"


async def test_turn_id_is_idempotent_and_a_different_request_conflicts() -> None:
    """The same request under a known turn_id answers 200 {existing: true} and never runs twice;
    the same id with another agent, input or session is refused with 409."""
    with serving(*FAST, *HTTP) as d:
        async with client(d) as http:
            body = {"agent": "examples.agents:echo", "input": {"n": 1}, "turn_id": "job-1"}
            first = await http.post("/v1/turns", json=body)
            assert first.status_code == 201 and first.json() == {"turn_id": "job-1", "existing": False}
            assert (await result(http, "job-1"))["output"] == {"n": 1}
            again = await http.post("/v1/turns", json=body)
            assert again.status_code == 200
            assert msgspec.json.decode(again.content, type=Submitted) == Submitted(
                turn_id="job-1", existing=True
            )
            for change in ({"input": {"n": 2}}, {"agent": "examples.agents:noop"}, {"session": "other"}):
                msg = error_of(await http.post("/v1/turns", json={**body, **change}), 409, "turn_id_conflict")
                assert next(iter(change)) in msg
            st = (await http.get("/v1/status")).json()
            assert st["outcomes"] == {"completed": 1}


async def test_bad_input_gets_a_4xx_json_error_never_a_500() -> None:
    """Malformed JSON, wrong types, unknown fields, a bad agent, bad numbers, a non-JSON body, an
    oversized body, bad query values, unknown turns, paths and methods: each a 4xx JSON error."""
    with serving(*FAST, *HTTP) as d:
        async with client(d) as http:
            post = "/v1/turns"
            js = {"content-type": "application/json"}
            error_of(await http.post(post, content=b"{not json", headers=js), 400, "malformed")
            error_of(await http.post(post, content=b"", headers=js), 400, "malformed")
            error_of(await http.post(post, json=[1, 2]), 400, "bad_type")
            assert "$.timeout" in error_of(
                await http.post(post, json={"agent": "a:b", "timeout": "x"}), 400, "bad_type"
            )
            error_of(await http.post(post, json={"agent": "a:b", "extra": 1}), 400, "bad_type")
            error_of(await http.post(post, json={"input": 1}), 400, "bad_type")
            error_of(await http.post(post, json={"agent": "not an agent"}), 400, "invalid_agent")
            error_of(await http.post(post, json={"agent": "a:b", "timeout": -1}), 400, "bad_value")
            error_of(
                await http.post(post, content=b'{"agent": "a:b", "grace": 1e999}', headers=js),
                400,
                "bad_type",
            )
            error_of(await http.post(post, json={"agent": "a:b", "kill_after": -0.5}), 400, "bad_value")
            error_of(await http.post(post, json={"agent": "a:b", "turn_id": ""}), 400, "bad_type")
            error_of(await http.post(post, content=b'{"agent": "a:b"}'), 415, "unsupported_media_type")
            error_of(
                await http.post(post, content=b'{"agent": "a:b"}', headers={"content-type": "text/plain"}),
                415,
                "unsupported_media_type",
            )
            huge = b'{"agent": "a:b", "input": "' + b"x" * (33 * 1024 * 1024) + b'"}'
            error_of(await http.post(post, content=huge, headers=js), 413, "too_large")
            error_of(await http.get("/v1/turns/nope"), 404, "unknown_turn")
            error_of(await http.get("/v1/turns/nope/events"), 404, "unknown_turn")
            error_of(await http.post("/v1/turns/nope/cancel"), 404, "unknown_turn")
            turn_id = await submit(http, "examples.agents:echo", 1)
            error_of(await http.get(f"/v1/turns/{turn_id}", params={"wait": "soon"}), 400, "bad_value")
            error_of(await http.get(f"/v1/turns/{turn_id}", params={"wait": "-1"}), 400, "bad_value")
            error_of(await http.get(f"/v1/turns/{turn_id}", params={"wait": "nan"}), 400, "bad_value")
            error_of(
                await http.get(f"/v1/turns/{turn_id}/events", headers={"last-event-id": "x"}),
                400,
                "bad_value",
            )
            error_of(await http.get("/v1/turns", params={"state": "bogus"}), 400, "bad_value")
            error_of(await http.get("/v1/turns", params={"limit": "many"}), 400, "bad_value")
            error_of(await http.get("/v1/outcomes", params={"seconds": "0"}), 400, "bad_value")
            error_of(await http.get("/v1/nothing"), 404, "not_found")
            error_of(await http.delete("/v1/turns"), 405, "method_not_allowed")
            error_of(await http.get("/v1/turns/x/cancel"), 405, "method_not_allowed")
            # and the daemon still serves
            assert (await result(http, turn_id))["outcome"] == "completed"
        assert "Traceback" not in d.stderr() and "Exception in ASGI" not in d.stderr()


async def test_full_queue_is_429_and_draining_is_503() -> None:
    """Beyond --max-queue a submit gets 429 (Retry-After); after SIGTERM submits get 503 while
    status, results and events still answer; the daemon then exits 0."""
    with serving("--workers", "1", "--spares", "0", "--max-queue", "1", "--drain", "30", *HTTP) as d:
        async with client(d) as http:
            running = await submit(http, "tests.agents.http:emit_then_wait", {"count": 1})
            async with http.stream("GET", f"/v1/turns/{running}/events") as r:
                async for kind, _, _ in sse(r):
                    assert kind == "event"  # it started (so the queue is empty again)
                    break
            queued = await submit(http, "examples.agents:echo", 1)
            r = await http.post("/v1/turns", json={"agent": "examples.agents:echo"})
            error_of(r, 429, "queue_full")
            assert r.headers["retry-after"] == "1"
            d.signal(signal.SIGTERM)
            with anyio.fail_after(60):
                while (await http.get("/v1/status")).json()["daemon"]["accepting"]:
                    await anyio.lowlevel.checkpoint()  # each status call is a round trip
            error_of(
                await http.post("/v1/turns", json={"agent": "examples.agents:echo"}), 503, "shutting_down"
            )
            r = await http.post(f"/v1/turns/{running}/cancel")
            assert r.status_code == 200 and r.json()["cause"] == {"kind": "user"}
            assert (await result(http, running))["outcome"] == "aborted"
            assert (await result(http, queued))["outcome"] == "completed"
        with anyio.fail_after(60):
            assert await anyio.to_thread.run_sync(d.wait) == 0


async def test_sigterm_delivers_the_end_of_disposed_turns_then_exits_0() -> None:
    """SIGTERM (drain 0) while an event stream follows a stubborn turn: the daemon, not uvicorn, owns
    the signal; the follower still gets `end` (killed, cause disposed) before the HTTP server stops,
    and the daemon exits 0."""
    with serving(
        "--workers", "1", "--spares", "0", "--grace", "0.3", "--kill-after", "0.3", "--drain", "0", *HTTP
    ) as d:
        async with client(d) as http:
            turn_id = await submit(http, "examples.agents:stubborn")
            seen: list[Any] = []
            with anyio.fail_after(60):
                async with http.stream("GET", f"/v1/turns/{turn_id}/events") as r:
                    async for item in sse(r):
                        seen.append(item)
                        if len(seen) == 1:
                            d.signal(signal.SIGTERM)
            assert [k for k, _, _ in seen] == ["event", "end"]
            end = seen[-1][2]
            assert end["outcome"] == "killed" and end["cause"] == {"kind": "disposed"}
        with anyio.fail_after(60):
            assert await anyio.to_thread.run_sync(d.wait) == 0


# ---- cancel --------------------------------------------------------------------------------


async def test_cancel_of_a_stubborn_turn_through_http_ends_killed() -> None:
    """POST /v1/turns/{id}/cancel on a turn that never awaits: 200 with cause user, the dashboard's
    listing shows the escalation step and when the next signal is due, and the turn ends killed;
    a second cancel returns the same winning cause."""
    with serving(
        "--workers", "1", "--spares", "0", "--grace", "0.5", "--kill-after", "0.5", "--drain", "0", *HTTP
    ) as d:
        async with client(d) as http:
            turn_id = await submit(http, "examples.agents:stubborn")
            async with http.stream("GET", f"/v1/turns/{turn_id}/events") as r:
                async for kind, seq, data in sse(r):
                    assert (kind, seq) == ("event", "0") and data["type"] == "started"
                    break
            r = await http.post(f"/v1/turns/{turn_id}/cancel")
            assert r.status_code == 200 and r.json() == {"turn_id": turn_id, "cause": {"kind": "user"}}
            listing = msgspec.json.decode(
                (await http.get("/v1/turns", params={"state": "running"})).content, type=TurnList
            )
            rows = [t for t in listing.turns if t.turn_id == turn_id]
            if rows:  # not yet killed: the ladder is visible
                (row,) = rows
                assert row.cause == {"kind": "user"} and row.escalation in ("abort", "sigterm", "sigkill")
                if row.next_signal is not None:
                    assert row.next_signal_at is not None and row.next_signal_at > row.submitted_at
            res = await result(http, turn_id)
            assert res["outcome"] == "killed" and res["cause"] == {"kind": "user"}
            assert res["exit_code"] in (-signal.SIGTERM, -signal.SIGKILL)
            again = await http.post(f"/v1/turns/{turn_id}/cancel")
            assert again.json()["cause"] == {"kind": "user"}
            recent = (await http.get("/v1/turns", params={"state": "ended"})).json()["turns"]
            assert recent[0]["turn_id"] == turn_id and recent[0]["outcome"] == "killed"
            series = (await http.get("/v1/outcomes", params={"seconds": 60})).json()
            assert sum(series["outcomes"]["killed"]) == 1 and len(series["outcomes"]["killed"]) == 60


async def test_cancel_session_cancels_its_running_and_queued_turns() -> None:
    """POST /v1/sessions/{s}/cancel returns the ids it cancelled: the running turn ends aborted,
    the queued one aborted without starting; another session is untouched."""
    with serving(*FAST, *HTTP) as d:
        async with client(d) as http:
            first = await submit(http, "tests.agents.http:emit_then_wait", session="s")
            second = await submit(http, "examples.agents:echo", 2, session="s")
            other = await submit(http, "examples.agents:echo", 3, session="t")
            async with http.stream("GET", f"/v1/turns/{first}/events") as r:
                async for _ in sse(r):
                    break
            r = await http.post("/v1/sessions/s/cancel")
            assert r.status_code == 200
            assert r.json()["session"] == "s" and sorted(r.json()["cancelled"]) == sorted([first, second])
            one, two, three = [await result(http, t) for t in (first, second, other)]
            assert one["outcome"] == "aborted" and one["started"] is True
            assert two["outcome"] == "aborted" and two["started"] is False
            assert three["outcome"] == "completed"
            r = await http.post("/v1/sessions/nobody/cancel")
            assert r.status_code == 200 and r.json()["cancelled"] == []


# ---- Server-Sent Events ------------------------------------------------------------------


async def test_sse_from_the_start_from_a_last_event_id_and_to_a_late_follower() -> None:
    """A live follower gets every event with id = sequence number, then `end` with the result; a
    Last-Event-ID resumes after that event; a follower arriving after the end gets them all."""
    with serving(*FAST, *HTTP) as d:
        async with client(d) as http:
            turn_id = await submit(http, "tests.agents.faults:stream_when_told", {"count": 6})
            live: list[Any] = []
            async with http.stream("GET", f"/v1/turns/{turn_id}/events") as r:
                async for item in sse(r):
                    live.append(item)
                    if len(live) == 1:  # event 0 arrived live: now let the turn emit the rest
                        assert item[:2] == ("event", "0")
                        assert (await http.post(f"/v1/turns/{turn_id}/cancel")).status_code == 200
            assert [(k, i) for k, i, _ in live[:-1]] == [("event", str(n)) for n in range(6)]
            assert [data["i"] for _, _, data in live[:-1]] == list(range(6))
            kind, _, end = live[-1]
            assert kind == "end" and end["turn_id"] == turn_id and end["output"] == {"events": 6}
            msgspec.convert(end, TurnResult)
            resumed = await follow_all(http, turn_id, {"Last-Event-ID": "3"})
            assert [i for k, i, _ in resumed if k == "event"] == ["4", "5"] and resumed[-1][0] == "end"
            late = await follow_all(http, turn_id)
            assert late == live
            past_end = await follow_all(http, turn_id, {"Last-Event-ID": "5"})
            assert [k for k, _, _ in past_end] == ["end"]


async def test_sse_shows_a_gap_for_events_no_longer_kept() -> None:
    """With --max-events 3, a late follower of a 10-event turn gets an explicit `gap` {from: 0,
    to: N} and then the events the daemon kept, N+1 … 9, and `end`; a resume from id 1 gets
    `gap` {from: 2, to: N}."""
    with serving(*FAST, *HTTP, "--max-events", "3") as d:
        async with client(d) as http:
            turn_id = await submit(http, "examples.agents:streamer", {"count": 10})
            await result(http, turn_id)
            items = await follow_all(http, turn_id)
            kind, _, gap = items[0]
            assert kind == "gap" and gap["from"] == 0 and 6 <= gap["to"] <= 8
            assert [i for k, i, _ in items if k == "event"] == [str(n) for n in range(gap["to"] + 1, 10)]
            assert items[-1][0] == "end"
            resumed = await follow_all(http, turn_id, {"Last-Event-ID": "1"})
            assert resumed[0] == ("gap", None, {"from": 2, "to": gap["to"]})


async def test_a_disconnecting_follower_cancels_nothing() -> None:
    """Closing an event stream mid-turn leaves the turn running; it completes normally."""
    with serving(*FAST, *HTTP) as d:
        async with client(d) as http:
            turn_id = await submit(http, "examples.agents:slow", {"seconds": 1})
            async with http.stream("GET", f"/v1/turns/{turn_id}/events") as r:
                async for kind, _, _ in sse(r):
                    assert kind == "event"
                    break  # leave: the connection closes here
            res = await result(http, turn_id)
            assert res["outcome"] == "completed" and res["cause"] is None


async def test_fifty_followers_with_one_that_never_reads() -> None:
    """50 SSE followers of one turn emitting 2,000 × 512 B events, one of which never reads its
    socket: the 49 others get every event and the end (bounded, generous), the turn is not held
    up, and the stalled client is dropped after --http-stall (5 s: long enough that a reader
    starved of CPU on a busy machine is not taken for a stalled one)."""
    # The agent streams after its cancel, shielded: a grace of 30 s (not FAST's 0.5 s) keeps a
    # machine starved of CPU from turning this test of followers into a test of the ladder.
    with serving(*FAST, "--grace", "30", *HTTP, "--http-stall", "5", "--max-events", "100000") as d:
        host, port = d.http_url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        async with client(d, limits=httpx.Limits(max_connections=100)) as http:
            turn_id = await submit(http, "tests.agents.http:blobs_when_told", {"count": 2000, "size": 512})
            # The stalled reader: a tiny receive buffer, a request, and never a read.
            stalled = socket.socket()
            try:
                stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                stalled.connect((host, int(port)))
                stalled.sendall(f"GET /v1/turns/{turn_id}/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                counts: list[int] = []
                first_seen = 0
                all_in = anyio.Event()

                async def reader() -> None:
                    nonlocal first_seen
                    async with http.stream("GET", f"/v1/turns/{turn_id}/events") as r:
                        assert r.status_code == 200
                        seen = 0
                        ended = False
                        async for kind, _, _ in sse(r):
                            if kind == "event":
                                seen += 1
                                if seen == 1:
                                    first_seen += 1
                                    if first_seen == 49:
                                        all_in.set()
                            ended = kind == "end"
                        assert ended
                        counts.append(seen)

                with anyio.fail_after(180):
                    async with anyio.create_task_group() as tg:
                        for _ in range(49):
                            tg.start_soon(reader)
                        await all_in.wait()  # every follower is connected and has event 0
                        go = await http.post(f"/v1/turns/{turn_id}/cancel")  # the agent's cue to stream
                        assert go.status_code == 200
                res = await result(http, turn_id)
                assert res["outcome"] == "completed" and res["output"] == {"events": 2000}
                assert counts == [2000] * 49
                # The stalled client is dropped once its buffers stay full for --http-stall seconds
                # (it must not read before that: reading would make it a slow reader, not a stalled one).
                with anyio.fail_after(60):
                    while (await http.get("/v1/status")).json()["http"]["dropped_slow"] < 1:
                        await anyio.lowlevel.checkpoint()  # each status call is a round trip
                stalled.settimeout(60)
                with pytest.raises((ConnectionResetError, _Closed)):  # reset by the daemon, not a timeout
                    while stalled.recv(65536):
                        pass
                    raise _Closed
            finally:
                stalled.close()


class _Closed(Exception):
    pass


# ---- status, documents, dashboard files ------------------------------------------------------


async def test_status_openapi_and_static_files() -> None:
    """/v1/status is `status --json` plus an `http` section; /v1/openapi.json is generated from the
    types the server uses (live bodies validate against them); / serves the dashboard page and its
    script and stylesheet from package data."""
    with serving(*FAST, *HTTP) as d:
        async with client(d) as http:
            st = (await http.get("/v1/status")).json()
            cli = json.loads(d.cli("status", "--json").stdout)
            assert set(cli) <= set(st) and st["daemon"]["pid"] == cli["daemon"]["pid"] == d.pid
            assert st["http"]["url"] == d.http_url and st["http"]["auth"] is False
            doc = (await http.get("/v1/openapi.json")).json()
            assert doc["openapi"].startswith("3.")
            schemas = doc["components"]["schemas"]
            for name in ("SubmitRequest", "TurnResult", "TurnState", "Cause", "ErrorReply"):
                assert name in schemas
            assert set(schemas["TurnResult"]["properties"]) == set(TurnResult.__struct_fields__)
            for path in (
                "/v1/turns",
                "/v1/turns/{turn_id}",
                "/v1/turns/{turn_id}/events",
                "/v1/turns/{turn_id}/cancel",
                "/v1/sessions/{session}/cancel",
                "/v1/status",
            ):
                assert path in doc["paths"]
            page = await http.get("/")
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert "/static/dashboard.js" in page.text and "http" not in page.text.split("<body>")[0].replace(
                "http-equiv", ""
            )  # no CDN
            js = await http.get("/static/dashboard.js")
            assert js.status_code == 200 and "text/javascript" in js.headers["content-type"]
            css = await http.get("/static/dashboard.css")
            assert css.status_code == 200 and "text/css" in css.headers["content-type"]


# ---- who may call ----------------------------------------------------------------------------


def _token_file(home: Path, token: str = "s3cret-token-for-tests-0123") -> Path:
    path = home / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


async def test_token_is_required_off_loopback_and_compared_exactly() -> None:
    """Listening on another address with --http-token: /v1 without a token, with a wrong one, or
    with another scheme gets 401; with the token 200; the static page needs none."""
    home = daemonkit.short_dir()
    token = "s3cret-token-for-tests-0123"
    path = _token_file(home, token)
    # 127.0.0.2 stands for "not 127.0.0.1" here: the check is the same as for any address.
    with serving(*FAST, "--http", "127.0.0.2:0", "--http-token", str(path), home=home) as d:
        async with client(d) as http:
            for headers in (
                {},
                {"authorization": "Bearer wrong"},
                {"authorization": f"Basic {token}"},
                {"authorization": f"Bearer {token}x"},
                {"authorization": "Bearer"},
            ):
                r = await http.get("/v1/status", headers=headers)
                error_of(r, 401, "unauthorized")
                assert r.headers["www-authenticate"].startswith("Bearer")
            error_of(
                await http.post("/v1/turns", json={"agent": "examples.agents:echo"}), 401, "unauthorized"
            )
            ok = await http.get("/v1/status", headers={"authorization": f"Bearer {token}"})
            assert ok.status_code == 200 and ok.json()["http"]["auth"] is True
            assert (await http.get("/")).status_code == 200
        async with client(d, headers={"authorization": f"Bearer {token}"}) as http:
            turn_id = await submit(http, "examples.agents:echo", 5)
            assert (await result(http, turn_id))["output"] == 5


def test_a_non_loopback_address_without_a_token_is_refused_at_start() -> None:
    """`serve --http 0.0.0.0:0` without --http-token exits 2 before binding anything, saying why;
    a token file others can read, or a short token, is refused too."""
    home = daemonkit.short_dir()

    def refused(*args: str) -> str:
        served = daemonkit.start(*FAST, *args, home=home, check_ready=False)
        try:
            assert served.wait() == 2, served.stderr()
        finally:
            daemonkit.stop_process(served.proc)
        return served.stderr().strip().splitlines()[-1]

    assert "needs --http-token" in refused("--http", "0.0.0.0:0")
    path = _token_file(home)
    path.chmod(0o644)
    assert "readable by others" in refused("--http", "0.0.0.0:0", "--http-token", str(path))
    short = home / "short"
    short.write_text("abc")
    short.chmod(0o600)
    assert "at least 16" in refused("--http", "9", "--http-token", str(short))
    assert "go with --http" in refused("--http-token", str(short))
    for bad in ("host:", "x:99999", "[::1]", "1.2.3.4:port"):
        assert "--http" in refused("--http", bad)


async def test_loopback_listener_refuses_foreign_host_and_cross_origin_writes() -> None:
    """On loopback without a token: a request whose Host is not a loopback name gets 403 (DNS
    rebinding), and a POST whose Origin is another site gets 403 (a page elsewhere cannot submit or
    cancel through a browser); the same-origin page and programs without Origin are served."""
    with serving(*FAST, *HTTP) as d:
        async with client(d) as http:
            error_of(await http.get("/v1/status", headers={"host": "evil.example"}), 403, "forbidden")
            error_of(
                await http.post(
                    "/v1/turns",
                    json={"agent": "examples.agents:echo"},
                    headers={"origin": "http://evil.example"},
                ),
                403,
                "forbidden",
            )
            own = d.http_url.rstrip("/")
            r = await http.post("/v1/turns", json={"agent": "examples.agents:echo"}, headers={"origin": own})
            assert r.status_code == 201
            assert (await http.get("/v1/status", headers={"host": "localhost"})).status_code == 200


def test_port_in_use_and_missing_extra_are_one_line_errors(tmp_path: Path) -> None:
    """A port already taken makes serve exit 1 naming the address; without starlette/uvicorn
    installed, `--http` exits 1 with one line saying which extra to install."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        served = daemonkit.start(*FAST, "--http", f"127.0.0.1:{port}", check_ready=False)
        try:
            assert served.wait(timeout=120) == 1
        finally:
            daemonkit.stop_process(served.proc)
        assert f"cannot listen for HTTP on 127.0.0.1:{port}" in served.stderr()
    finally:
        taken.close()
    blocker = tmp_path / "block"
    (blocker / "starlette").mkdir(parents=True)
    (blocker / "starlette" / "__init__.py").write_text("raise ImportError(\"No module named 'starlette'\")\n")
    env = daemonkit.env_for(tmp_path, f"ipc://{tmp_path}/s.sock")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(blocker), env.get("PYTHONPATH", "")] if p)
    proc = subprocess.run(
        daemonkit.turnpool_argv("serve", *FAST, "--http", "0"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'turnpool[http]'" in lines[0], proc.stderr


def test_token_file_mode_check_is_about_others_only(tmp_path: Path) -> None:
    """`read_token` accepts a 0600 file and strips the newline; 0640 is refused."""
    from supervisor.http import read_token

    path = _token_file(tmp_path, "abcdefghijklmnopqrstuvwxyz")
    assert read_token(path) == "abcdefghijklmnopqrstuvwxyz"
    path.chmod(0o640)
    with pytest.raises(ValueError, match="readable by others"):
        read_token(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sys.platform.startswith("linux")
