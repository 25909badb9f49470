"""Unusual input at the HTTP front end gets a clear answer, never a 500 (LINK-TURN-ID, LINK-DEPTH).

Every turn id the rule accepts (any script, ``/``, ``%``, ``?``, dots) is addressable at the URL the
submit's ``Location`` names, and every retry of the submit gets its acknowledgement again; an id the
rule refuses (a NUL, a control character) is a 400 before anything is accepted; an input nested past
the decoder's depth is a 400. Then hypothesis throws bodies, paths, headers and query strings at
one daemon: each request is acknowledged (2xx) or refused with a JSON 4xx, never a 500 or an empty
reply, and what a refused submit carried never runs.
"""

from __future__ import annotations

import re
import string
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.http import ErrorReply
from tests.support.daemonkit import HTTP, serving

ECHO = "examples.agents:echo"
JS = {"content-type": "application/json"}
# One worker, no spares: the daemon's worker is up before the first request and stays the same.
ONE = ("--workers", "1", "--spares", "0", "--grace", "0.5", "--kill-after", "0.5", "--drain", "0")
FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], database=None
)
ODD_IDS = [
    "日本",
    "a/b",
    "a/b/state",
    "/lead",
    "trail/",
    "100%",
    "%2F",
    "q?x=1#f",
    "..",
    ".",
    "a b",
    "👨\u200d👩",
]


def id_segment(value: str) -> str:
    """An id as one path segment, as a client writes it (and as the daemon's ``Location`` is)."""
    return "%2E" * len(value) if value.strip(".") == "" else quote(value, safe="")


def obeys_the_id_rule(value: str) -> bool:
    """LINK-TURN-ID as docs/guarantees.md words it (written here again, not imported from the code)."""
    return 1 <= len(value) <= 256 and not re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]", value)


def _error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    return msgspec.json.decode(r.content, type=ErrorReply).error.code


def _result(http: httpx.Client, location: str) -> dict[str, Any]:
    for _ in range(20):  # each a long poll of up to 30 s: a bounded wait, no sleep
        r = http.get(location, params={"wait": 30})
        if r.status_code == 200:
            return dict(r.json())
        assert r.status_code == 202, r.text
    raise AssertionError(f"{location} did not end")


