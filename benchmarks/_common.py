"""Shared helpers: statistics, Markdown tables, peer availability, and the services some
peers need (a loopback redis-server for Celery). Everything a helper starts it also stops,
by pid."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``."""
    data = sorted(values)
    if not data:
        return math.nan
    k = max(0, min(len(data) - 1, math.ceil(q / 100 * len(data)) - 1))
    return data[k]


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def ms(seconds: float) -> str:
    if seconds != seconds:
        return "—"
    if seconds < 0:
        return "−" + ms(-seconds)
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms" if seconds < 0.01 else f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def rate(x: float) -> str:
    return "—" if x != x else f"{x:,.0f}/s"


def ratio(x: float) -> str:
    if x != x or x == float("inf"):
        return "—"
    return f"{x:.1f}×" if x < 100 else f"{x:,.0f}×"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines.extend("| " + " | ".join(str(c) for c in row) + " |" for row in rows)
    return "\n".join(lines)


def command(name: str, quick: bool) -> str:
    return f"`.venv/bin/python -m benchmarks{' --quick' if quick else ''} --only {name}`"


def log(msg: str) -> None:
    print(f"   {msg}", file=sys.stderr, flush=True)


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# ---- peers ------------------------------------------------------------------------------


class Skip(Exception):
    """A peer that cannot run here; the message is printed and written to RESULTS.md."""


def heavy_peers_reason(quick: bool) -> str | None:
    if quick:
        return "quick mode: Celery and Ray take seconds to start; they run in `make bench`"
    return None


@contextlib.contextmanager
def redis_server() -> Iterator[int]:
    """A throwaway redis-server on 127.0.0.1 (no persistence), stopped by pid afterwards."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise Skip("redis-server is not installed (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="tp-bench-redis-")
    proc = subprocess.Popen(
        [
            exe,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
            "--protected-mode",
            "yes",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise Skip("redis-server did not start") from None
                time.sleep(0.02)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def celery_worker(concurrency: int) -> Iterator[Any]:
    """redis-server + a Celery prefork worker (``concurrency`` processes); yields the tasks module."""
    if not have("celery") or not have("redis"):
        raise Skip("celery[redis] is not installed (pip install -e '.[bench]')")
    with redis_server() as port:
        env = dict(os.environ, TP_BENCH_REDIS_PORT=str(port), PYTHONPATH=str(ROOT))
        os.environ["TP_BENCH_REDIS_PORT"] = str(port)
        import importlib

        from benchmarks import _celery_app

        importlib.reload(_celery_app)
        proc = subprocess.Popen(
            [
                PY,
                "-m",
                "celery",
                "-A",
                "benchmarks._celery_app",
                "worker",
                "-P",
                "prefork",
                "-c",
                str(concurrency),
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "ERROR",
                "--prefetch-multiplier",
                "4",
            ],
            cwd=str(ROOT),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            ok = False
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise Skip(f"the celery worker exited with {proc.returncode}")
                try:
                    _celery_app.noop.delay().get(timeout=1)
                    ok = True
                    break
                except Exception:  # noqa: BLE001 - not up yet
                    continue
            if not ok:
                raise Skip("the celery worker did not answer within 60 s")
            yield _celery_app
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            with contextlib.suppress(Exception):
                _celery_app.app.close()


@contextlib.contextmanager
def ray_runtime(num_cpus: int = 2) -> Iterator[Any]:
    if not have("ray"):
        raise Skip("ray is not installed (pip install -e '.[bench]')")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray

    try:
        ray.init(
            # A fresh local instance, never a cluster another process on this machine started.
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
            configure_logging=True,
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        )
    except Exception as exc:  # noqa: BLE001 - a peer that cannot start is skipped, with the reason
        raise Skip(f"ray.init failed: {type(exc).__name__}: {exc}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def run_peer(name: str, fn: Callable[[], Any], skipped: dict[str, str]) -> Any:
    """Run one peer's measurement; a ``Skip`` (or a crash of the peer) is recorded with its reason."""
    t0 = time.monotonic()
    try:
        out = fn()
    except Skip as exc:
        skipped[name] = str(exc)
        log(f"{name}: skipped — {exc}")
        return None
    except Exception as exc:  # noqa: BLE001 - a peer failing is a result, not a crash of the suite
        skipped[name] = f"failed here: {type(exc).__name__}: {str(exc)[:160]}"
        log(f"{name}: failed — {type(exc).__name__}: {exc}")
        return None
    log(f"{name}: {time.monotonic() - t0:.1f}s")
    return out


def skipped_lines(skipped: dict[str, str]) -> str:
    if not skipped:
        return ""
    return "\n\nSkipped here: " + "; ".join(f"**{k}** — {v}" for k, v in skipped.items()) + "."


def fresh_json(module: str, *args: str, timeout: float | None = None) -> dict[str, Any]:
    """Run ``python -m benchmarks.<module> args...`` in a fresh interpreter and return the last JSON
    object it printed; ``RuntimeError`` with its last stderr line if it failed or printed none."""
    import json

    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["?"])[-1][:200])
    return dict(json.loads(lines[-1]))
