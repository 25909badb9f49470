"""``OpenAIModel``: a ``ModelClient`` for any OpenAI-compatible Chat Completions server
(OpenAI, vLLM, llama.cpp server, Ollama, …), built on the official ``openai`` package.

Install with the extra: ``pip install 'turnpool[openai]'``. Opening the stream is the HTTP
request up to the response headers; closing it (which the loop does on cancel, shielded)
closes the HTTP response and so the connection, which tells the server to stop generating.
"""

from __future__ import annotations

import collections
import json
import os
from dataclasses import dataclass, field
from typing import Any

try:
    import openai
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("OpenAIModel needs the optional extra: pip install 'turnpool[openai]'") from exc

from ._errors import ClientError
from ._messages import (
    AssistantMessage,
    Finish,
    FunctionCall,
    FunctionCallOutput,
    HistoryItem,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCall,
    UserMessage,
)

#: Chat Completions request options the client passes through from ``AgentLoop(settings=...)``.
SUPPORTED_SETTINGS = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "tool_choice",
        "parallel_tool_calls",
        "user",
        "extra_body",
        "extra_headers",
        "reasoning_effort",
    }
)


class OpenAIModel:
    """``OpenAIModel("gpt-4o-mini")`` or ``OpenAIModel("qwen", base_url="http://127.0.0.1:8000/v1")``.

    ``api_key`` defaults to ``$OPENAI_API_KEY``, else a placeholder (local servers ignore it).
    ``client`` lets you pass your own ``openai.AsyncOpenAI``; one the model made itself is
    closed by ``aclose()`` (or ``async with``).
    """

    supported_settings: frozenset[str] | None = SUPPORTED_SETTINGS

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        timeout: float | None = 600.0,
        max_retries: int = 2,
    ) -> None:
        self.model = model
        if client is None:
            client = openai.AsyncOpenAI(
                base_url=base_url,
                api_key=api_key or os.environ.get("OPENAI_API_KEY") or "not-needed",
                timeout=timeout,
                max_retries=max_retries,
            )
            self._owns_client = True
        else:
            self._owns_client = False
        self.client = client

    async def open(self, request: ModelRequest) -> OpenAIStream:
        kwargs: dict[str, Any] = dict(request.settings)
        kwargs.update(model=self.model, messages=to_openai_messages(request), stream=True)
        if request.tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in request.tools
            ]
        try:
            raw = await self.client.chat.completions.create(**kwargs)
        except openai.OpenAIError as exc:
            raise ClientError(f"{type(exc).__name__}: {exc}") from exc
        return OpenAIStream(raw)

    async def aclose(self) -> None:
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> OpenAIModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model!r}, base_url={str(self.client.base_url)!r})"


def to_openai_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The history as Chat Completions messages: an assistant text and the tool calls after it
    become one assistant message; each output becomes a ``tool`` message."""
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    assistant: dict[str, Any] | None = None
    item: HistoryItem
    for item in request.messages:
        if isinstance(item, AssistantMessage | FunctionCall):
            if assistant is None:
                assistant = {"role": "assistant", "content": None}
                out.append(assistant)
            if isinstance(item, AssistantMessage):
                assistant["content"] = (assistant["content"] or "") + item.text
            else:
                assistant.setdefault("tool_calls", []).append(
                    {
                        "id": item.call_id,
                        "type": "function",
                        "function": {"name": item.name, "arguments": json.dumps(item.arguments)},
                    }
                )
            continue
        assistant = None
        if isinstance(item, UserMessage):
            out.append({"role": "user", "content": item.text})
        elif isinstance(item, FunctionCallOutput):
            content = item.output if isinstance(item.output, str) else json.dumps(item.output)
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": content})
    return out


@dataclass
class _PartialCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIStream:
    """Chat Completions chunks → ``TextDelta`` / ``ToolCall`` / ``Finish``. Tool calls arrive in
    pieces (id and name first, arguments in fragments); each is yielded whole when the choice
    finishes (or the stream ends)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._ready: collections.deque[ModelEvent] = collections.deque()
        self._calls: dict[int, _PartialCall] = {}
        self._done = False

    def __aiter__(self) -> OpenAIStream:
        return self

    async def __anext__(self) -> ModelEvent:
        while not self._ready:
            if self._done:
                raise StopAsyncIteration
            try:
                chunk = await self._raw.__anext__()
            except StopAsyncIteration:
                self._done = True
                self._flush_calls()
                continue
            except openai.OpenAIError as exc:
                raise ClientError(f"{type(exc).__name__}: {exc}") from exc
            self._take(chunk)
        return self._ready.popleft()

    def _take(self, chunk: Any) -> None:
        for choice in chunk.choices or ():
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    self._ready.append(TextDelta(delta.content))
                for piece in delta.tool_calls or ():
                    call = self._calls.setdefault(piece.index, _PartialCall())
                    if piece.id:
                        call.call_id = piece.id
                    if piece.function is not None:
                        if piece.function.name:
                            call.name += piece.function.name
                        if piece.function.arguments:
                            call.arguments.append(piece.function.arguments)
            if choice.finish_reason:
                self._flush_calls()
                self._ready.append(Finish(choice.finish_reason))

    def _flush_calls(self) -> None:
        for index in sorted(self._calls):
            call = self._calls[index]
            raw = "".join(call.arguments) or "{}"
            # Arguments the model got wrong are the model's mistake, not the client's: the call
            # carries why, and the loop answers it with that error so the model can try again.
            invalid = None
            try:
                arguments = json.loads(raw)
            except json.JSONDecodeError:
                arguments, invalid = {}, f"the arguments are not valid JSON: {raw[:200]!r}"
            if not isinstance(arguments, dict):
                arguments, invalid = {}, f"the arguments are not a JSON object: {raw[:200]!r}"
            self._ready.append(ToolCall(call.call_id or f"call_{index}", call.name, arguments, invalid))
        self._calls.clear()

    async def aclose(self) -> None:
        self._done = True
        await self._raw.close()
