"""An agent name that points at something no worker can run is refused at submit with
``InvalidAgent`` naming the object's type (and the extra to install for a framework object the
installed framework cannot run), through every front end: ``Supervisor.submit``/``submit_many``,
``Client.submit``, HTTP (400 ``invalid_agent``), ``turnpool submit`` (exit 2, one line) and
``turnpool batch`` (a final ``failed`` line). The supervisor imports no agent code: a probe forked
by the zygote answers, once per name until ``reload``.

Real objects: an ``int`` and an instance that is not callable. Frameworks too old for the adapter
are stand-in packages on the workers' agent path (``claude_agent_sdk``, ``agents``, ``pydantic_ai``,
``langgraph``) that shadow the installed ones in those workers only: an older framework cannot be
installed beside the one the other tests use. A framework that cannot be imported at all makes
the agent's own module fail to import: that turn is accepted and fails with the import error, as
does an agent module slower to import than the probe's bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest

from supervisor import Client, InvalidAgent, Supervisor
from supervisor.lowlevel import probe
from tests.support.daemonkit import FAST, HTTP, ROOT, serving

pytestmark = pytest.mark.anyio

MODULE = """\
count = 5


class Thing:
    pass


thing = Thing()


async def fine(turn):
    return "fine"
"""


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _stand_ins(root: Path) -> None:
    """Frameworks the adapters cannot run: Claude options with no ``ClaudeSDKClient``, an
    ``agents.Agent`` with no ``Runner``, pydantic-ai / LangGraph lacking what the adapter imports."""
    _write(root, "claude_agent_sdk/__init__.py", "class ClaudeAgentOptions:\n    pass\n")
    _write(root, "agents/__init__.py", "class Agent:\n    pass\n")
    _write(root, "pydantic_ai/__init__.py", "from .agent import Agent\n")
    _write(
        root,
        "pydantic_ai/agent.py",
        "class AbstractAgent:\n    pass\n\nclass Agent(AbstractAgent):\n    pass\n",
    )
    _write(root, "langgraph/__init__.py", "")
    _write(root, "langgraph/graph.py", "class Pregel:\n    pass\n")
    _write(
        root,
        "fw_objects.py",
        "import agents\nimport claude_agent_sdk\nimport pydantic_ai\nfrom langgraph.graph import Pregel\n\n"
        "options = claude_agent_sdk.ClaudeAgentOptions()\nold = agents.Agent()\n"
        "old_pydantic = pydantic_ai.Agent()\nold_graph = Pregel()\n",
    )


async def refused(sup: Supervisor, agent: str) -> str:
    with anyio.fail_after(60), pytest.raises(InvalidAgent) as err:
        await sup.submit(agent, "hi")
    return str(err.value)


async def test_refused_at_submit_embedded(tmp_path: Path) -> None:
    """``Supervisor.submit`` raises ``InvalidAgent`` for an ``int``, a non-callable instance and
    framework objects the adapters cannot run, naming the type and the extra; ``submit_many`` raises
    it plain (nothing accepted); a refused name is known from then on; a callable agent
    runs; after ``reload`` an edited module is asked about again."""
    _write(tmp_path, "plain.py", MODULE)
    _stand_ins(tmp_path)
    async with Supervisor(workers=1, spares=0, agent_path=(str(tmp_path),)) as sup:
        count = await refused(sup, "plain:count")
        thing = await refused(sup, "plain:thing")
        assert sup.agents_known["plain:count"] == count  # known: the next submit asks no probe
        again = await refused(sup, "plain:count")
        with anyio.fail_after(60), pytest.raises(InvalidAgent, match=r"builtins\.int"):
            await sup.submit_many("plain:count", ["a", "b"])
        options = await refused(sup, "fw_objects:options")
        old = await refused(sup, "fw_objects:old")
        old_pydantic = await refused(sup, "fw_objects:old_pydantic")
        old_graph = await refused(sup, "fw_objects:old_graph")
        with anyio.fail_after(60):
            fine = await sup.run("plain:fine", "hi")
        _write(tmp_path, "plain.py", MODULE.replace("count = 5", "async def count(turn):\n    return 5"))
        await sup.reload()
        with anyio.fail_after(60):
            edited = await sup.run("plain:count", "hi")
    assert "'plain:count' is a builtins.int" in count and "neither callable" in count and again == count
    assert "'plain:thing' is a plain.Thing" in thing and "pydantic_ai.Agent" in thing
    assert "claude_agent_sdk.ClaudeAgentOptions" in options and "pip install 'turnpool[claude]'" in options
    assert "agents.Agent" in old and "Runner.run_streamed" in old
    assert "pip install 'turnpool[openai-agents]'" in old
    assert "pip install 'turnpool[pydantic-ai]'" in old_pydantic
    assert "pip install 'turnpool[langgraph]'" in old_graph
    assert fine.outcome == "completed" and fine.output == "fine"
    assert edited.outcome == "completed" and edited.output == 5


async def test_import_failures_and_slow_imports_are_accepted_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A framework that cannot be imported (a ``pydantic_ai`` on the agent path whose import raises)
    fails the agent's own module: the turn is accepted and fails with the import error. The probe's
    wait is bounded: a submit of a name whose module takes longer to import returns once the bound
    has passed, the turn accepted; it ends as the worker finds it (``failed`` with ``InvalidAgent``
    once the import finishes in the worker)."""
    monkeypatch.setattr(probe, "PROBE_SECONDS", 0.3)
    _write(tmp_path, "slow.py", "import time\n\ntime.sleep(1.5)\ncount = 5\n")  # allowed: slow import
    _write(tmp_path, "pydantic_ai/__init__.py", "raise ImportError('pydantic-ai is broken here')\n")
    _write(tmp_path, "uses_broken.py", "import pydantic_ai\n\nagent = pydantic_ai.Agent('test')\n")
    async with Supervisor(workers=1, spares=0, agent_path=(str(tmp_path),)) as sup:
        with anyio.fail_after(60):
            broken = await sup.run("uses_broken:agent", "hi")
        started = time.monotonic()
        with anyio.fail_after(60):
            handle = await sup.submit("slow:count", "hi")
        took = time.monotonic() - started
        with anyio.fail_after(60):
            result = await handle.result()
    assert broken.outcome == "failed" and broken.error is not None
    assert broken.error.type == "ImportError" and "pydantic-ai is broken here" in broken.error.message
    assert took < 1.2, took
    assert result.outcome == "failed" and result.error is not None and result.error.type == "InvalidAgent"


