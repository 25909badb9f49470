"""``worker.agent``: an agent loop (model stream + parallel tool calls + hooks) that stops at
the cancellation detection points of the Rust worker spec.

Layers: ``_messages`` (history, model events, request, results), ``_errors``, ``_cancel``
(the cancel channel and its senders), ``_timeline``, ``_hooks``, ``_tools``, ``_steps`` (step
records and resume), ``_model`` (``ModelClient`` protocol, ``ScriptedModel``), ``_loop``
(``AgentLoop``), ``_openai`` (``OpenAIModel``, needs the ``turnpool[openai]`` extra; imported lazily).
"""

from typing import Any

from ._agent_loop import AgentLoop
from ._cancel import CancelReceiver, CancelSender, cancel_channel
from ._errors import (
    Aborted,
    AgentLoopError,
    Cancelled,
    ClientError,
    ConfigWarnings,
    HookError,
    MaxStepsExceeded,
    StepRecordError,
    ToolError,
    UnknownToolOutcome,
)
from ._hooks import CONTINUE, Abort, Continue, Hook, Pause, Step, hook
from ._messages import (
    AssistantMessage,
    Finish,
    Finished,
    FunctionCall,
    FunctionCallOutput,
    ModelRequest,
    Paused,
    TextDelta,
    ToolCall,
    ToolSpec,
    UserMessage,
)
from ._model import Delayed, ModelClient, ModelStream, Response, ScriptedModel
from ._steps import CallInfo, current_call
from ._timeline import Block, Timeline
from ._tools import Tool, tool

__all__ = [
    "CONTINUE",
    "Abort",
    "Aborted",
    "AgentLoop",
    "AgentLoopError",
    "AssistantMessage",
    "Block",
    "CallInfo",
    "CancelReceiver",
    "CancelSender",
    "Cancelled",
    "ClientError",
    "ConfigWarnings",
    "Continue",
    "Delayed",
    "Finish",
    "Finished",
    "FunctionCall",
    "FunctionCallOutput",
    "Hook",
    "HookError",
    "MaxStepsExceeded",
    "ModelClient",
    "ModelRequest",
    "ModelStream",
    "OpenAIModel",
    "Pause",
    "Paused",
    "Response",
    "ScriptedModel",
    "Step",
    "StepRecordError",
    "TextDelta",
    "Timeline",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolSpec",
    "UnknownToolOutcome",
    "UserMessage",
    "cancel_channel",
    "current_call",
    "hook",
    "tool",
]


def __getattr__(name: str) -> Any:
    # OpenAIModel needs the optional ``openai`` package: import it only when asked for.
    if name == "OpenAIModel":
        from ._openai import OpenAIModel

        return OpenAIModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
