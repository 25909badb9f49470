"""The engine's options as one frozen value: what ``Supervisor(...)`` was given, checked once.

``EngineOptions.checked`` validates every argument of ``Supervisor.__init__`` (the clear one-line
errors at the boundary) and returns the value every part reads: the pool's size, the ladder's
default grace and kill_after and their cap, the queue's limits, prefetch, the watchdog's limit.
Nothing changes it after construction; a part that needs an option gets this value, not the
``Supervisor``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .._checks import check_grace, check_mib, check_seconds, check_sizes, mib_bytes, require_seconds
from . import output as _output
from . import procs as _procs
from .allowlist import AgentAllowlist


@dataclasses.dataclass(frozen=True, slots=True)
class EngineOptions:
    """What every part of the engine reads of the supervisor's settings (see ``Supervisor``)."""

    workers: int = 4
    grace: float = 5.0
    kill_after: float = 2.0
    spares: int = 1
    max_turns_per_worker: int | None = None
    max_rss_mb: float | None = None
    timeout: float | None = None
    max_queue: int = 100_000
    max_input_bytes: int = 2048 * 2**20  # MEM-INPUTS
    max_events: int = 10_000
    keep_results: int = 10_000
    keep_event_bytes: int = 256 * 2**20
    keep_result_bytes: int = 1024 * 2**20
    heartbeat: float = 1.0
    start_timeout: float = 30.0
    rss_interval: float = 0.25
    stop_timeout: float = 5.0
    python: str | None = None
    worker_args: tuple[str, ...] = ()
    prefetch: int = 64  # turns a worker may hold at once (running + handed ahead); 1: off
    # Work (seconds, at the recent mean turn time) a worker may hold beyond its current turn.
    prefetch_window: float = 0.002
    # Fork workers from a preloaded zygote (a few ms, not ≈50 ms+); ``preload``: modules it imports.
    use_zygote: bool = True
    preload: tuple[str, ...] = ()
    cgroups: bool = True
    agent_path: tuple[str, ...] | None = None
    worker_output: str | Path | None = _output.STDERR
    worker_output_max_mb: float = _output.MAX_BYTES / 2**20
    max_grace: float = 300.0
    worker_nice: int | None = None
    allow_agents: AgentAllowlist | None = None  # SEC-ALLOW

    @classmethod
    def checked(
        cls,
        *,
        workers: int,
        grace: float,
        kill_after: float,
        spares: int,
        max_turns_per_worker: int | None,
        max_rss_mb: float | None,
        timeout: float | None,
        max_queue: int,
        max_input_mb: float,
        max_events: int,
        keep_results: int,
        keep_events_mb: float,
        keep_results_mb: float,
        heartbeat: float,
        start_timeout: float,
        rss_interval: float,
        stop_timeout: float,
        python: str | None,
        worker_args: tuple[str, ...],
        prefetch: int,
        prefetch_window: float,
        zygote: bool,
        preload: tuple[str, ...],
        cgroups: bool,
        agent_path: Any,
        worker_output: Any,
        worker_output_max_mb: float,
        max_grace: float,
        worker_nice: int | None,
        allow_agents: Any,
    ) -> EngineOptions:
        """``Supervisor(...)``'s arguments, checked: ``TypeError``/``ValueError`` with one line each."""
        check_sizes(
            cgroups=cgroups,
            workers=workers,
            spares=spares,
            max_queue=max_queue,
            max_events=max_events,
            keep_results=keep_results,
            prefetch=prefetch,
            max_turns_per_worker=max_turns_per_worker,
        )
        # R-GRACE: the cap on every turn's grace and kill_after (a submit above it is refused): a
        # turn's ladder, and so a disposal, is bounded whatever a client asks for.
        # LADDER-BOUNDED: shutdown is bounded whatever a client asks for.
        cap = require_seconds("max_grace", max_grace, positive=True)
        return cls(
            workers=workers,
            grace=check_grace("grace", require_seconds("grace", grace), cap),
            kill_after=check_grace("kill_after", require_seconds("kill_after", kill_after), cap),
            spares=spares,
            max_turns_per_worker=max_turns_per_worker,
            max_rss_mb=check_seconds("max_rss_mb", max_rss_mb, positive=True),
            timeout=check_seconds("timeout", timeout, positive=True),
            max_queue=max_queue,
            max_input_bytes=mib_bytes("max_input_mb", max_input_mb),  # MEM-INPUTS
            max_events=max_events,
            keep_results=keep_results,
            keep_event_bytes=mib_bytes("keep_events_mb", keep_events_mb),  # MEM-EVENTS
            keep_result_bytes=mib_bytes("keep_results_mb", keep_results_mb),  # MEM-OUTPUTS
            heartbeat=require_seconds("heartbeat", heartbeat),
            start_timeout=require_seconds("start_timeout", start_timeout, positive=True),
            rss_interval=require_seconds("rss_interval", rss_interval, positive=True),
            stop_timeout=require_seconds("stop_timeout", stop_timeout),
            python=python,
            worker_args=tuple(worker_args),
            prefetch=prefetch,
            prefetch_window=require_seconds("prefetch_window", prefetch_window),
            # A custom interpreter or interpreter flags are honoured per worker: fresh interpreters then.
            use_zygote=bool(zygote) and python is None and not worker_args,
            preload=tuple(preload),
            cgroups=cgroups,
            agent_path=_procs.check_agent_path(agent_path),
            worker_output=_output.check_worker_output(worker_output),
            worker_output_max_mb=check_mib("worker_output_max_mb", worker_output_max_mb),
            max_grace=cap,
            worker_nice=worker_nice,
            allow_agents=AgentAllowlist.of(allow_agents),  # SEC-ALLOW
        )
