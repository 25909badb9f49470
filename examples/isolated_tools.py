"""Tools that run in their own process (``worker.isolated``, ``worker.run_command``), in turnpool's agent
loop and in each framework's agent. See ``docs/tools.md``.

``python -m examples.isolated_tools`` runs, each in a real worker and offline, the agent loop's
``examples.isolated_tools:loop`` (a scripted model), the pydantic-ai agent
``examples.isolated_tools:pydantic`` (``FunctionModel``) and the LangGraph graph
``examples.isolated_tools:graph`` (langchain_core's fake chat model); each model asks for ``run_python``
with code that allocates 2 GiB, is told the tool was killed for memory, and answers.
``examples.isolated_tools:openai`` is the same with the OpenAI Agents SDK, against any OpenAI-compatible
server (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``EXAMPLE_MODEL``); it runs when ``OPENAI_BASE_URL`` is
set. The frameworks are optional (``pip install 'turnpool[pydantic-ai,langgraph,openai-agents]'``); an
agent whose framework is missing is skipped.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import anyio

import worker
from worker.agent import AgentLoop, Finish, Response, ScriptedModel, TextDelta, ToolCall, tool

HOG = "x = bytearray(2 << 30)"  # what each model asks to run: 2 GiB, under memory_mb=256


# ---- the tools: plain functions, each call in a process of its own --------------------------------


@worker.isolated(memory_mb=256, timeout=30)
def run_python(code: str) -> str:
    """Run Python code; its ``result`` variable is returned (as text)."""
    scope: dict[str, Any] = {}
    exec(code, scope)
    return repr(scope.get("result"))


def shell(argv: list[str]) -> dict[str, Any]:
    """Run a command (no shell): its exit code and output, bounded."""
    res = worker.run_command(argv, timeout=60, memory_mb=512, output_mb=1)
    return {
        "returncode": res.returncode,
        "stdout": res.stdout.decode(errors="replace"),
        "killed": res.killed_reason,
    }


# ---- turnpool's agent loop: the model gets {"error": "tool killed: ..."}, the turn goes on ------------


async def loop(turn: worker.Turn) -> Any:
    model = ScriptedModel(
        [
            Response([ToolCall("c1", "run_python", {"code": HOG}), Finish("tool_calls")]),
            Response([TextDelta("That needed more memory than the tool may use."), Finish("stop")]),
        ]
    )
    result = await AgentLoop(model, tools=[tool(run_python), tool(shell)], turn=turn).run("Allocate 2 GiB")
    return result.text


# ---- pydantic-ai: a stopped call is pydantic-ai's ToolFailed too, so the model is told -------------------

try:
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.messages import ModelMessage
    from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

    async def _pydantic_model(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        told = [
            p.content for m in messages for p in m.parts if "tool killed" in str(getattr(p, "content", ""))
        ]
        if told:
            yield f"The tool was stopped: {told[-1]}"
            return
        yield {0: DeltaToolCall(name="python", json_args=f'{{"code": "{HOG}"}}', tool_call_id="c1")}

    pydantic: Any = PydanticAgent(FunctionModel(stream_function=_pydantic_model))

    @pydantic.tool_plain
    def python(code: str) -> str:
        """Run Python code."""
        return str(run_python(code))

except ImportError:
    pydantic = None


# ---- LangGraph: ToolNode(handle_tool_errors=worker.ToolIsolationError) tells the model -------------------

try:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    @lc_tool
    def python_lc(code: str) -> str:
        """Run Python code."""
        return str(run_python(code))

    async def _agent(state: MessagesState) -> dict[str, Any]:
        told = [m.content for m in state["messages"] if isinstance(m, ToolMessage)]
        if told:
            model = GenericFakeChatModel(messages=iter([f"The tool was stopped: {told[-1]}"]))
            return {"messages": [await model.ainvoke(state["messages"])]}
        call = {"name": "python_lc", "args": {"code": HOG}, "id": "c1"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    def _route(state: MessagesState) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    _g = StateGraph(MessagesState)
    _g.add_node("agent", _agent)
    _g.add_node("tools", ToolNode([python_lc], handle_tool_errors=worker.ToolIsolationError))
    _g.add_edge(START, "agent")
    _g.add_conditional_edges("agent", _route, ["tools", END])
    _g.add_edge("tools", "agent")
    graph: Any = _g.compile()
except ImportError:
    graph = None


# ---- OpenAI Agents SDK: failure_error_function gives the model the error's text ------------------------

try:
    from agents import Agent as OpenAIAgent
    from agents import OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    def _tell(ctx: Any, error: Exception) -> str:
        return str(error)  # the SDK's default hides the text ("An error occurred ...")

    @function_tool(failure_error_function=_tell)
    def python_oa(code: str) -> str:
        """Run Python code."""
        return str(run_python(code))

    openai: Any = OpenAIAgent(
        name="coder",
        instructions=f"Run this with python_oa, then say what happened: {HOG}",
        model=OpenAIChatCompletionsModel(
            model=os.environ.get("EXAMPLE_MODEL", "gpt-4o-mini"),
            openai_client=AsyncOpenAI(api_key=os.environ.get("OPENAI_API_KEY", "none")),
        ),
        tools=[python_oa],
    )
except ImportError:
    openai = None


async def main() -> None:
    from supervisor import Supervisor

    names = ["loop"] + [n for n in ("pydantic", "graph") if globals()[n] is not None]
    if openai is not None and os.environ.get("OPENAI_BASE_URL"):
        names.append("openai")
    async with Supervisor(workers=1, spares=0) as sup:
        for name in names:
            result = await sup.run(f"examples.isolated_tools:{name}", "Allocate 2 GiB")
            answer = result.output["messages"][-1]["content"] if name == "graph" else result.output
            print(f"{name:9} {result.outcome}: {answer}")


if __name__ == "__main__":
    anyio.run(main)
