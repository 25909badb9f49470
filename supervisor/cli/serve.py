"""``turnpool serve``: the command that is the daemon (its options, its TOML config, the journal and
the HTTP front end it opens). The commands that talk to a running daemon are ``daemon_client.py``.

Exit codes: 0 done, 1 failed (the daemon could not start or stopped on an error), 2 bad usage or
input.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tomllib
from collections.abc import Callable
from typing import Any

from .._exitcodes import EXIT_FAILED, EXIT_USAGE
from . import cluster, options


def _on_off(value: str) -> bool:
    """``on`` / ``off`` (also true/false, yes/no, 1/0) for a boolean ``serve`` option."""
    v = value.strip().lower()
    if v in ("on", "true", "yes", "1"):
        return True
    if v in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {value!r}")


# Options of ``serve`` that go to ``Supervisor`` (name, type, help). The same options come from a TOML
# config too, so ``Supervisor`` validates both; the shared ones (workers, spares, grace, kill-after)
# are parsed by ``options.py``'s types, which apply the same engine rules to a flag.
SUPERVISOR_OPTIONS: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("workers", options.workers, "worker processes running turns (default 4)"),
    ("grace", options.grace, "seconds a cancelled turn has to stop before SIGTERM (default 5)"),
    ("kill_after", options.kill_after, "seconds after SIGTERM before SIGKILL (default 2)"),
    (
        "max_grace",
        float,
        "cap on the grace and kill-after a client may ask for; a submit above it is refused (default 300)",
    ),
    ("spares", options.spares, "warm spare workers (default 1)"),
    ("max_turns_per_worker", int, "replace a worker after this many turns (default: never)"),
    (
        "max_rss_mb",
        float,
        "cancel a turn (cause memory) whose worker tree passes this many MiB (PSS: shared "
        "pages split between the processes mapping them)",
    ),
    ("timeout", float, "default turn timeout in seconds (default: none)"),
    ("max_queue", int, "queued turns before submits get QueueFull (default 100000)"),
    (
        "max_input_mb",
        float,
        "MiB of inputs the turns not ended yet may hold; a submit past it gets QueueFull (default 2048)",
    ),
    ("max_events", int, "events kept per turn for late followers (default 10000)"),
    ("keep_results", int, "ended turns kept for result/follow, oldest evicted first (default 10000)"),
    (
        "keep_events_mb",
        float,
        "MiB of events kept in all for ended turns' late followers, the oldest turns' dropped "
        "first (default 256)",
    ),
    (
        "keep_results_mb",
        float,
        "MiB of outputs kept for the ended turns; past it the oldest are forgotten first (default 1024)",
    ),
    ("heartbeat", float, "worker heartbeat interval in seconds (default 1)"),
    ("start_timeout", float, "seconds a worker has to become ready (default 30)"),
    ("stop_timeout", float, "seconds an idle worker has to exit when retired (default 5)"),
    ("rss_interval", float, "seconds between memory checks when --max-rss-mb is set (default 0.25)"),
    ("python", str, "interpreter that runs the workers (default: this one)"),
    (
        "worker_nice",
        int,
        "run workers at this niceness, 0-19, below the daemon (default: the daemon's own), so busy "
        "workers never starve the daemon that delivers their events",
    ),
    (
        "tracing",
        _on_off,
        "on: an OpenTelemetry span per turn, and the turn's context carried to its agent (default off; "
        "needs the otel extra; OTEL_TRACES_EXPORTER=console writes spans to stderr)",
    ),
    (
        "cgroups",
        _on_off,
        "on (default): each worker in its own cgroup v2 where the hierarchy is writable, "
        "killed at once with cgroup.kill; off: subreaper and tree markers only",
    ),
)
DAEMON_OPTIONS: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("endpoint", str, "client endpoint (default: TURNPOOL_ENDPOINT or ipc:// in the runtime dir)"),
    ("drain", float, "seconds accepted turns may finish after SIGTERM/SIGINT (default 30)"),
    ("metrics_port", int, "serve Prometheus metrics on this port (0: any free port)"),
    ("metrics_host", str, "address for the metrics server (default 127.0.0.1)"),
    ("curve_secret_key", str, "CURVE: the daemon's certificate file with its secret key"),
    ("curve_clients", str, "CURVE: directory of the public certificates of allowed clients"),
    (
        "journal",
        str,
        "the SQLite journal of every accepted turn (default: one per endpoint in the per-user "
        "state dir; see `turnpool history`)",
    ),
    ("keep_days", float, "delete ended turns older than this many days from the journal"),
    (
        "keep_turns",
        int,
        "keep at most this many ended turns in the journal, the newest (default 100,000; 0: all)",
    ),
    (
        "durability",
        str,
        "journal commits: 'normal' (default; survives a daemon crash, not a power loss) or "
        "'full' (fsync at each commit: survives a power loss too; slower)",
    ),
    ("log_level", str, "DEBUG, INFO, WARNING (default), ERROR"),
    (
        "http",
        str,
        "serve the HTTP/SSE API and the dashboard on HOST:PORT (a bare PORT: 127.0.0.1; "
        "0: any free port); needs the http extra",
    ),
    (
        "http_token",
        str,
        "file holding the bearer token every /v1 request must then carry (required off loopback)",
    ),
    (
        "http_stall",
        float,
        "seconds an HTTP client may leave a response unread before it is dropped (default 30)",
    ),
)
DEFAULTS: dict[str, Any] = {"drain": 30.0, "metrics_host": "127.0.0.1", "log_level": "WARNING"}


JOURNAL_CLOSE_TIMEOUT = 5.0
"""Seconds ``turnpool serve`` waits for its journal at shutdown before giving up (JOURNAL-UNAVAILABLE)."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run the daemon",
        description=(
            "Run the turnpool daemon: a pool of workers behind a client endpoint. SIGTERM/SIGINT drains "
            "(--drain seconds), then disposes every turn (cause disposed) and exits 0; a second signal skips "
            "the drain and SIGKILLs every turn at once. Prints a 'ready' line on stdout once clients can "
            "connect."
        ),
    )
    serve.add_argument(
        "--config", metavar="FILE", help="TOML file with any of these options (flags override)"
    )
    for name, kind, text in DAEMON_OPTIONS + SUPERVISOR_OPTIONS:
        serve.add_argument(_flag(name), dest=name, type=kind, default=None, help=text)
    serve.add_argument(
        "--journal-events",
        dest="journal_events",
        action="store_const",
        const=True,
        default=None,
        help="record the turns' events in the journal too",
    )
    serve.add_argument(
        "--allow-agent",
        dest="allow_agents",
        action="append",
        default=None,
        metavar="PATTERN",
        help="an agent clients may name, as a glob on package.module:attr (e.g. 'myapp.agents:*'); "
        "repeatable; any other is refused at submit and never imported. Required when another user "
        "can reach a front end (tcp://, abstract ipc://@, --http off loopback); default: every agent, "
        "for front ends only this user can reach",
    )
    serve.add_argument(
        "--insecure-tcp",
        dest="insecure_tcp",
        action="store_const",
        const=True,
        default=None,
        help="allow tcp:// without CURVE (trusted networks only; refused otherwise)",
    )
    serve.add_argument(
        "--no-journal",
        dest="no_journal",
        action="store_const",
        const=True,
        default=None,
        help="run without a journal: nothing survives a restart",
    )
    options.add_path(
        serve,
        help="a directory workers import agents from (repeatable). Nothing else is searched "
        "but PYTHONPATH's absolute entries and installed packages: never the daemon's "
        "working directory (`--path .` says so explicitly)",
    )
    serve.add_argument(
        "--worker-log",
        dest="worker_log",
        default=None,
        metavar="FILE",
        help="where workers' stdout and stderr go: a log file rotated by size (default: "
        "workers-<key>.log in the per-user state dir, next to the journal), 'stderr' "
        "(forwarded, never blocking the daemon), or 'none'",
    )
    serve.add_argument(
        "--worker-log-max-mb",
        dest="worker_log_max_mb",
        type=float,
        default=None,
        metavar="MB",
        help="size of the worker log before it is rotated; 4 files are kept (default 16)",
    )
    cluster.add_ray_options(serve, what="run the turns")
    serve.set_defaults(func=cmd_serve)


