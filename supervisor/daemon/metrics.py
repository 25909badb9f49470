"""The daemon's Prometheus metrics, served over HTTP from the daemon's own event loop.

Metric values are read from the supervisor at scrape time, on the loop that owns them, so a
scrape never races the engine (no lock, no copy kept up to date). ``prometheus-client``
renders the text format; the HTTP side is a few lines of anyio (GET only, one response per
connection).

Every metric, its type, labels and meaning is in the reference table of ``docs/observability.md``
(``tests/test_metrics.py`` checks that table against what a scrape shows). OBS-AGENTS: per-agent
series carry an ``agent`` label bounded to the first ``AGENT_LABELS`` agent names the daemon sees;
later names share ``other``, so a client naming agents at will cannot grow the scrape.
"""

from __future__ import annotations

import collections
import errno
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from wire import TurnResult

from .._fds import is_shortage

if TYPE_CHECKING:
    from .._engine import TurnRecord
    from .._engine.supervisor import Supervisor

log = logging.getLogger("turnpool.daemon")

# DAEMON-FD: scrapes served at once (each holds a descriptor for up to 10 s); one more is closed at once.
METRICS_CONNECTIONS = 16
ACCEPT_RETRY = 0.1
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Queue and run times of agent turns span milliseconds to hours.
TURN_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
AGENT_LABELS = 20  # OBS-AGENTS: agent names with a label of their own; the rest are "other"


class MetricsUnavailable(OSError):
    """Raised by ``Daemon.serve`` (``turnpool serve --metrics-port``) when the metrics port cannot be
    bound; the message names the port and what to do."""


