"""The dashboard's views over HTTP against a real daemon: paged and filtered live lists with their
totals, the journal's history (errors and kill reasons on the rows), per-agent figures, the worker
log's tail, and an ended turn's worker pid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from supervisor.daemon.figures import AgentRing, kill_reason
from supervisor.http import AgentFigures, HistoryPage, HistoryTurn, LivePage
from tests.support import daemonkit
from tests.support.daemonkit import HTTP, serving
from tests.support.httpkit import result, submit
from wire import TurnResult

pytestmark = pytest.mark.anyio

TIMEOUT = httpx.Timeout(60.0)
SLOW = "examples.agents:slow"


def client(d: daemonkit.Served) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=d.http_url, timeout=TIMEOUT)


async def live(http: httpx.AsyncClient, **params: Any) -> LivePage:
    r = await http.get("/v1/live", params=params)
    assert r.status_code == 200, r.text
    return msgspec.json.decode(r.content, type=LivePage)


async def until_running(http: httpx.AsyncClient, count: int) -> None:
    with anyio.fail_after(60):
        while True:
            if (await live(http, state="running")).total >= count:
                return
            await anyio.sleep(0.05)  # allowed: a bounded poll of the daemon's state


async def test_live_lists_page_filter_and_count_queued_and_running_turns() -> None:
    """With 2 workers busy and 40 turns queued: running and queued are separate lists whose
    ``total`` counts every match while ``turns`` holds one page in queue order; the agent, session,
    id and search filters narrow both; bad paging or filters are 400s."""
    with serving("--workers", "2", "--spares", "0", "--drain", "0", "--no-journal", *HTTP) as d:
        async with client(d) as http:
            running = [await submit(http, SLOW, {"seconds": 60}, session=f"busy-{i}") for i in range(2)]
            await until_running(http, 2)
            queued = [
                await submit(http, "examples.agents:echo", {"i": i}, session=f"s{i % 2}") for i in range(40)
            ]
            page = await live(http, state="running")
            assert page.total == 2 and sorted(t.turn_id for t in page.turns) == sorted(running)
            whole = [t.turn_id for t in (await live(http, state="queued", limit=200)).turns]
            assert sorted(whole) == sorted(queued)  # each once, in dispatch order
            page = await live(http, state="queued", offset=10, limit=5)
            assert page.total == 40 and page.offset == 10
            assert [t.turn_id for t in page.turns] == whole[10:15]
            assert all(t.state == "queued" for t in page.turns)
            page = await live(http, state="queued", session="s1", limit=200)
            assert page.total == 20 and sorted(t.turn_id for t in page.turns) == sorted(queued[1::2])
            page = await live(http, state="queued", agent=SLOW)
            assert page.total == 0 and page.turns == []
            page = await live(http, state="queued", id=queued[7][:12])
            assert [t.turn_id for t in page.turns] == [queued[7]]
            page = await live(http, state="running", q="bus")
            assert page.total == 2
            for params in (
                {"offset": "-1"},
                {"limit": "0"},
                {"limit": "x"},
                {"state": "nope"},
                {"outcome": "won"},
                {"q": "x" * 300},
            ):
                r = await http.get("/v1/live", params=params)
                assert r.status_code == 400 and r.json()["error"]["code"] == "bad_value", (params, r.text)
            for turn_id in running:
                assert (await http.post(f"/v1/turns/{turn_id}/cancel")).status_code == 200


async def test_history_from_the_journal_shows_errors_kill_reasons_and_figures() -> None:
    """A failed, a completed and a killed turn: the journal's history pages and filters them, with
    the failed turn's error and the killed turn's cause and signal on their rows (and on the kept
    ended list); a turn's history page has its result and kept events; per-agent figures count them
    with their run times; an ended turn's state names the worker that ran it, as its result does."""
    with serving(
        "--workers", "2", "--spares", "0", "--grace", "0.3", "--kill-after", "0.3", "--drain", "0",
        "--journal-events", *HTTP,
    ) as d:  # fmt: skip
        async with client(d) as http:
            failed = await submit(http, "examples.agents:failing", session="h")
            done = await submit(http, "examples.agents:streamer", {"count": 3}, session="h")
            stuck = await submit(http, "examples.agents:stubborn")
            await until_running(http, 1)
            for turn_id in (failed, done):
                await result(http, turn_id)
            assert (await http.post(f"/v1/turns/{stuck}/cancel")).status_code == 200
            killed = await result(http, stuck)
            assert killed["outcome"] == "killed"
            signal = {-9: "sigkill", -15: "sigterm"}[killed["exit_code"]]

            r = await http.get("/v1/history", params={"limit": 2})
            page = msgspec.json.decode(r.content, type=HistoryPage)
            assert page.source == "journal" and page.total == 3
            assert [t.turn_id for t in page.turns] == [stuck, done]
            assert page.turns[0].kill_reason == f"user: {signal}" and page.turns[0].cause == "user"
            r = await http.get("/v1/history", params={"offset": 2, "limit": 2})
            assert [t["turn_id"] for t in r.json()["turns"]] == [failed]
            r = await http.get("/v1/history", params={"outcome": "failed"})
            (row,) = msgspec.json.decode(r.content, type=HistoryPage).turns
            assert row.turn_id == failed and row.error is not None and row.error.type == "ValueError"
            assert row.kill_reason is None and row.worker_pid is not None
            r = await http.get("/v1/history", params={"session": "h", "agent": "examples.agents:streamer"})
            assert [t["turn_id"] for t in r.json()["turns"]] == [done]
            assert (await http.get("/v1/history", params={"q": stuck[4:14]})).json()["total"] == 1
            assert (await http.get("/v1/history", params={"state": "bad"})).status_code == 400

            turn = msgspec.json.decode((await http.get(f"/v1/history/{done}")).content, type=HistoryTurn)
            assert isinstance(turn.result, TurnResult) and turn.result.outcome == "completed"
            assert [e["i"] for e in turn.events] == [0, 1, 2]
            r = await http.get(f"/v1/history/{stuck}")
            assert r.json()["kill_reason"] == f"user: {signal}"
            assert (await http.get("/v1/history/no-such-turn")).json()["error"]["code"] == "unknown_turn"

            ended = await live(http, state="ended", outcome="failed")
            assert ended.total == 1 and ended.turns[0].error is not None
            ended = await live(http, state="ended", outcome="killed")
            assert ended.turns[0].kill_reason == f"user: {signal}"

            state = (await http.get(f"/v1/turns/{done}/state")).json()
            done_result = await result(http, done)
            assert state["worker_pid"] == done_result["worker_pid"] is not None

            r = await http.get("/v1/agents")
            figures = msgspec.json.decode(r.content, type=AgentFigures)
            for window in ("5m", "1h"):
                streamer = figures.windows[window]["examples.agents:streamer"]
                assert streamer.turns == 1 and streamer.outcomes["completed"] == 1
                assert streamer.run_p50 is not None and streamer.run_p50 > 0
                assert figures.windows[window]["examples.agents:stubborn"].outcomes["killed"] == 1
            status = (await http.get("/v1/status")).json()
            assert status["size"] == {"workers": 2, "spares": 0}


