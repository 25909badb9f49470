"""The peers' side of each scenario, one function per (peer, scenario). Each returns raw samples
(seconds) or rates; ``Skip`` when the peer cannot run here."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import _tasks
from ._common import Skip, celery_worker, have, ray_runtime


@contextlib.contextmanager
def futures_pool(peer: str, workers: int) -> Iterator[Callable[..., Any]]:
    """A futures-style pool of ``workers`` processes, warmed up; yields ``submit(fn, *args)``."""
    if peer == "ProcessPoolExecutor":
        ex: Any = cf.ProcessPoolExecutor(workers)
        submit = ex.submit
        close = lambda: ex.shutdown(wait=True, cancel_futures=True)  # noqa: E731
    elif peer == "pebble":
        if not have("pebble"):
            raise Skip("pebble is not installed (pip install -e '.[bench]')")
        import pebble

        ex = pebble.ProcessPool(max_workers=workers)
        submit = ex.schedule

        def close() -> None:
            ex.stop()
            ex.join()
    elif peer == "loky":
        if not have("loky"):
            raise Skip("loky is not installed (pip install -e '.[bench]')")
        import loky

        ex = loky.ProcessPoolExecutor(max_workers=workers)
        submit = ex.submit
        close = lambda: ex.shutdown(wait=True)  # noqa: E731
    else:
        raise ValueError(peer)
    try:
        cf.wait([submit(_tasks.noop) for _ in range(workers * 4)])
        yield submit
    finally:
        close()


FUTURE_PEERS = ("ProcessPoolExecutor", "pebble", "loky")


def futures_throughput(peer: str, n: int, reps: int, workers: int = 2) -> list[float]:
    out = []
    with futures_pool(peer, workers) as submit:
        for _ in range(reps):
            t0 = time.perf_counter()
            futs = [submit(_tasks.noop) for _ in range(n)]
            for f in futs:
                f.result()
            out.append(n / (time.perf_counter() - t0))
    return out


def futures_latency(peer: str, n: int) -> list[float]:
    out = []
    with futures_pool(peer, 2) as submit:
        for _ in range(n):
            t0 = time.perf_counter()
            submit(_tasks.noop).result()
            out.append(time.perf_counter() - t0)
    return out


def celery_throughput(n: int, reps: int) -> list[float]:
    out = []
    with celery_worker(2) as app:
        for _ in range(reps):
            t0 = time.perf_counter()
            results = [app.noop.delay() for _ in range(n)]
            for r in results:
                r.get(timeout=120)
            out.append(n / (time.perf_counter() - t0))
    return out


def celery_latency(n: int) -> list[float]:
    out = []
    with celery_worker(2) as app:
        for _ in range(n):
            t0 = time.perf_counter()
            app.noop.delay().get(timeout=30)
            out.append(time.perf_counter() - t0)
    return out


def ray_throughput(n: int, reps: int) -> list[float]:
    out = []
    with ray_runtime(2) as ray:
        noop = ray.remote(_tasks.noop)
        ray.get([noop.remote() for _ in range(50)])
        for _ in range(reps):
            t0 = time.perf_counter()
            ray.get([noop.remote() for _ in range(n)])
            out.append(n / (time.perf_counter() - t0))
    return out


def ray_latency(n: int) -> list[float]:
    out = []
    with ray_runtime(2) as ray:
        noop = ray.remote(_tasks.noop)
        ray.get([noop.remote() for _ in range(20)])
        for _ in range(n):
            t0 = time.perf_counter()
            ray.get(noop.remote())
            out.append(time.perf_counter() - t0)
    return out


# ---- stopping a running task -------------------------------------------------------------


def _wait_file(path: str, timeout: float = 60.0) -> tuple[int, float]:
    import os

    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the task never started ({path})")
        time.sleep(0.0005)
    with open(path) as f:
        pid, t = f.read().split()
    return int(pid), float(t)


def _wait_gone(pid: int, timeout: float = 30.0) -> float:
    """Poll (0.5 ms) until ``pid`` has exited (gone or a zombie); returns the time seen."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return time.monotonic()
        except psutil.NoSuchProcess:
            return time.monotonic()
        time.sleep(0.0005)
    raise TimeoutError(f"pid {pid} still alive")


def pebble_kill(n: int, grace: float) -> tuple[list[float], list[float]]:
    """pebble: ``schedule(timeout=grace)`` on a task that spins; overshoot = worker gone − (start + grace).
    Also ``future.cancel()`` of a running task: cancel → worker gone."""
    import os
    import tempfile

    import pebble

    timeouts, cancels = [], []
    with tempfile.TemporaryDirectory() as d:
        pool = pebble.ProcessPool(max_workers=1)
        try:
            for i in range(n):
                path = os.path.join(d, f"t{i}")
                fut = pool.schedule(_tasks.spin_report, args=(path,), timeout=grace)
                pid, start = _wait_file(path)
                gone = _wait_gone(pid)
                with contextlib.suppress(Exception):
                    fut.result(timeout=30)
                timeouts.append(gone - start - grace)
            for i in range(n):
                path = os.path.join(d, f"c{i}")
                fut = pool.schedule(_tasks.spin_report, args=(path,))
                pid, _ = _wait_file(path)
                t0 = time.monotonic()
                fut.cancel()
                cancels.append(_wait_gone(pid) - t0)
        finally:
            pool.stop()
            pool.join()
    return timeouts, cancels