def _fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"turnpool: {message}", file=sys.stderr, flush=True)
    return code


# ---- serve ---------------------------------------------------------------------------


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    """Merge built-in defaults < the TOML config < flags. Raises ``ValueError`` on unknown keys."""
    known: dict[str, Any] = {name: kind for name, kind, _ in DAEMON_OPTIONS + SUPERVISOR_OPTIONS}
    known["journal_events"] = bool
    known["no_journal"] = bool
    known["insecure_tcp"] = bool
    known["allow_agents"] = list
    known["path"] = list
    known["worker_log"] = str
    known["worker_log_max_mb"] = float
    merged: dict[str, Any] = dict(DEFAULTS)
    if args.config:
        with open(args.config, "rb") as f:
            config = tomllib.load(f)
        for key, value in config.items():
            name = key.replace("-", "_")
            if name not in known:
                raise ValueError(f"{args.config}: unknown option {key!r}; known: {', '.join(sorted(known))}")
            if known[name] is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            merged[name] = value
    for name in known:
        value = getattr(args, name, None)
        if value is not None:
            merged[name] = value
    return merged


def _isolation_options(opts: dict[str, Any]) -> dict[str, Any]:
    """``--path``, ``--worker-log`` and ``--worker-log-max-mb`` as ``Supervisor`` options (WORKER-PATH,
    WORKER-OUTPUT).

    The daemon's workers import from the ``--path`` directories only (nothing implicit), and
    write their output to a rotated log file by default, never to the daemon's stderr.
    """
    from .._paths import default_endpoint, default_worker_log

    paths = opts.pop("path", None) or []
    if isinstance(paths, str) or not isinstance(paths, list):
        raise TypeError(f"path must be a list of directories, got {paths!r}")
    out: dict[str, Any] = {"agent_path": tuple(paths)}
    log = opts.pop("worker_log", None)
    if log is None:
        log = str(default_worker_log(opts.get("endpoint") or default_endpoint()))
    elif log == "none":
        log = None
    out["worker_output"] = log
    max_mb = opts.pop("worker_log_max_mb", None)
    if max_mb is not None:
        out["worker_output_max_mb"] = max_mb
    return out


