"""A handle keeps its turn's result (issue 15, item 11a; design rule API-HANDLE-KEEPS).

``keep_results`` bounds only what is kept for lookups by id: a turn's result stays available
while any handle to it exists, as a ``concurrent.futures.Future`` keeps its value. Tested with a
small ``keep_results`` and many more handles than that, embedded and blocking.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import anyio
import pytest

from supervisor import Supervisor, UnknownTurn
from tests.support.daemonkit import ROOT

pytestmark = pytest.mark.anyio


async def test_results_outlive_keep_results_while_handles_exist() -> None:
    """40 submits with ``keep_results=3``, then 40 ``result()`` calls: every one answers (the first
    ones were ended and beyond the bound long before). Once the handles are gone, an old id is
    forgotten: ``handle(id)`` raises ``UnknownTurn``, so the bound still holds."""
    async with Supervisor(workers=2, spares=0, keep_results=3) as sup:
        handles = [await sup.submit("examples.agents:echo", {"i": i}) for i in range(40)]
        with anyio.fail_after(60):
            await sup.when_idle()
            results = [await h.result() for h in handles]
        assert [r.output for r in results] == [{"i": i} for i in range(40)]
        again = sup.handle(handles[0].turn_id)  # while a handle exists, the id still answers
        assert (await again.result()).output == {"i": 0}
        first_id = handles[0].turn_id
        del handles, again, results
        gc.collect()
        with pytest.raises(UnknownTurn):
            sup.handle(first_id)


def test_blocking_handles_keep_their_results_too() -> None:
    """The ordinary script: ``SyncSupervisor`` submits many more turns than ``keep_results``, then
    asks each handle for its result."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        from supervisor import SyncSupervisor
        with SyncSupervisor(workers=2, spares=0, keep_results=5, agent_path=[{ROOT!r}]) as sup:
            handles = [sup.submit("examples.agents:echo", i) for i in range(60)]
            print(sum(h.result().output for h in handles))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(sum(range(60)))


async def test_client_results_past_keep_results_come_from_the_journal() -> None:
    """Through a daemon (journalled, the default), results evicted beyond ``--keep-results`` are
    answered from the journal: 30 submits with ``--keep-results 3``, then 30 ``result()`` calls."""
    from supervisor import Client
    from tests.support.daemonkit import FAST, serving

    with serving(*FAST, "--keep-results", "3") as d:
        async with Client.connect(d.endpoint) as client:
            handles = [await client.submit("examples.agents:echo", {"i": i}) for i in range(30)]
            with anyio.fail_after(60):
                await client.when_idle()
                results = [await h.result() for h in handles]
    assert [r.output for r in results] == [{"i": i} for i in range(30)]
