"""A worker forked from the zygote keeps sharing the zygote's memory (WORKER-SHARED-HEAP).

Attack: a turn runs a full garbage collection on a worker, as a long-lived worker's collector does by
itself sooner or later. Before, the collection walked every object the worker inherited and wrote
each one's header: the worker's private memory grew by ≈ 6 MiB (the zygote's whole heap copied),
and a pool of idle workers grew by that much per worker over time.
"""

from __future__ import annotations

import anyio
import pytest

from supervisor import Supervisor

pytestmark = pytest.mark.anyio


async def test_a_full_collection_in_a_worker_does_not_copy_the_zygotes_heap() -> None:
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(60):
            result = await sup.run("tests.agents.memory:full_collection")
    assert result.outcome == "completed", result
    grew = result.output["after_kib"] - result.output["before_kib"]
    # What the collection itself writes (its own frames, the young objects' headers) is a few hundred
    # KiB at most; the inherited heap is ≈ 6 MiB.
    assert grew < 1024, result.output


# What a fork of a zygote-like process (the worker stack preloaded, the heap frozen) writes while it
# runs the worker's own paths once: an event loop, timers and the warm-up turn.
_FORK_WRITES = """
import gc, os
import anyio
from worker import lowlevel
lowlevel.zygote_preload([])
gc.freeze()

def private_dirty_kib():
    with open("/proc/self/smaps_rollup", "rb") as f:
        data = f.read()
    at = data.find(b"Private_Dirty:")
    return int(data[at + 14 : data.find(b"kB", at)])

r, w = os.pipe()
pid = os.fork()
if pid == 0:
    before = private_dirty_kib()
    anyio.run(lowlevel.zygote_worker_paths, backend="asyncio")
    os.write(w, str(private_dirty_kib() - before).encode())
    os._exit(0)
os.close(w)
print(os.read(r, 64).decode())
os.waitpid(pid, 0)
"""


def test_a_worker_forked_from_the_zygote_writes_little_of_it_running_its_own_paths() -> None:
    """WORKER-SETTLE: the zygote ran the worker's paths before forking, so their code is specialised
    there once. Without it a fork running them wrote ≈ 2.74 MiB (2.16 MiB with it, measured)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _FORK_WRITES], capture_output=True, text=True, timeout=120, check=True
    )
    written_kib = int(out.stdout.strip())
    assert written_kib < 2450, written_kib
