"""The loop's timeline: what happened in a run, as blocks. At most one block is open; on an
interruption the loop closes it as ``aborted`` (``abort_current_block``), so a half-streamed
text or a half-run tool batch is visibly cut, never silently left open."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

BlockKind = Literal["text", "tool_call", "tool_run"]
BlockState = Literal["open", "done", "aborted"]


@dataclass
class Block:
    """``text``: streamed assistant text; ``tool_call``: one call the model asked for;
    ``tool_run``: one parallel batch of tool calls and the results that came back."""

    kind: BlockKind
    state: BlockState = "open"
    text: str = ""
    calls: list[Any] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)


class Timeline:
    __slots__ = ("_current", "blocks")

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self._current: Block | None = None

    @property
    def current(self) -> Block | None:
        return self._current

    def open(self, kind: BlockKind) -> Block:
        """Close the current block (done) and open a new one."""
        self.close_current()
        block = Block(kind)
        self.blocks.append(block)
        self._current = block
        return block

    def add_closed(self, block: Block) -> Block:
        self.close_current()
        block.state = "done"
        self.blocks.append(block)
        return block

    def close_current(self) -> None:
        if self._current is not None:
            self._current.state = "done"
            self._current = None

    def abort_current_block(self) -> Block | None:
        """Close the open block as ``aborted``; returns it (``None`` when none was open)."""
        block, self._current = self._current, None
        if block is not None:
            block.state = "aborted"
        return block

    def text_delta(self, text: str) -> None:
        block = self._current
        if block is None or block.kind != "text":
            block = self.open("text")
        block.text += text

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[Block]:
        return iter(self.blocks)
