"""Side-by-side benchmarks: turnpool and its peers in the same run.

Convention: each ``benchmarks/bench_<name>.py`` exposes ``run(quick: bool) -> str`` returning
a Markdown section (a table with medians, p99 and ratios, and the command that reruns it).
``python -m benchmarks [--quick] [--only NAME ...]`` runs them and rewrites ``RESULTS.md``.
"""
