"""Framework objects as agents: an agent name may point at a pydantic-ai ``Agent``, a compiled
LangGraph graph, an OpenAI Agents SDK ``Agent`` or Claude Agent SDK options; the worker wraps it in
an adapter that runs it with the framework's own streaming API and maps its stream onto turnpool's
event vocabulary.

ADAPT-OBJECT: the core never imports a framework. The object's class is recognised by the names in its
MRO (no import), and only then is the adapter module for it imported, which imports the
framework (already imported by the user's module that built the object). One module per framework.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any

import anyio

from .._errors import WorkerError
from .._toolerrors import ToolIsolationError, claim, failed_fields, take

__all__ = ["InvalidAgent", "TurnThreads", "adapt", "split_input", "tool_update"]


class InvalidAgent(WorkerError, TypeError):
    """The named attribute is neither a turnpool agent (a callable) nor a framework object this
    worker can run (or its framework is too old: the message says which extra to install)."""


# (top-level package, class name in the object's MRO, adapter module, extra, what it is)
_FRAMEWORKS: tuple[tuple[str, str, str, str, str], ...] = (
    ("pydantic_ai", "AbstractAgent", "_pydantic_ai", "pydantic-ai", "a pydantic-ai Agent"),
    ("langgraph", "Pregel", "_langgraph", "langgraph", "a compiled LangGraph graph"),
    ("agents", "Agent", "_openai_agents", "openai-agents", "an OpenAI Agents SDK Agent"),
    ("claude_agent_sdk", "ClaudeAgentOptions", "_claude", "claude", "Claude Agent SDK options"),
)

SUPPORTED = (
    "a pydantic_ai.Agent, a compiled LangGraph graph, an agents.Agent (OpenAI Agents SDK) "
    "or claude_agent_sdk.ClaudeAgentOptions"
)

AgentFn = Callable[[Any], Awaitable[Any]]


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def adapt(spec: str, obj: Any) -> Any:
    """``obj`` itself if it is a plain turnpool agent (a callable that is no framework object), an
    ``async def agent(turn)`` running it if it is a supported framework object, or ``InvalidAgent``
    naming its type (and the extra to install when the framework is too old)."""
    for cls in type(obj).__mro__:
        top = cls.__module__.partition(".")[0]
        for package, name, module, extra, what in _FRAMEWORKS:
            if top == package and cls.__name__ == name:
                if not module:
                    raise InvalidAgent(
                        f"agent {spec!r} is {what} ({_type_name(obj)}), which workers cannot run yet; "
                        f"supported: {SUPPORTED}"
                    )
                try:
                    adapter = importlib.import_module(f"{__name__}.{module}")
                except ImportError as exc:  # the installed framework lacks what the adapter imports
                    raise too_old(spec, obj, extra, f"what turnpool's adapter imports ({exc})") from None
                wrapped: AgentFn | None = adapter.adapt(spec, obj, extra)
                if wrapped is not None:
                    return wrapped
    if not callable(obj):
        raise InvalidAgent(
            f"agent {spec!r} is a {_type_name(obj)}: neither callable (`async def agent(turn)`) "
            f"nor a supported framework object ({SUPPORTED})"
        )
    return obj


def tool_update(
    call_id: Any, status: str, output: Any, error: ToolIsolationError | None = None
) -> dict[str, Any]:
    """A ``tool_call_update`` event for a tool call's output as the framework reports it; a call whose
    output is the text of an isolated call's error raised in this turn (the framework caught it and
    told its model), or that the framework said raised ``error``, is ``failed``, with the kill's
    ``reason`` and ``text`` (TOOL-TOLD-FOLLOWERS)."""
    event = {"type": "tool_call_update", "id": call_id, "status": status, "output": output}
    if error is not None:
        take(error)
    exc = error if error is not None else claim(output)
    if exc is not None:
        event.update(failed_fields(exc))
    return event


def too_old(spec: str, obj: Any, extra: str, missing: str) -> InvalidAgent:
    """The framework object is supported, but the installed framework lacks what the adapter uses."""
    return InvalidAgent(
        f"agent {spec!r} is a {_type_name(obj)}, but the installed framework has no {missing}: "
        f"install turnpool's extra: pip install 'turnpool[{extra}]'"
    )


ACP_KEYS = frozenset(("text", "prompt", "session_id", "cwd"))


def acp_prompt(value: Any) -> tuple[str, str] | None:
    """(text, session id) if ``value`` is the input ``turnpool acp`` gives a prompt's turn
    (``{"text", "prompt": [content blocks], "session_id", "cwd"}``), else None."""
    if (
        isinstance(value, dict)
        and value.keys() == ACP_KEYS
        and isinstance(value["text"], str)
        and isinstance(value["prompt"], list)
    ):
        return value["text"], str(value["session_id"])
    return None


def split_input(value: Any, framework: str, keys: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """The turn's input as (prompt, the other keys): a ``str`` is the prompt, a dict
    ``{"prompt": str, ...}`` may add ``keys``, an editor's prompt through ``turnpool acp`` gives its
    text; anything else, or another key, is refused."""
    if isinstance(value, str):
        return value, {}
    acp = acp_prompt(value)
    if acp is not None:
        return acp[0], {}
    if isinstance(value, dict) and isinstance(value.get("prompt"), str):
        unknown = sorted(str(k) for k in value if k != "prompt" and k not in keys)
        if unknown:
            raise ValueError(
                f"unknown input key(s) {', '.join(map(repr, unknown))} for {framework}: "
                f"the input takes 'prompt'" + "".join(f", {k!r}" for k in keys)
            )
        return value["prompt"], {k: v for k, v in value.items() if k != "prompt"}
    raise TypeError(
        f"the input of {framework} is a str (the prompt) or a dict {{'prompt': str"
        + "".join(f", {k!r}: ..." for k in keys)
        + f"}}, got {type(value).__name__}"
    )


def load_named(name: str, what: str) -> Any:
    """Import ``"package.module:attr"`` (a factory named in a turn's input)."""
    if not isinstance(name, str) or name.count(":") != 1:
        raise ValueError(f"{what} must be named 'package.module:attr', got {name!r}")
    module_name, _, attr = name.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{what} {name!r} is not callable")
    return obj


def of_class(obj: Any, package: str, name: str) -> bool:
    """Whether ``obj``'s class has ``package``'s class ``name`` in its MRO (no import)."""
    return any(c.__name__ == name and c.__module__.partition(".")[0] == package for c in type(obj).__mro__)


# ADAPT-QUIET: a framework turn ends only once the sync code it started in threads has returned, and
# the tasks it asked to cancel have ended.
class TurnThreads(ThreadPoolExecutor):
    """The threads one framework turn runs sync code in (tools, nodes), as the event loop's default
    executor for the turn (``run_in_executor(None, ...)``: LangGraph and LangChain) and the
    framework's own executor where it takes one (pydantic-ai).

    A framework's cancelled run abandons sync code running in a thread: the run ends at once while
    the thread goes on. Leaving this context waits, shielded, until every thread of the turn has
    returned, so the turn ends only once nothing of it runs: sync code that never returns holds the
    turn until the ladder kills the worker after the grace (``killed``, never a false ``aborted``).

    The same for the asyncio tasks the framework started in the turn (a LangGraph node, an OpenAI
    Agents SDK tool): a cancelled run abandons a task it asked to cancel that has not finished (an
    async tool that swallows the cancel); leaving waits, shielded, for each such task, so one that
    never ends is the ladder's (``killed``) too."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="turnpool-framework")
        self.running: set[Future[Any]] = set()
        self._previous: Any = None
        self._tasks: set[asyncio.Task[Any]] = set()  # the tasks alive when the turn began

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        self.running.add(future)
        future.add_done_callback(self.running.discard)
        return future

    async def __aenter__(self) -> TurnThreads:
        loop = asyncio.get_running_loop()
        self._previous = getattr(loop, "_default_executor", None)
        loop.set_default_executor(self)
        self._tasks = asyncio.all_tasks()
        return self

    def cancelled_tasks(self) -> list[asyncio.Task[Any]]:
        """The tasks started in the turn that were asked to cancel and have not finished."""
        return [t for t in asyncio.all_tasks() - self._tasks if not t.done() and t.cancelling()]

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        loop = asyncio.get_running_loop()
        # Not set_default_executor: it takes no None, and the previous executor may be None.
        loop._default_executor = self._previous  # type: ignore[attr-defined]
        self.shutdown(wait=False)
        with anyio.CancelScope(shield=True):
            if self.running:
                await asyncio.wait([asyncio.wrap_future(f) for f in self.running])
            while stuck := self.cancelled_tasks():
                await asyncio.wait(stuck)