def pebble_recovery(n: int) -> tuple[list[float], list[float]]:
    """pebble, 1 worker: cancel a spinning task; (worker gone → next running, cancel → next running)."""
    import os
    import tempfile

    import pebble

    from_kill, from_cancel = [], []
    with tempfile.TemporaryDirectory() as d:
        pool = pebble.ProcessPool(max_workers=1)
        try:
            for i in range(n):
                path = os.path.join(d, f"r{i}")
                fut = pool.schedule(_tasks.spin_report, args=(path,))
                nxt = pool.schedule(_tasks.stamp)
                pid, _ = _wait_file(path)
                t0 = time.monotonic()
                fut.cancel()
                gone = _wait_gone(pid)
                started = nxt.result(timeout=60)
                from_kill.append(started - gone)
                from_cancel.append(started - t0)
        finally:
            pool.stop()
            pool.join()
    return from_kill, from_cancel


def ray_cancel(n: int, force: bool) -> list[float]:
    """Ray: ``ray.cancel(ref, force=...)`` of a running task → ``ray.get`` raises."""
    import os
    import tempfile

    out = []
    with ray_runtime(2) as ray, tempfile.TemporaryDirectory() as d:
        fn = ray.remote(max_retries=0)(_tasks.spin_report if force else _sleepy_report)
        for i in range(n):
            path = os.path.join(d, f"x{i}")
            ref = fn.remote(path)
            _wait_file(path)
            t0 = time.monotonic()
            ray.cancel(ref, force=force)
            with contextlib.suppress(Exception):
                ray.get(ref, timeout=60)
            out.append(time.monotonic() - t0)
    return out


def _sleepy_report(path: str) -> None:
    import os

    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {time.monotonic()}")
    os.replace(path + ".tmp", path)
    _tasks.sleepy()


def ray_recovery(n: int) -> tuple[list[float], list[float]]:
    """Ray (2 CPUs): a spinning task holding both CPUs is force-cancelled; (worker gone → next task
    running, cancel → next task running)."""
    import os
    import tempfile

    from_kill, from_cancel = [], []
    with ray_runtime(2) as ray, tempfile.TemporaryDirectory() as d:
        spin = ray.remote(num_cpus=2, max_retries=0)(_tasks.spin_report)
        stamp = ray.remote(num_cpus=2)(_tasks.stamp)
        ray.get(stamp.remote())
        for i in range(n):
            path = os.path.join(d, f"r{i}")
            ref = spin.remote(path)
            nxt = stamp.remote()
            pid, _ = _wait_file(path)
            t0 = time.monotonic()
            ray.cancel(ref, force=True)
            gone = _wait_gone(pid)
            started = ray.get(nxt, timeout=120)
            from_kill.append(started - gone)
            from_cancel.append(started - t0)
            with contextlib.suppress(Exception):
                ray.get(ref, timeout=60)
    return from_kill, from_cancel


def celery_kill_and_recovery(n: int, grace: float) -> tuple[list[float], tuple[list[float], list[float]]]:
    """Celery prefork, 1 process: hard ``time_limit=grace`` on a spinning task (overshoot = worker
    gone − (start + grace)); then ``revoke(terminate=True, signal=SIGKILL)`` and the time until the
    next queued task runs."""
    import os
    import tempfile

    overs: list[float] = []
    from_kill: list[float] = []
    from_cancel: list[float] = []
    with celery_worker(1) as app, tempfile.TemporaryDirectory() as d:
        for i in range(n):
            path = os.path.join(d, f"k{i}")
            res = app.spin_report.apply_async(args=(path,), time_limit=grace)
            pid, start = _wait_file(path)
            gone = _wait_gone(pid)
            with contextlib.suppress(Exception):
                res.get(timeout=60, propagate=False)
            overs.append(gone - start - grace)
        for i in range(max(2, n // 3)):
            path = os.path.join(d, f"r{i}")
            res = app.spin_report.apply_async(args=(path,))
            pid, _ = _wait_file(path)
            nxt = app.stamp.delay()
            t0 = time.monotonic()
            app.app.control.revoke(res.id, terminate=True, signal="SIGKILL")
            gone = _wait_gone(pid)
            started = nxt.get(timeout=120)
            from_kill.append(started - gone)
            from_cancel.append(started - t0)
    return overs, (from_kill, from_cancel)