def cmd_serve(args: argparse.Namespace) -> int:
    if args.ray is not None or args.workers_per_node is not None:
        return cluster.cmd_serve_ray(args)
    from ..daemon.server import Daemon, run_daemon

    try:
        opts = load_options(args)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        return _fail(f"serve: {exc}", EXIT_USAGE)
    level = str(opts.pop("log_level")).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        return _fail(f"serve: --log-level must be DEBUG, INFO, WARNING or ERROR, got {level!r}", EXIT_USAGE)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    sup = {name: opts.pop(name) for name, _, _ in SUPERVISOR_OPTIONS if name in opts}
    if "allow_agents" in opts:  # SEC-ALLOW: the supervisor refuses other agents, spawned ones too
        sup["allow_agents"] = opts.pop("allow_agents")
    try:
        sup.update(_isolation_options(opts))
    except (TypeError, ValueError) as exc:
        return _fail(f"serve: {exc}", EXIT_USAGE)
    journal_path = opts.pop("journal", None)
    keep_days = opts.pop("keep_days", None)
    keep_turns = opts.pop("keep_turns", None)  # JOURNAL-KEEP-NEWEST: None here means the journal's default
    journal_events = bool(opts.pop("journal_events", False))
    no_journal = bool(opts.pop("no_journal", False))
    http_options: dict[str, Any] = {
        name: opts.pop(name) for name in ("http", "http_token", "http_stall") if name in opts
    }
    durability = opts.pop("durability", None)
    if no_journal and (
        journal_path is not None
        or keep_days is not None
        or keep_turns is not None
        or journal_events
        or durability is not None
    ):
        return _fail(
            "serve: --no-journal cannot go with --journal, --keep-days, --keep-turns, --journal-events "
            "or --durability",
            EXIT_USAGE,
        )
    if keep_turns is not None and keep_turns < 0:
        return _fail(f"serve: --keep-turns must be 0 (keep all) or more, got {keep_turns}", EXIT_USAGE)
    if durability is not None and durability not in ("normal", "full"):
        return _fail(f"serve: --durability must be 'normal' or 'full', got {durability!r}", EXIT_USAGE)
    try:
        daemon = Daemon(opts.pop("endpoint", None), supervisor=sup, **opts)
    except (TypeError, ValueError) as exc:
        return _fail(f"serve: {exc}", EXIT_USAGE)
    if http_options:
        code = _attach_http(daemon, http_options)
        if code is not None:
            return code
    if no_journal:
        return run_daemon(daemon)
    from .._errors import DaemonAlreadyRunning
    from ..daemon.recovery import attach_journal
    from ..journal import Journal, JournalError, default_journal_path

    if journal_path is None:
        journal_path = str(default_journal_path(daemon.endpoint))
    try:
        # Claim the endpoint first: a second daemon is told about the daemon, not about its journal.
        daemon._endpoint.claim()
    except (DaemonAlreadyRunning, ValueError, OSError) as exc:
        print(f"turnpool serve: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    try:
        retention = {} if keep_turns is None else {"keep_turns": keep_turns}
        journal = Journal.open(
            journal_path,
            keep_days=keep_days,
            events=journal_events,
            durability=durability or "normal",
            **retention,
        )
    except (JournalError, OSError) as exc:
        daemon._endpoint.release()
        return _fail(f"serve: {exc}")
    code = EXIT_FAILED
    try:
        attach_journal(daemon, journal)
        code = run_daemon(daemon)
    finally:
        # JOURNAL-UNAVAILABLE: bounded even when the disk stalls or fails; what could not be written is said.
        if not journal.close(timeout=JOURNAL_CLOSE_TIMEOUT):
            print(
                f"turnpool serve: journal {journal.path} could not be written at shutdown "
                f"({journal.error or 'the disk did not answer'}): the last turns' ends are not recorded; "
                "after a restart they end crashed",
                file=sys.stderr,
                flush=True,
            )
            code = code or EXIT_FAILED
    return code


def _attach_http(daemon: Any, options: dict[str, Any]) -> int | None:
    """Put the HTTP front end on ``daemon``; an exit code when it cannot be (missing extra, bad flags)."""
    if "http" not in options:
        return _fail("serve: --http-token and --http-stall go with --http HOST:PORT", EXIT_USAGE)
    try:
        from ..http import attach_http
    except ImportError as exc:
        return _fail(f"serve: --http needs the http extra (pip install 'turnpool[http]'): {exc}")
    try:
        attach_http(
            daemon,
            str(options["http"]),
            token_file=options.get("http_token"),
            stall=options.get("http_stall"),
        )
    except (OSError, ValueError) as exc:
        return _fail(f"serve: {exc}", EXIT_USAGE)
    return None
