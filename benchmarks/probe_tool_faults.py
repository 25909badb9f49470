"""Page faults of an isolated no-op call (load-independent): in the caller, in the template, and in
the call's process (an embryo) from the moment it waits for its call to its end, split at the start of
the function. Also the call's p50 in this run (not a benchmark: see ``bench_tools``).

Run: ``.venv/bin/python -m benchmarks.probe_tool_faults [n]``
(or ``.venv/bin/python benchmarks/probe_tool_faults.py [n]``).
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time


def _minflt(pid: int | str = "self") -> tuple[int, int]:
    """(minflt, cminflt) of ``pid``."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[7]), int(fields[8])


def faults_at_start() -> list[int]:
    """The call's pid and its page faults so far (read first thing in the function)."""
    return [os.getpid(), _minflt()[0]]


def _waiting_in(path: str) -> int | None:
    with open(os.path.join(path, "cgroup.procs")) as f:
        pids = [int(x) for x in f.read().split()]
    return pids[0] if len(pids) == 1 else None


def main(n: int) -> None:
    import worker
    from worker import lowlevel

    lowlevel.tool_templates(True)
    from benchmarks import probe_tool_faults as here

    iso = worker.isolated(here.faults_at_start)
    for _ in range(5):
        iso()
    tpl = lowlevel.tool_template_pid("fn")
    assert tpl is not None
    names = ("caller", "template", "embryo before fn", "embryo total", "ms")
    rows: dict[str, list[float]] = {k: [] for k in names}
    for _ in range(n):
        time.sleep(0.03)  # let the embryos settle (forked, pre-faulted, waiting)
        contain = lowlevel.tool_next_call_groups(iso.limits, "fn")
        embryo = _waiting_in(contain) if contain else None
        e0 = _minflt(embryo)[0] if embryo else None
        t0 = _minflt(tpl)
        c0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        s = time.perf_counter()
        pid, at_start = iso()
        rows["ms"].append((time.perf_counter() - s) * 1e3)
        c1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        time.sleep(0.03)  # reaped by the template
        t1 = _minflt(tpl)
        rows["caller"].append(c1 - c0)
        rows["template"].append(t1[0] - t0[0])
        if e0 is not None and pid == embryo:
            rows["embryo before fn"].append(at_start - e0)
            rows["embryo total"].append(t1[1] - t0[1] - e0)  # (reaped: its whole life, less its wait)
    for k, v in rows.items():
        print(f"{k:>18}: median {statistics.median(v):8.1f}  (n={len(v)})" if v else f"{k}: none")
    lowlevel.tool_templates(None)


if __name__ == "__main__":
    # (run as a file, ``python benchmarks/probe_tool_faults.py``: the package is found from the checkout)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