async def test_history_without_a_journal_and_the_worker_log_tail(tmp_path: Path) -> None:
    """Without a journal the history is the ended turns the daemon keeps; with ``--worker-log FILE``
    the worker log view gives its last lines (bounded by ``lines``), and says where output goes
    when it is no file."""
    log = tmp_path / "workers.log"
    with serving("--workers", "1", "--spares", "0", "--no-journal", "--worker-log", str(log), *HTTP) as d:
        async with client(d) as http:
            ids = [await submit(http, "tests.agents.isolation:hello", f"n{i}") for i in range(3)]
            for turn_id in ids:
                await result(http, turn_id)
            r = await http.get("/v1/history")
            assert r.json()["source"] == "memory" and [t["turn_id"] for t in r.json()["turns"]] == ids[::-1]
            with anyio.fail_after(30):
                while True:
                    tail = (await http.get("/v1/worker-log", params={"lines": 2})).json()
                    if sorted(line.split()[-2:] for line in tail["lines"])[-2:] == [
                        ["hello-stderr", "n2"],
                        ["hello-stdout", "n2"],
                    ]:
                        break
                    await anyio.sleep(0.05)  # allowed: a bounded poll; the worker's output reaches the file
            assert tail["path"] == str(log) and len(tail["lines"]) == 2 and tail["truncated"]
            assert (await http.get("/v1/worker-log", params={"lines": "0"})).status_code == 400
    with serving("--workers", "1", "--spares", "0", "--no-journal", "--worker-log", "none", *HTTP) as d:
        async with client(d) as http:
            tail = (await http.get("/v1/worker-log")).json()
            assert tail == {"output": "discarded", "path": None, "lines": [], "truncated": False}
            doc = (await http.get("/v1/openapi.json")).json()
            for path in ("/v1/live", "/v1/history", "/v1/history/{turn_id}", "/v1/agents", "/v1/worker-log"):
                assert "200" in doc["paths"][path]["get"]["responses"], path


def test_agent_figures_percentiles_windows_and_bounds() -> None:
    """The per-agent ring: p50/p99 within 10 % of the true values, the 5-minute window leaves out
    older slots, slots older than the hour are dropped, and agents past the bound count as other."""
    figures = AgentRing(slot=10.0, slots=360, max_agents=2)

    def end(agent: str, at: float, run: float, outcome: str = "completed") -> None:
        res = TurnResult(
            turn_id="t", outcome=outcome, agent=agent, started=True, queued_s=0.01, run_s=run, ended_at=at
        )
        figures.add(None, res)  # type: ignore[arg-type]

    now = 100_000.0
    end("a", now - 1000, 50.0, "failed")  # 16 minutes ago: in the hour only
    for i in range(1, 101):
        end("a", now - 1, i / 100)  # run times 0.01 .. 1.00 s
    end("b", now - 1, 0.5)
    end("c", now - 1, 0.5, "killed")  # a third agent: counted as other
    five = figures.figures(300, now)
    a = five["a"]
    assert a["turns"] == 100 and a["outcomes"]["failed"] == 0
    assert 0.5 <= a["run_p50"] <= 0.55 and 0.99 <= a["run_p99"] <= 1.09
    assert five["other"]["outcomes"]["killed"] == 1 and "c" not in five
    hour = figures.figures(3600, now)
    assert hour["a"]["turns"] == 101 and hour["a"]["outcomes"]["failed"] == 1
    end("a", now + 4000, 1.0)  # more than an hour later: every older slot is gone
    assert len(figures.slots) == 1
    assert figures.figures(3600, now + 4000)["a"]["turns"] == 1
    for odd in (float("nan"), float("inf"), -1.0):  # never raises in the daemon's end hook
        figures.add(
            None,
            TurnResult(
                turn_id="t", outcome="completed", agent="z", started=True, run_s=odd, ended_at=now + 4000
            ),
        )  # type: ignore[arg-type]
    assert figures.figures(3600, now + 4000)["other"]["turns"] == 3
    assert kill_reason("killed", "timeout", -15) == "timeout: sigterm"
    assert (
        kill_reason("killed", None, None) == "no cause: killed" and kill_reason("failed", "user", -9) is None
    )
