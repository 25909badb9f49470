"""Run every ``bench_*.py`` module and rewrite ``benchmarks/RESULTS.md`` (a full run; ``--quick`` and
``--only`` write ``benchmarks/RESULTS-partial.md`` so the committed full results are never clobbered)."""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).parent
# The scenarios first, in its order; any other bench module after them, by name.
ORDER = ("throughput", "latency", "cancel", "kill", "death", "scale")


def _glance(sections: list[str]) -> str:
    """Every section's "Target(s): ..." line under its title: the verdicts in one place."""
    lines = []
    for text in sections:
        title = "?"
        for ln in text.splitlines():
            if ln.startswith("## "):
                title = ln[3:]
            elif ln.startswith(("Targets:", "Target:")):
                lines.append(f"- **{title}** — {ln.split(':', 1)[1].strip()}")
    if not lines:
        return ""
    return "## Targets at a glance\n\n" + "\n".join(lines) + "\n\n"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="reduced sizes, well under a minute")
    parser.add_argument("--only", nargs="*", default=None, help="run only these bench names")
    args = parser.parse_args()
    found = sorted(p.stem[len("bench_") :] for p in HERE.glob("bench_*.py"))
    names = [n for n in ORDER if n in found] + [n for n in found if n not in ORDER]
    if args.only:
        names = [n for n in names if n in args.only]
    sections = []
    for name in names:
        module = importlib.import_module(f"benchmarks.bench_{name}")
        t0 = time.monotonic()
        print(f"== {name} ...", file=sys.stderr, flush=True)
        try:
            sections.append(module.run(args.quick))
        except Exception as exc:  # noqa: BLE001 - one broken bench must not lose the whole run's results
            traceback.print_exc()
            sections.append(f"## {name}\n\nThis bench failed in this run: `{type(exc).__name__}: {exc}`.\n")
        print(f"== {name} done in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
    header = (
        "# Benchmark results\n\n"
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}.\n"
        f"Command: `make bench` (or `.venv/bin/python -m benchmarks{' --quick' if args.quick else ''}`)"
        f"{' — quick mode' if args.quick else ''}; run at "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n"
        f"Load average when it ended: {' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min) — the "
        "machine is shared, so compare rows of one run (ratios), not runs.\n\n"
    )
    header += _glance(sections)
    # Only a full run rewrites the committed RESULTS.md; --quick and --only write beside it.
    out = HERE / ("RESULTS.md" if not (args.quick or args.only) else "RESULTS-partial.md")
    tuning = HERE / "TUNING.md"
    tail = "\n\n" + tuning.read_text().strip() + "\n" if tuning.exists() and not args.only else "\n"
    out.write_text(header + "\n\n".join(sections) + tail)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