async def test_refused_at_submit_through_the_daemon(tmp_path: Path) -> None:
    """``Client.submit`` raises ``InvalidAgent``; HTTP answers 400 ``invalid_agent``; ``turnpool
    submit`` exits 2 with one line; ``turnpool batch`` writes the job's final line ``failed`` with
    error type ``InvalidAgent`` and runs the other jobs."""
    _write(tmp_path, "plain.py", MODULE)
    with serving(*FAST, *HTTP, paths=(ROOT, str(tmp_path))) as d:
        async with Client.connect(d.endpoint) as client:
            with anyio.fail_after(60), pytest.raises(InvalidAgent, match=r"'plain:thing' is a plain\.Thing"):
                await client.submit("plain:thing", "hi")
            with anyio.fail_after(60), pytest.raises(InvalidAgent, match=r"builtins\.int"):
                await client.submit("plain:count", "hi")
            with anyio.fail_after(60):
                fine = await (await client.submit("plain:fine", "hi")).result()
        async with httpx.AsyncClient(base_url=d.http_url, timeout=60) as http:
            r = await http.post("/v1/turns", json={"agent": "plain:thing", "input": "hi"})
        cli = d.cli("submit", "plain:count", "--input", '"hi"')
    assert fine.outcome == "completed"
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_agent", r.text
    assert "plain.Thing" in r.json()["error"]["message"]
    assert cli.returncode == 2, (cli.stdout, cli.stderr)
    assert len(cli.stderr.strip().splitlines()) == 1 and "builtins.int" in cli.stderr, cli.stderr


def test_refused_in_a_batch(tmp_path: Path) -> None:
    """``turnpool batch``: the job naming a non-callable gets a final ``failed`` line with error type
    ``InvalidAgent`` at once; the other job runs."""
    _write(tmp_path, "plain.py", MODULE)
    jobs, out = tmp_path / "jobs.jsonl", tmp_path / "out.jsonl"
    lines = [{"id": "bad", "agent": "plain:thing", "input": "x"}, {"id": "ok", "agent": "plain:fine"}]
    jobs.write_text("".join(json.dumps(j) + "\n" for j in lines))
    argv = [sys.executable, "-P", "-c", "from supervisor.cli.main import entry; entry()", "batch", str(jobs)]
    argv += ["-o", str(out), "--workers", "1", "--path", str(tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 1, proc.stderr
    records = {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines())}
    assert records["ok"]["outcome"] == "completed" and records["ok"]["output"] == "fine"
    bad = records["bad"]
    assert bad["final"] and bad["outcome"] == "failed" and bad["error"]["type"] == "InvalidAgent", bad
    assert bad["worker_pid"] is None, bad  # refused at submit: no worker ran it
    assert "plain.Thing" in bad["error"]["message"]


async def test_refused_by_turnpool_acp(tmp_path: Path) -> None:
    """``turnpool acp --agent`` naming what no worker can run: on its own pool the probe answers
    before the editor is served, and the command exits 2 with one line naming the type (and, for a
    framework object the installed framework cannot run, the extra); connected to a daemon, each
    prompt is answered with an invalid-params error naming the type."""
    import acp

    from tests.test_acp import TURNPOOL, acp_agent

    _write(tmp_path, "plain.py", MODULE)
    _stand_ins(tmp_path)

    async def alone(agent: str) -> subprocess.CompletedProcess[bytes]:
        argv = [str(TURNPOOL), "acp", "--agent", agent, "--workers", "1", "--spares", "0"]
        with anyio.fail_after(120):
            return await anyio.run_process([*argv, "--path", str(tmp_path)], check=False, input=b"", cwd=ROOT)

    thing, old = await alone("plain:thing"), await alone("fw_objects:old")
    with serving(*FAST, paths=(ROOT, str(tmp_path))) as d:
        async with acp_agent(tmp_path, "plain:count", "--connect", d.endpoint) as (conn, _, sid, _p):
            with anyio.fail_after(60), pytest.raises(acp.RequestError) as err:
                await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
    for proc, named in ((thing, "plain.Thing"), (old, "pip install 'turnpool[openai-agents]'")):
        lines = proc.stderr.decode().strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and named in lines[0], proc.stderr
        assert lines[0].startswith("turnpool acp: InvalidAgent: ") and proc.stdout == b""
    assert err.value.code == -32602 and str(err.value).startswith("InvalidAgent: "), err.value
    assert "'plain:count' is a builtins.int" in str(err.value)
    assert err.value.data == {"agent": "plain:count", "error": "InvalidAgent"}
