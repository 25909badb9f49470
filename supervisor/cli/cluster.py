"""The ``--ray`` options of the front ends (issue 17), kept apart from the other options so the
cluster backend's flags are read and changed in one place. Never imports Ray: the backend is
opened through ``open_backend(ray=...)``, which imports ``supervisor.ray`` only when asked."""

from __future__ import annotations

import argparse

from .options import positive_int

RAY_HELP = (
    "{what} on a Ray cluster: 'auto' (the cluster this machine belongs to) or its address "
    "(needs the ray extra, and turnpool plus the agents importable on every node)"
)


def add_ray_options(parser: argparse.ArgumentParser, *, what: str = "run the jobs") -> None:
    """``--ray ADDRESS`` and ``--workers-per-node N`` (default: each node's CPU count)."""
    parser.add_argument("--ray", metavar="ADDRESS", default=None, help=RAY_HELP.format(what=what))
    parser.add_argument(
        "--workers-per-node",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --ray: workers on each node (default: the node's CPUs)",
    )


def ray_conflict(args: argparse.Namespace) -> str | None:
    """Why these options cannot go with ``--ray``, or ``None``."""
    if getattr(args, "ray", None) is None:
        if getattr(args, "workers_per_node", None) is not None:
            return "--workers-per-node is for --ray"
        return None
    if getattr(args, "connect", None) is not None:
        return "--ray and --connect are two different backends: pick one"
    if getattr(args, "workers", None) is not None:
        return "--workers is the embedded pool's size; with --ray use --workers-per-node"
    return None


# ``serve`` options that only the local daemon has (a journal, HTTP, metrics, CURVE, a worker log):
# refused with --ray rather than silently ignored.
_LOCAL_ONLY = (
    "workers", "journal", "no_journal", "journal_events", "keep_days", "keep_turns", "durability", "http",
    "http_token", "metrics_port", "curve_secret_key", "curve_clients", "insecure_tcp", "worker_log", "config",
    "allow_agents",
)  # fmt: skip


def cmd_serve_ray(args: argparse.Namespace) -> int:
    """``turnpool serve --ray ADDRESS``: the client endpoint, turns run on the cluster's nodes."""
    import logging
    import sys

    from .._exitcodes import EXIT_USAGE
    from .._paths import default_endpoint

    if args.ray is None:
        print("turnpool serve: --workers-per-node is for --ray", file=sys.stderr)
        return EXIT_USAGE
    given = [name for name in _LOCAL_ONLY if getattr(args, name, None) not in (None, False, [])]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        print(f"turnpool serve: {flags} cannot go with --ray (the local daemon's options)", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=str(getattr(args, "log_level", None) or "WARNING").upper(), stream=sys.stderr)
    options = {
        "workers_per_node": args.workers_per_node,
        "grace": getattr(args, "grace", None),
        "kill_after": getattr(args, "kill_after", None),
        "spares": getattr(args, "spares", None),
        "agent_path": tuple(args.path) if getattr(args, "path", None) else None,
    }
    try:
        from ..ray.daemon import run_ray_daemon
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        print("turnpool serve: --ray needs Ray on this machine: pip install 'turnpool[ray]'", file=sys.stderr)
        return EXIT_USAGE

    try:
        return run_ray_daemon(
            getattr(args, "endpoint", None) or default_endpoint(),
            args.ray,
            **{name: value for name, value in options.items() if value is not None},
        )
    except (TypeError, ValueError) as exc:
        print(f"turnpool serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
