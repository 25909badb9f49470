"""What the worker refuses when an agent name points at an object it cannot run: each fails its
turn with ``InvalidAgent`` naming the object's type and what to do. The frameworks here are
stand-in packages on the workers' agent path (``claude_agent_sdk``, ``agents``) that shadow the
installed ones in those workers, so no test depends on which versions are installed."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from supervisor import Supervisor

pytestmark = pytest.mark.anyio


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


async def test_unsupported_and_too_old_framework_objects_are_refused_naming_type_and_extra(
    tmp_path: Path,
) -> None:
    """A Claude Agent SDK options object (recognised, not run by this version), an OpenAI Agents SDK
    ``Agent`` whose installed SDK has no ``Runner.run_streamed``, and pydantic-ai / LangGraph objects
    whose installed framework lacks what the adapter imports: ``failed`` with error type
    ``InvalidAgent``, the first naming what is supported, the others the extra to install."""
    _write(tmp_path, "claude_agent_sdk/__init__.py", "class ClaudeAgentOptions:\n    pass\n")
    _write(tmp_path, "agents/__init__.py", "class Agent:\n    pass\n")
    _write(tmp_path, "pydantic_ai/__init__.py", "from .agent import Agent\n")
    _write(
        tmp_path,
        "pydantic_ai/agent.py",
        "class AbstractAgent:\n    pass\n\nclass Agent(AbstractAgent):\n    pass\n",
    )
    _write(tmp_path, "langgraph/__init__.py", "")
    _write(tmp_path, "langgraph/graph.py", "class Pregel:\n    pass\n")
    _write(
        tmp_path,
        "fw_objects.py",
        "import agents\nimport claude_agent_sdk\nimport pydantic_ai\nfrom langgraph.graph import Pregel\n\n"
        "options = claude_agent_sdk.ClaudeAgentOptions()\nold = agents.Agent()\n"
        "old_pydantic = pydantic_ai.Agent()\nold_graph = Pregel()\n",
    )
    async with Supervisor(workers=1, spares=0, agent_path=(str(tmp_path),)) as sup:
        with anyio.fail_after(60):
            options = await sup.run("fw_objects:options", "hi")
            old = await sup.run("fw_objects:old", "hi")
            old_pydantic = await sup.run("fw_objects:old_pydantic", "hi")
            old_graph = await sup.run("fw_objects:old_graph", "hi")
    # Frameworks whose adapter cannot even be imported against them name the extra too.
    for result, extra in ((old_pydantic, "pydantic-ai"), (old_graph, "langgraph")):
        assert result.outcome == "failed" and result.error is not None, result
        assert result.error.type == "InvalidAgent", result.error
        assert f"pip install 'turnpool[{extra}]'" in result.error.message
    assert options.outcome == "failed" and options.error is not None, options
    assert options.error.type == "InvalidAgent"
    assert "claude_agent_sdk.ClaudeAgentOptions" in options.error.message
    assert "cannot run yet" in options.error.message and "pydantic_ai.Agent" in options.error.message
    assert old.outcome == "failed" and old.error is not None, old
    assert old.error.type == "InvalidAgent" and "agents.Agent" in old.error.message
    assert "Runner.run_streamed" in old.error.message
    assert "pip install 'turnpool[openai-agents]'" in old.error.message
