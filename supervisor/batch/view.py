"""What the batch command shows: a live rich progress bar on a terminal, plain periodic lines
otherwise (logs, CI, pipes), and the summary table at the end."""

from __future__ import annotations

import time
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from .runner import BatchProgress, BatchSummary

COLOURS = {
    "completed": "green",
    "failed": "red",
    "aborted": "yellow",
    "killed": "magenta",
    "crashed": "bright_red",
    "interrupted": "cyan",
    "invalid": "red",
}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def counts_text(p: BatchProgress, *, markup: bool) -> str:
    parts = []
    items = list(p.counts.items()) + ([("interrupted", p.interrupted)] if p.interrupted else [])
    for outcome, n in items:
        if not n:
            continue
        parts.append(f"[{COLOURS.get(outcome, 'white')}]{outcome} {n}[/]" if markup else f"{outcome} {n}")
    if p.retries:
        parts.append(f"retries {p.retries}")
    return " · ".join(parts) if parts else "—"


def plain_line(p: BatchProgress) -> str:
    pct = f" ({100 * p.done / p.total:.0f}%)" if p.total else ""
    stop = f" · stopping ({p.stopping})" if p.stopping else ""
    return (
        f"batch: {p.done}/{p.total} done{pct} · {counts_text(p, markup=False)} · running {p.running} · "
        f"{p.rate:.1f} jobs/s · ETA {_duration(p.eta) if p.done < p.total else '0s'}{stop}"
    )


class PlainProgress:
    """Prints a progress line at most every ``interval`` seconds, and the last one at the end."""

    def __init__(self, stream: IO[str], interval: float) -> None:
        self.stream = stream
        self.interval = interval
        self.latest: BatchProgress | None = None
        self._printed_at = 0.0
        self._printed: BatchProgress | None = None

    def update(self, p: BatchProgress) -> None:
        self.latest = p
        now = time.monotonic()
        if now - self._printed_at >= self.interval:
            self._print(now)

    def tick(self, p: BatchProgress) -> None:
        """Called periodically with a fresh snapshot: prints when nothing ended for a whole
        interval, so a log shows the batch is alive (and how many jobs are running)."""
        now = time.monotonic()
        if now - self._printed_at >= self.interval:
            self.latest = p
            self._print(now)

    def _print(self, now: float) -> None:
        assert self.latest is not None
        self._printed_at = now
        self._printed = self.latest
        print(plain_line(self.latest), file=self.stream, flush=True)

    def close(self) -> None:
        if self.latest is not None and self.latest is not self._printed:
            self._print(time.monotonic())


class RichProgress:
    """A live bar on a terminal: done/total, counts per outcome, rate and ETA."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]batch[/]"),
            MofNCompleteColumn(),
            BarColumn(bar_width=20),
            TextColumn("{task.fields[counts]}"),
            TextColumn("{task.fields[rate]}"),
            TextColumn("ETA {task.fields[eta]}"),
            console=console,
            refresh_per_second=8,
        )
        self.task: TaskID | None = None

    def start(self) -> None:
        self.progress.start()

    def update(self, p: BatchProgress) -> None:
        fields: dict[str, Any] = {
            "counts": counts_text(p, markup=True),
            "rate": f"{p.rate:.1f} jobs/s",
            "eta": _duration(p.eta) if p.done < p.total else "0s",
        }
        if self.task is None:
            self.task = self.progress.add_task("batch", total=p.total, completed=p.done, **fields)
        else:
            self.progress.update(self.task, total=p.total, completed=p.done, **fields)

    def tick(self, p: BatchProgress) -> None:
        self.update(p)  # keeps rate, ETA and running fresh while no job ends

    def close(self) -> None:
        self.progress.stop()


def summary_table(s: BatchSummary) -> Table:
    """Jobs per outcome and cause (this run), then the skipped and invalid ones."""
    table = Table(title="jobs per outcome and cause")
    table.add_column("outcome")
    table.add_column("cause")
    table.add_column("jobs", justify="right")
    for (outcome, cause), n in sorted(s.by_cause.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        table.add_row(Text(outcome, style=COLOURS.get(outcome, "")), cause or "", str(n))
    if s.interrupted:
        table.add_row(Text("interrupted", style=COLOURS["interrupted"]), "user", str(s.interrupted))
    if s.not_run:
        table.add_row("not run", "", str(s.not_run))
    if s.skipped:
        earlier = ", ".join(f"{k} {v}" for k, v in sorted(s.earlier.items()))
        table.add_row("done earlier", earlier, str(s.skipped))
    if s.invalid:
        table.add_row(Text("invalid", style=COLOURS["invalid"]), "", str(s.invalid))
    return table


def slowest_table(s: BatchSummary) -> Table:
    """The jobs whose turns ran longest ("ran": the last attempt's run time; "total": from the
    first submission to the line, queueing and earlier attempts included)."""
    table = Table(title="slowest jobs")
    for col in ("id", "outcome", "attempts", "ran s", "total s"):
        table.add_column(col, justify="left" if col in ("id", "outcome") else "right", overflow="fold")
    for rec in s.slowest:
        ran = rec.get("run_s")
        table.add_row(
            str(rec["id"]),
            Text(rec["outcome"], style=COLOURS.get(rec["outcome"], "")),
            str(rec["attempts"]),
            "" if ran is None else f"{ran:.3f}",
            f"{rec['duration_s']:.3f}",
        )
    return table


def summary_json(s: BatchSummary) -> dict[str, Any]:
    """The summary as ``batch --json`` prints it: one JSON object (epoch-free: durations only)."""
    return {
        "batch": s.batch,
        "output": s.output,
        "jobs": s.jobs,
        "ran": s.ran,
        "skipped": s.skipped,
        "earlier": s.earlier,
        "counts": s.counts,
        "by_cause": [
            {"outcome": outcome, "cause": {"kind": kind} if kind else None, "jobs": n}
            for (outcome, kind), n in sorted(s.by_cause.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
        ],
        "interrupted": s.interrupted,
        "not_run": s.not_run,
        "invalid": s.invalid,
        "retries": s.retries,
        "elapsed_s": round(s.elapsed, 6),
        "jobs_per_s": round(s.ran / s.elapsed, 3) if s.elapsed > 0 and s.ran else None,
        "slowest": s.slowest,
        "stopped": s.stopped,
        "exit_code": s.exit_code,
    }


def print_summary(console: Console, s: BatchSummary) -> None:
    rate = f" ({s.ran / s.elapsed:.1f} jobs/s)" if s.elapsed > 0 and s.ran else ""
    console.print(f"[bold]batch {s.batch}[/]: {s.ran} of {s.jobs} job(s) ran in {s.elapsed:.1f}s{rate}")
    console.print(summary_table(s))
    if s.slowest:
        console.print(slowest_table(s))
    extra = []
    if s.retries:
        extra.append(f"{s.retries} retr{'y' if s.retries == 1 else 'ies'}")
    if s.stopped:
        extra.append(f"stopped: {s.stopped}")
    console.print(f"results in {s.output}" + (f" · {' · '.join(extra)}" if extra else ""))
