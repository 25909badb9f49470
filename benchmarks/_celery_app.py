"""The Celery app the benchmark starts a worker for (broker and backend: a loopback redis-server
whose port the bench passes in ``TP_BENCH_REDIS_PORT``)."""

from __future__ import annotations

import os

from celery import Celery

from benchmarks import _tasks

_port = os.environ.get("TP_BENCH_REDIS_PORT", "6379")
app = Celery("tp_bench", broker=f"redis://127.0.0.1:{_port}/0", backend=f"redis://127.0.0.1:{_port}/1")
app.conf.update(
    task_acks_late=False,
    worker_prefetch_multiplier=4,
    result_expires=600,
    broker_connection_retry_on_startup=True,
    task_track_started=False,
)


@app.task(name="tp.noop")
def noop() -> None:
    return _tasks.noop()


@app.task(name="tp.stamp")
def stamp() -> float:
    return _tasks.stamp()


@app.task(name="tp.spin")
def spin(seconds: float = 3600.0) -> None:
    return _tasks.spin(seconds)


@app.task(name="tp.spin_report")
def spin_report(path: str, seconds: float = 3600.0) -> None:
    return _tasks.spin_report(path, seconds)
