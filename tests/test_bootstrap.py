"""A supervisor started inside a worker is refused (issue 15, item 5; design rule API-NO-NESTING).

The user's script defines an agent and starts a ``SyncSupervisor`` at import time, with no
``if __name__ == "__main__":`` guard, and names the agent by its module: every worker that imports
the module would start a pool of its own, recursively. The worker refuses at once, as
``multiprocessing`` does in its bootstrapping phase: the turn ends ``failed`` with a message that
names the fix, the script exits within the bound, and only its own pool's processes ever existed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from supervisor import Supervisor

SCRIPT = """
import psutil
from supervisor import SyncSupervisor


async def agent(turn):
    return "ran"


def count_descendants():
    return len(psutil.Process().children(recursive=True))


sup = SyncSupervisor(workers=1, spares=0, grace=0.5, kill_after=0.5)
result = sup.run("tpboot_script:agent")
peak = count_descendants()
print("RESULT", result.outcome, result.error.type if result.error else "-", flush=True)
print("MESSAGE", result.error.message if result.error else "-", flush=True)
print("PROCS", peak, flush=True)
sup.close()
"""


def test_a_supervisor_started_at_import_in_a_worker_is_refused(tmp_path: Path) -> None:
    """No process explosion: the script ends within the bound, its turn ``failed`` with a
    ``RuntimeError`` saying to guard the start with ``if __name__ == "__main__":``, and it never
    had more than its own few processes (worker, guardian, zygote)."""
    script = tmp_path / "tpboot_script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    try:
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the script did not end within 60 s (recursive supervisors?): {exc.stdout!r}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["RESULT"] == "failed RuntimeError", proc.stdout
    assert 'if __name__ == "__main__":' in lines["MESSAGE"] and "inside a turnpool worker" in lines["MESSAGE"]
    assert int(lines["PROCS"]) <= 6, proc.stdout


@pytest.mark.anyio
async def test_an_agent_that_starts_a_supervisor_while_running_is_refused() -> None:
    """The check holds at run time too (an agent that builds an async ``Supervisor`` in its
    body): the turn fails with the same message, the worker serves the next turn."""
    async with Supervisor(workers=1, spares=0) as sup:
        with anyio.fail_after(60):
            result = await sup.run("tests.agents.api:starts_a_supervisor")
            again = await sup.run("examples.agents:echo", {"ok": 1})
    assert result.outcome == "failed" and result.error is not None, result
    assert result.error.type == "RuntimeError" and "inside a turnpool worker" in result.error.message
    assert again.outcome == "completed"
