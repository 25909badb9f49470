"""``turnpool serve`` SIGTERM → exited with 128 and 512 idle workers, beside ``aclose()`` of 512 idle
workers in the same run (``_close_cost``): the shutdown rows of "Hundreds of workers on one host" alone.

Run: ``.venv/bin/python -m benchmarks._serve_stop``
(one JSON line per figure, with the load average before and after).
"""

from __future__ import annotations

import json
import os
import sys

from . import _close_cost, _stream_rows


def main(sizes: list[int]) -> None:
    for n in sizes:
        load0 = os.getloadavg()
        row = _stream_rows.serve_sigterm(n)
        print(json.dumps({"row": "serve SIGTERM", **row, "load": [load0[0], os.getloadavg()[0]]}), flush=True)
    load0 = os.getloadavg()
    close = _close_cost.fresh(max(sizes))
    print(json.dumps({"row": "aclose()", **close, "load": [load0[0], os.getloadavg()[0]]}), flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [128, 512])