def test_every_accepted_turn_id_is_addressable_and_its_retry_acknowledged() -> None:
    """LINK-TURN-ID over HTTP: an id of ``日本``, one holding ``/``, ``%``, ``?`` or ``#``, or made of dots
    is acknowledged 201 with a percent-encoded ``Location``; the result, state, events and cancel
    are reached through it; every retry answers 200 with the same ``Location`` (was: 500 for
    ``日本`` on every retry, ``/`` unreachable)."""
    with serving(*ONE, *HTTP) as d, httpx.Client(base_url=d.http_url, timeout=60) as http:
        for turn_id in ODD_IDS:
            body = {"agent": ECHO, "input": {"id": turn_id}, "turn_id": turn_id}
            first = http.post("/v1/turns", json=body)
            assert first.status_code == 201, (turn_id, first.status_code, first.text)
            location = first.headers["location"]
            assert location.isascii() and location.count("/") == 3, location
            assert first.json() == {"turn_id": turn_id, "existing": False}
            res = _result(http, location)
            assert res["turn_id"] == turn_id and res["output"] == {"id": turn_id}, res
            assert http.get(f"{location}/state").json()["turn_id"] == turn_id
            with http.stream("GET", f"{location}/events") as events:
                assert events.status_code == 200
                events.read()
            cancel = http.post(f"{location}/cancel")
            assert cancel.status_code == 200 and cancel.json()["turn_id"] == turn_id, cancel.text
            for _ in range(2):
                again = http.post("/v1/turns", json=body)
                assert again.status_code == 200 and again.headers["location"] == location, again.text
        assert http.get("/v1/status").json()["outcomes"] == {"completed": len(ODD_IDS)}
        session = "team/a b"
        cancelled = http.post("/v1/sessions/team%2Fa%20b/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["session"] == session, cancelled.text


def test_refused_turn_ids_and_deep_inputs_are_a_400_before_anything_runs() -> None:
    """LINK-TURN-ID, LINK-DEPTH: a NUL, a newline, a C1 control or a line separator in ``turn_id`` or
    ``session``, a lone surrogate, and an input nested 100,000 deep are each a 400 JSON error and
    nothing runs (was: the NUL id ran and got an empty reply; the deep input a 500)."""
    js = {"content-type": "application/json"}
    with serving(*ONE, *HTTP) as d, httpx.Client(base_url=d.http_url, timeout=60) as http:
        for field in ("turn_id", "session"):
            for bad in ("a\x00b", "line\n", "c1\x85", "sep\u2028", "\x7f"):
                r = http.post("/v1/turns", json={"agent": ECHO, field: bad})
                assert _error(r, 400) == "bad_value", r.text
            r = http.post("/v1/turns", content=f'{{"agent": "{ECHO}", "{field}": "\\ud800"}}', headers=js)
            assert _error(r, 400) in ("malformed", "bad_value"), r.text
        deep = b'{"agent": "' + ECHO.encode() + b'", "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        assert _error(http.post("/v1/turns", content=deep, headers=js), 400) == "bad_value"
        shallow = http.post("/v1/turns", json={"agent": ECHO, "input": [[[[1]]]], "turn_id": "fine"})
        assert shallow.status_code == 201
        assert _result(http, shallow.headers["location"])["output"] == [[[[1]]]]
        st = http.get("/v1/status").json()
        assert st["outcomes"] == {"completed": 1}, st
        listed = http.get("/v1/turns", params={"state": "queued,running,ended"}).json()["turns"]
        assert [t["turn_id"] for t in listed] == ["fine"], listed


_text = st.text(st.characters(codec="utf-8"), max_size=40)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
_fields = st.fixed_dictionaries(
    {},
    optional={
        "agent": st.sampled_from([ECHO, "examples.agents:noop", "not an agent", "__main__:x", ""]) | _text,
        "input": _json,
        "session": _text | st.none(),
        "turn_id": _text | st.none() | st.integers(),
        "timeout": st.floats() | st.integers() | _text,
        "grace": st.floats(max_value=1.0) | _text,
        "kill_after": st.floats(max_value=1.0),
        "retry": st.booleans() | st.integers(),
        "extra": _json,
    },
)


def _fine(r: httpx.Response) -> None:
    """A 2xx, or a 4xx with a JSON error: never a 5xx."""
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code >= 400:
        assert r.headers["content-type"].startswith("application/json"), r.headers
        msgspec.json.decode(r.content, type=ErrorReply)


def test_fuzzed_requests_are_acknowledged_or_refused_never_a_500() -> None:
    """Hypothesis: submit bodies (valid JSON of any shape, raw bytes), ids in paths, query strings
    and headers: every answer is a 2xx or a JSON 4xx; a 201 is a turn that ends, with the same
    ``Location`` on a retry; a refused submit leaves nothing behind (the turn count only grows by
    the 201s), and the daemon still serves at the end."""
    accepted: set[str] = set()
    with serving(*ONE, *HTTP) as d, httpx.Client(base_url=d.http_url, timeout=60) as http:

        @FUZZ
        @given(fields=_fields)
        def bodies(fields: dict[str, Any]) -> None:
            body = msgspec.json.encode(fields)  # a non-finite float is written null
            r = http.post("/v1/turns", content=body, headers=JS)
            _fine(r)
            if r.status_code == 201:
                turn_id = r.json()["turn_id"]
                accepted.add(turn_id)
                assert _result(http, r.headers["location"])["turn_id"] == turn_id
                again = http.post("/v1/turns", content=body, headers=JS)
                if "turn_id" in fields and fields["turn_id"] is not None:
                    assert again.status_code == 200 and again.headers["location"] == r.headers["location"]
                else:
                    accepted.add(again.json()["turn_id"])

        @FUZZ
        @given(raw=st.binary(max_size=200), kind=st.sampled_from(["application/json", "text/plain", ""]))
        def raw_bodies(raw: bytes, kind: str) -> None:
            r = http.post("/v1/turns", content=raw, headers={"content-type": kind} if kind else {})
            _fine(r)
            if r.status_code == 201:
                accepted.add(r.json()["turn_id"])

        segment = st.text(st.characters(codec="utf-8"), min_size=1, max_size=30)

        @FUZZ
        @given(
            turn_id=segment,
            tail=st.sampled_from(["", "/state", "/events", "/cancel"]),
            method=st.sampled_from(["GET", "POST", "DELETE"]),
            query=st.dictionaries(
                st.sampled_from(["wait", "limit", "state", "seconds", "x"]), _text, max_size=3
            ),
        )
        def paths(turn_id: str, tail: str, method: str, query: dict[str, str]) -> None:
            for path in (
                f"/v1/turns/{id_segment(turn_id)}{tail}",
                f"/v1/sessions/{id_segment(turn_id)}/cancel",
            ):
                query = {k: v[:5] if k == "wait" else v for k, v in query.items()}  # a wait holds a request
                r = http.request(method, path, params=query)
                _fine(r)
            for path in ("/v1/turns", "/v1/outcomes", "/v1/status"):
                _fine(http.get(path, params=query))

        # (a value with a space at either end is one the client library itself refuses to send)
        header_text = st.text(st.sampled_from(string.printable[:95] + "\u00e9"), max_size=40).map(str.strip)

        @FUZZ
        @given(
            name=st.sampled_from(["last-event-id", "content-type", "accept", "x-any", "origin"]),
            value=header_text,
        )
        def headers(name: str, value: str) -> None:
            h = {name: value.encode("latin-1")}
            _fine(http.get("/v1/turns/nope/events", headers=h))
            _fine(http.post("/v1/turns", content=b'{"agent": 1}', headers={**JS, **h}))

        bodies()
        raw_bodies()
        paths()
        headers()
        listed = http.get("/v1/turns", params={"state": "queued,running,ended", "limit": 1000}).json()[
            "turns"
        ]
        assert {t["turn_id"] for t in listed} == accepted
        assert http.get("/v1/status").status_code == 200


# ---- the Python API and the daemon's clients ------------------------------------------------------


_odd = st.sampled_from(["a\x00b", "\ud800", "日本", "a/b", "", "x" * 300, "..", "\n"])
_value = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | _odd
    | st.binary(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner)
        | st.frozensets(st.integers(), max_size=2)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_numbers = (
    st.none() | st.floats(allow_nan=True) | st.integers(-5, 10**9) | st.booleans() | st.text(max_size=3)
)
_submits = st.fixed_dictionaries(
    {
        "agent": st.sampled_from(
            [ECHO, "examples.agents:noop", "examples.agents:missing", "nope", "__main__:x"]
        )
    },
    optional={
        "input": _value,
        "session": st.none() | _odd | st.text(max_size=8) | st.integers(),
        "turn_id": st.none() | _odd | st.text(max_size=8) | st.integers(),
        "timeout": _numbers,
        "grace": _numbers,
        "kill_after": _numbers,
        "retry": st.booleans() | st.none() | st.integers(0, 2),
    },
)


def test_fuzzed_submits_are_acknowledged_or_refused_the_same_embedded_and_through_a_client() -> None:
    """Hypothesis: ``submit`` with any agent, input, session, turn id, times and retry, on a
    ``SyncSupervisor`` and on a ``SyncClient`` of a daemon: each call either returns a handle whose
    turn ends (and a repeat under its id is that turn), or raises ``TypeError``/``ValueError`` at
    the call; both backends decide alike, what they accept obeys LINK-TURN-ID, and neither knows a turn it
    did not acknowledge."""
    from supervisor import SyncClient, SyncSupervisor

    accepted: list[set[str]] = [set(), set()]
    with (
        serving(*ONE) as d,
        SyncClient.connect(d.endpoint) as client,
        SyncSupervisor(workers=1, spares=0, grace=0.5, kill_after=0.5) as sup,
    ):
        backends = (sup, client)

        @FUZZ
        @given(call=_submits)
        def submits(call: dict[str, Any]) -> None:
            answers = []
            for backend, ids in zip(backends, accepted, strict=True):
                try:
                    handle = backend.submit(**call)
                except (TypeError, ValueError) as exc:
                    assert str(exc) and "\n" not in str(exc).strip(), exc
                    answers.append("refused")  # (with two faults, the backends may name either first)
                    continue
                ids.add(handle.turn_id)
                assert obeys_the_id_rule(handle.turn_id), call  # LINK-TURN-ID holds for what was accepted
                assert call.get("session") is None or obeys_the_id_rule(call["session"]), call
                result = handle.result()
                assert result.turn_id == handle.turn_id
                if call.get("turn_id") is not None:
                    assert backend.submit(**call).turn_id == handle.turn_id
                answers.append("accepted")
            assert answers[0] == answers[1], (call, answers)

        submits()
        for backend, ids in zip(backends, accepted, strict=True):
            assert sum(backend.status()["outcomes"].values()) == len(ids)
