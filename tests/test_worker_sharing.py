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
