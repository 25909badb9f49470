"""The ``--ray`` options of the front ends (issue 17), kept apart from the other options so the
cluster backend's flags are read and changed in one place. Never imports Ray: the backend is
opened through ``open_backend(ray=...)``, which imports ``supervisor.ray`` only when asked."""

from __future__ import annotations

import argparse

from .options import positive_int

RAY_HELP = (
    "run the jobs on a Ray cluster: 'auto' (the cluster this machine belongs to) or its address "
    "(needs the ray extra, and turnpool plus the agents importable on every node)"
)


def add_ray_options(parser: argparse.ArgumentParser) -> None:
    """``--ray ADDRESS`` and ``--workers-per-node N`` (default: each node's CPU count)."""
    parser.add_argument("--ray", metavar="ADDRESS", default=None, help=RAY_HELP)
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