# OBS-METRICS: metrics are read from the supervisor and daemon at scrape time, not mirrored.
class Metrics:
    """Counters the daemon keeps, and the collector that reads the rest from the supervisor.

    Its collaborators: the ``Supervisor``, and the daemon's own facts read at scrape time —
    ``malformed`` (client frames refused), ``client_facts`` (CLIENT-STATE–CLIENT-NO-SKIP), ``journal_error``
    (JOURNAL-UNAVAILABLE: why submits cannot be made durable, or ``None``), ``fd_facts`` (DAEMON-FD) — and the
    registries of refused connections and shortages by front end, where it adds its own (``fd_refused``,
    ``fd_shortages``)."""

    def __init__(
        self,
        sup: Supervisor,
        *,
        malformed: Callable[[], int],
        client_facts: Callable[[], dict[str, int]],
        journal_error: Callable[[], str | None],
        fd_facts: Callable[[], dict[str, Any]],
        fd_refused: dict[str, Callable[[], int]],
        fd_shortages: dict[str, Callable[[], int]],
    ) -> None:
        self.sup = sup
        self.malformed = malformed
        self.client_facts = client_facts
        self.journal_error = journal_error
        self.fd_facts = fd_facts
        self.ended: collections.Counter[tuple[str, str]] = collections.Counter()
        self.by_agent: collections.Counter[tuple[str, str]] = collections.Counter()
        self.agents: dict[str, str] = {}  # OBS-AGENTS: agent name -> its label
        self.accepted = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.latency = Histogram(
            "turnpool_cancel_to_end_seconds",
            "Seconds from a cancel being asked to the turn's end",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queued = Histogram(
            "turnpool_queue_seconds",
            "Seconds turns waited from acceptance to their start (or end, never started), by agent",
            ["agent"],
            buckets=TURN_BUCKETS,
            registry=self.registry,
        )
        self.ran = Histogram(
            "turnpool_run_seconds",
            "Seconds turns ran, from their start to their end, by agent",
            ["agent"],
            buckets=TURN_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(self)
        self.active = 0  # scrape connections open
        self.refused = 0  # closed at once, past METRICS_CONNECTIONS
        self.accept_shortage = 0  # accepts that met EMFILE/ENFILE
        fd_refused["metrics"] = lambda: self.refused
        fd_shortages["accept_metrics"] = lambda: self.accept_shortage

    def agent_label(self, agent: str) -> str:
        label = self.agents.get(agent)
        if label is None:
            label = agent if len(self.agents) < AGENT_LABELS else "other"
            if label != "other":
                self.agents[agent] = label
        return label

    def turn_ended(self, turn: TurnRecord, result: TurnResult, asked_at: float | None) -> None:
        self.ended[(result.outcome, result.cause.kind if result.cause is not None else "none")] += 1
        agent = self.agent_label(result.agent or turn.agent)
        self.by_agent[(agent, result.outcome)] += 1
        self.queued.labels(agent).observe(result.queued_s)
        if result.started:
            self.ran.labels(agent).observe(result.run_s)
        if asked_at is not None and turn.ended_at is not None:
            self.latency.observe(max(0.0, turn.ended_at - asked_at))

    def collect(self) -> Iterator[Metric]:
        sup = self.sup
        turns = CounterMetricFamily(
            "turnpool_turns", "Turns ended, by outcome and cause", labels=["outcome", "cause"]
        )
        for (outcome, cause), n in sorted(self.ended.items()):
            turns.add_metric([outcome, cause], n)
        yield turns
        agent_turns = CounterMetricFamily(
            "turnpool_agent_turns", "Turns ended, by agent and outcome", labels=["agent", "outcome"]
        )
        for (agent, outcome), n in sorted(self.by_agent.items()):
            agent_turns.add_metric([agent, outcome], n)
        yield agent_turns
        malformed = CounterMetricFamily(
            "turnpool_malformed_frames", "Frames that did not decode", labels=["link"]
        )
        malformed.add_metric(["client"], self.malformed())
        malformed.add_metric(["worker"], sup.bad_frames)
        yield malformed
        yield CounterMetricFamily(
            "turnpool_turns_accepted", "New turns accepted from clients", value=self.accepted
        )
        facts = self.client_facts()
        yield GaugeMetricFamily(
            "turnpool_clients", "Client connections the daemon holds state for", value=facts["clients"]
        )
        yield GaugeMetricFamily(
            "turnpool_client_waits", "Pending result, follow and when_idle requests", value=facts["waits"]
        )
        yield GaugeMetricFamily("turnpool_client_streams", "Open follows", value=facts["streams"])
        yield CounterMetricFamily(
            "turnpool_clients_disconnected",
            "Clients that went away (ordinary: their state is freed)",
            value=facts["clients_disconnected"],
        )
        dropped = CounterMetricFamily(
            "turnpool_clients_dropped",
            "Clients whose pending requests were dropped: gone with requests pending, or stalled",
            labels=["why"],
        )
        dropped.add_metric(["gone"], facts["clients_gone"])
        dropped.add_metric(["stalled"], facts["clients_stalled"])
        yield dropped
        yield CounterMetricFamily(
            "turnpool_lagged_followers",
            "Followers dropped and told (lagged)",
            value=facts["lagged_followers"],
        )
        yield GaugeMetricFamily(
            "turnpool_journal_available",
            "1 while the journal can be written (submits are acknowledged), 0 when not",
            value=0 if self.journal_error() is not None else 1,
        )
        yield from self._fds()
        yield GaugeMetricFamily("turnpool_queue_depth", "Turns waiting for a worker", value=len(sup.queue))
        yield GaugeMetricFamily(
            "turnpool_turns_running", "Turns handed to a worker and not ended", value=sup.running
        )
        states: collections.Counter[str] = collections.Counter(
            {"busy": 0, "idle": 0, "starting": 0, "stopping": 0}
        )
        for slot in sup.pool.slots.values():
            states[slot.state] += 1
        workers = GaugeMetricFamily("turnpool_workers", "Worker processes by state", labels=["state"])
        for state, n in sorted(states.items()):
            workers.add_metric([state], n)
        yield workers
        esc = CounterMetricFamily("turnpool_escalations", "Escalation steps taken", labels=["step"])
        for step in ("sigterm", "sigkill"):
            esc.add_metric([step], sup.escalations.get(step, 0))
        yield esc
        yield CounterMetricFamily(
            "turnpool_worker_restarts",
            "Workers replaced after dying or being killed",
            value=sup.worker_restarts,
        )
        out = sup.pool.output
        yield CounterMetricFamily(
            "turnpool_worker_output_dropped_bytes",
            "Bytes of workers' output lost (a log file that could not be written, a stderr not read)",
            value=out.dropped if out is not None else 0,
        )
        yield CounterMetricFamily(
            "turnpool_worker_output_dropped_lines",
            "Lines of workers' output lost",
            value=out.dropped_lines if out is not None else 0,
        )
        yield CounterMetricFamily(
            "turnpool_worker_endpoint_rebinds",
            "Times the worker endpoint was bound again after its socket file was deleted (WORKER-REBIND)",
            value=sup.link.rebinds,
        )
        yield GaugeMetricFamily(
            "turnpool_worker_start_failures",
            "Worker starts that failed in a row (0: the last one succeeded; the reason is in status)",
            value=sup.pool.start_failures,
        )

    def _fds(self) -> Iterator[Metric]:
        """DAEMON-FD: descriptors open and allowed, shortages met, connections refused past a share."""
        fds = self.fd_facts()
        yield GaugeMetricFamily(
            "turnpool_fds_open", "File descriptors the daemon has open", value=fds["open"] or 0
        )
        yield GaugeMetricFamily(
            "turnpool_fds_limit", "The daemon's file descriptor limit", value=fds["limit"]
        )
        short = CounterMetricFamily(
            "turnpool_fd_shortage",
            "EMFILE/ENFILE met (each backed off and retried), by where",
            labels=["where"],
        )
        for where in sorted(
            {"worker_start", "accept_http", "accept_clients", "accept_metrics", *fds["shortage"]}
        ):
            short.add_metric([where], fds["shortage"].get(where, 0))
        yield short
        refused = CounterMetricFamily(
            "turnpool_connections_refused",
            "Connections closed at once past a front end's share of file descriptors",
            labels=["front_end"],
        )
        for front_end, n in sorted(fds["refused"].items()):
            refused.add_metric([front_end], n)
        yield refused

    def render(self) -> bytes:
        return generate_latest(self.registry)

    @staticmethod
    async def listen(host: str, port: int) -> Any:
        """Bind ``host:port`` (0: any free port) for ``serve``. Raises ``MetricsUnavailable`` naming the
        port and the fix; the daemon binds it before it starts its workers, so a taken port is one
        line at once (issue 15, item 14)."""
        try:
            return await anyio.create_tcp_listener(local_host=host, local_port=port)
        except OSError as exc:
            why = (
                "is already in use"
                if exc.errno == errno.EADDRINUSE
                else f"cannot be used ({exc.strerror or exc})"
            )
            raise MetricsUnavailable(
                f"--metrics-port {port}: {host}:{port} {why}; choose another port (0: any free one)"
            ) from None

    async def serve(self, host: str, listener: Any, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        """Serve ``GET /metrics`` on ``listener`` (from ``listen``); reports the bound port."""
        async with listener:
            bound = listener.extra(SocketAttribute.local_port)
            log.info("metrics on http://%s:%s/metrics", host, bound)
            task_status.started(bound)
            # DAEMON-FD: one connection accepted at a time, at most METRICS_CONNECTIONS open; an accept that
            # finds no descriptor is counted and retried after a pause, never raised out of the daemon.
            async with anyio.create_task_group() as tg:
                for one in getattr(listener, "listeners", [listener]):
                    tg.start_soon(self._accept, one, tg)

    async def _accept(self, listener: Any, tg: anyio.abc.TaskGroup) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if not is_shortage(exc):
                    raise
                self.accept_shortage += 1
                await anyio.sleep(ACCEPT_RETRY)  # a back-off: descriptors are freed elsewhere
                continue
            if self.active >= METRICS_CONNECTIONS:
                self.refused += 1
                await stream.aclose()
                continue
            self.active += 1
            tg.start_soon(self._http, stream)

    async def _http(self, stream: anyio.abc.SocketStream) -> None:
        try:
            await self._answer(stream)
        finally:
            self.active -= 1

    async def _answer(self, stream: anyio.abc.SocketStream) -> None:
        try:
            async with stream:
                with anyio.fail_after(10):
                    head = b""
                    while b"\r\n\r\n" not in head and len(head) < 65536:
                        head += await stream.receive(65536)
                    line = head.split(b"\r\n", 1)[0].split()
                    if len(line) < 2 or line[0] != b"GET":
                        await stream.send(_response(405, b"only GET\n", "text/plain"))
                    elif line[1].split(b"?")[0] not in (b"/", b"/metrics"):
                        await stream.send(_response(404, b"try /metrics\n", "text/plain"))
                    else:
                        await stream.send(_response(200, self.render(), CONTENT_TYPE_PLAIN_0_0_4))
        except Exception as exc:  # noqa: BLE001 - a bad scrape never hurts the daemon
            log.debug("metrics request failed: %r", exc)


def _response(code: int, body: bytes, ctype: str) -> bytes:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}[code]
    head = (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body
