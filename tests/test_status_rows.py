"""MEM-STATUS-ROWS: ``status()`` builds a worker's entry again only when what it shows changed, and a status
taken right after a change shows it (the entries are compared with the slots on every call)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from supervisor import Supervisor
from supervisor.lowlevel import treemem, turninfo

pytestmark = pytest.mark.anyio


class _Slot:
    def __init__(self, n: int) -> None:
        self.id = f"w{n}"
        self.pid = 1000 + n
        self.state = "idle"
        self.turn: Any = None
        self.turns_run = 0
        self.cgroup: str | None = None


class _Turn:
    def __init__(self, turn_id: str) -> None:
        self.id = turn_id


def test_only_the_entries_of_changed_workers_are_built_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails before: every call built every worker's entry (3.3 ms of CPU per call at 1,000 workers)."""
    built: list[str] = []
    entry = turninfo._entry

    def counting(slot: Any, key: tuple[Any, ...]) -> dict[str, Any]:
        built.append(slot.id)
        return entry(slot, key)

    monkeypatch.setattr(turninfo, "_entry", counting)
    slots = [_Slot(n) for n in range(4)]
    memory = {s.pid: (2**20, 2**19) for s in slots}
    rows = turninfo.WorkerRows()
    first = rows.workers(slots, memory)
    assert built == ["w0", "w1", "w2", "w3"] and first[1]["rss_mb"] == 1.0
    built.clear()
    assert rows.workers(slots, memory) == first and built == []
    slots[2].state, slots[2].turn = "busy", _Turn("t-1")
    memory = {**memory, slots[3].pid: (3 * 2**20, 2**20)}  # a new sample, for one worker
    again = rows.workers(slots, memory)
    assert built == ["w2", "w3"]
    assert again[2]["state"] == "busy" and again[2]["turn_id"] == "t-1" and again[3]["rss_mb"] == 3.0
    again[0]["state"] = "changed by the caller"  # each caller gets copies
    assert rows.workers(slots[:3], memory)[0]["state"] == "idle"
    assert rows.workers(slots, memory)[3]["rss_mb"] == 3.0 and built[-1] == "w3"  # w3 was dropped, then back


async def test_a_status_right_after_a_change_shows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(treemem, "SYNC_WORKERS", 1)  # the large pool's path (the memory sampled)
    with anyio.fail_after(60):
        async with Supervisor(workers=2, spares=0) as sup:
            before = (await sup.status())["workers"]
            assert sorted(w["state"] for w in before) == ["idle", "idle"]
            handle = await sup.submit("tests.agents.http:emit_then_wait", {"count": 1})
            async for _ in handle.events():
                break  # it runs
            running = [w for w in (await sup.status())["workers"] if w["turn_id"] == handle.turn_id]
            assert len(running) == 1 and running[0]["state"] == "busy" and running[0]["turns_run"] == 0
            await handle.cancel()
            await handle.result()
            after = {w["id"]: w for w in (await sup.status())["workers"]}[running[0]["id"]]
            assert after["turn_id"] is None and after["turns_run"] == 1 and after["state"] != "busy"
