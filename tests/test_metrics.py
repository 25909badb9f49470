"""The daemon's Prometheus metrics: the reference table is the truth, agents are labelled within a
bound, queue/run/cancel times are histograms (HTTP cancels included), and an ordinary disconnect is
not counted as a dropped client (design rule OBS-AGENTS; ``docs/reference.md``)."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import zmq

import wire
from supervisor import Client
from supervisor.daemon.metrics import AGENT_LABELS, Metrics
from tests.support.daemonkit import FAST, HTTP, ROOT, serving
from tests.support.events import first_event
from wire import client_link

pytestmark = pytest.mark.anyio

BOUND = 60.0
DOC = Path(ROOT) / "docs" / "reference.md"


def _scrape(url: str) -> tuple[dict[str, float], set[str]]:
    """The samples (``name{labels}`` → value) and the metric families a scrape declares."""
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    values, families = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name = line.split()[2]
            if not name.endswith("_created"):  # prometheus-client's creation-time gauges
                families.add(name)
        elif line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values, families


def _documented() -> set[str]:
    table = DOC.read_text().split("## Prometheus metrics", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(turnpool_[a-z_]+)` \|", table, re.M))


def test_agent_labels_are_bounded_and_stable() -> None:
    """OBS-AGENTS, the policy alone: the first ``AGENT_LABELS`` names keep their label for good; every
    later one is ``other``, however many there are."""
    metrics = Metrics(
        None,  # type: ignore[arg-type]  # no supervisor: the collector is not scraped here
        malformed=lambda: 0,
        client_facts=dict,
        journal_error=lambda: None,
        fd_facts=dict,
        fd_refused={},
        fd_shortages={},
    )
    names = [f"pkg.mod:agent{i}" for i in range(AGENT_LABELS + 50)]
    labels = [metrics.agent_label(name) for name in names]
    assert labels[:AGENT_LABELS] == names[:AGENT_LABELS]
    assert set(labels[AGENT_LABELS:]) == {"other"}
    assert [metrics.agent_label(name) for name in names[:3]] == names[:3]
    assert len(metrics.agents) == AGENT_LABELS


async def test_the_reference_table_is_what_a_scrape_shows_and_http_cancels_are_timed() -> None:
    """Every family a scrape declares is in the table and every row of the table is scraped; turns
    of two agents give per-agent counts and queue/run histograms; a cancel made over HTTP is timed in
    ``cancel_to_end_seconds``; clients that connect, run a turn and leave count as disconnected,
    not as dropped."""
    with serving(*FAST, *HTTP, "--metrics-port", "0") as d:
        for _ in range(2):
            async with Client.connect(d.endpoint) as client:
                with anyio.fail_after(BOUND):
                    assert (await client.run("examples.agents:echo", {"text": "hi"})).outcome == "completed"
                    assert (await client.run("examples.agents:failing")).outcome == "failed"
        async with Client.connect(d.endpoint) as client, httpx.AsyncClient(base_url=d.http_url) as http:
            with anyio.fail_after(BOUND):
                submitted = await http.post(
                    "/v1/turns", json={"agent": "examples.agents:slow", "input": {"seconds": 60}}
                )
                turn_id = submitted.json()["turn_id"]
                await first_event(client.handle(turn_id))
                cancelled = await http.post(f"/v1/turns/{turn_id}/cancel")
                assert cancelled.status_code == 200, cancelled.text
                assert (await client.handle(turn_id).result()).outcome == "aborted"
                await client.when_idle()
        with anyio.fail_after(BOUND):
            while True:
                values, families = await anyio.to_thread.run_sync(_scrape, d.metrics_url)
                if values.get("turnpool_clients_disconnected_total", 0) >= 2:
                    break
                await anyio.sleep(0.05)  # allowed: the disconnect is seen by the daemon's monitor
    assert families == _documented(), families ^ _documented()
    assert values['turnpool_agent_turns_total{agent="examples.agents:echo",outcome="completed"}'] == 2
    assert values['turnpool_agent_turns_total{agent="examples.agents:failing",outcome="failed"}'] == 2
    assert values['turnpool_run_seconds_count{agent="examples.agents:echo"}'] == 2
    assert values['turnpool_queue_seconds_count{agent="examples.agents:slow"}'] == 1
    assert values["turnpool_cancel_to_end_seconds_count"] == 1  # the HTTP cancel
    assert values['turnpool_clients_dropped_total{why="gone"}'] == 0


async def test_a_client_gone_with_a_wait_pending_counts_as_dropped() -> None:
    """A client that asks for a running turn's result and vanishes before it comes: its pending
    wait is dropped, and ``clients_dropped_total{why="gone"}`` counts it."""
    with serving(*FAST, "--metrics-port", "0") as d:
        async with Client.connect(d.endpoint) as client:
            handle = await client.submit("examples.agents:slow", {"seconds": 60})
            with anyio.fail_after(BOUND):
                await first_event(handle)
            ctx = zmq.Context()
            raw = ctx.socket(zmq.DEALER)
            raw.setsockopt(zmq.LINGER, 0)
            raw.connect(d.endpoint)
            raw.send(wire.encode(client_link.Hello(1, client_link.CLIENT_PROTOCOL_VERSION)))
            raw.send(wire.encode(client_link.GetResult(2, handle.turn_id)))
            with anyio.fail_after(BOUND):
                while (await client.status())["daemon"]["clients"] < 2:  # noqa: ASYNC110
                    await anyio.sleep(0.02)  # allowed: the raw client's frames are on their way
            raw.close()
            ctx.term()
            with anyio.fail_after(BOUND):
                while True:
                    values: Any
                    values, _ = await anyio.to_thread.run_sync(_scrape, d.metrics_url)
                    if values['turnpool_clients_dropped_total{why="gone"}'] >= 1:
                        break
                    await anyio.sleep(0.05)  # allowed: the disconnect is seen by the daemon's monitor
            await handle.cancel()
    assert values['turnpool_clients_dropped_total{why="gone"}'] == 1
