"""Run by bench_death: a supervisor whose workers each run ``examples.agents:forker`` (grandchildren
and a double-forked setsid daemon). Prints every pid of the tree as one JSON line, then waits
to be killed."""

from __future__ import annotations

import json
import os
import sys
from contextlib import aclosing

import anyio

from supervisor import Supervisor


async def main(workers: int) -> None:
    async with Supervisor(workers=workers, spares=1, grace=30) as sup:
        handles = [
            await sup.submit("examples.agents:forker", {"children": 2, "cooperative": True})
            for _ in range(workers)
        ]
        pids: list[int] = []
        for h in handles:
            async with aclosing(h.events()) as events:
                async for ev in events:
                    pids += [*ev["children"], ev["daemon"], ev["worker"]]
                    break
        pids += [w["pid"] for w in (await sup.status())["workers"] if w["pid"]]
        if sup.pool.zygote is not None:
            pids.append(sup.pool.zygote.pid)
        print(json.dumps({"supervisor": os.getpid(), "pids": sorted(set(pids))}), flush=True)
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]))
