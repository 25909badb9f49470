"""ACP-SCREEN: every line the editor sends is checked before the ACP library sees it.

The ``agent-client-protocol`` package reads one JSON-RPC message per line and takes it for an
object: a line that is JSON but not an object (``[1, 2]``, ``3``) raised inside its receive loop
and ended the whole agent, and a line nested 100,000 deep raised ``RecursionError`` there. Here
each line is decoded first (msgspec, depth-bounded by LINK-DEPTH); a line that is not JSON is answered
with JSON-RPC's ``-32700 Parse error``, one that is not an object (or too long, or too deep) with
``-32600 Invalid Request``, both with ``"id": null`` as JSON-RPC says, and dropped; every other
line goes on to the library unchanged, in order. The editor always gets an answer; the agent
stays up.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

log = logging.getLogger("turnpool.acp")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def refusal(line: bytes) -> bytes | None:
    """The JSON-RPC error line answering ``line``, or ``None`` if ``line`` may go on."""
    try:
        message = _decode(line)
    except RecursionError:
        return _error(INVALID_REQUEST, "Invalid Request", "the message nests too deeply")
    except (msgspec.DecodeError, ValueError) as exc:
        return _error(PARSE_ERROR, "Parse error", str(exc))
    if not isinstance(message, dict):
        return _error(
            INVALID_REQUEST, "Invalid Request", f"a message is a JSON object, not {type(message).__name__}"
        )
    return None


def _error(code: int, message: str, details: str) -> bytes:
    return (
        _encode({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message, "data": details}})
        + b"\n"
    )


def screened(
    source: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int
) -> tuple[asyncio.StreamReader, asyncio.Task[None]]:
    """A reader that yields ``source``'s good lines; the task that feeds it (ends at EOF)."""
    out = asyncio.StreamReader(limit=limit)

    async def pump() -> None:
        try:
            while True:
                try:
                    line = await source.readuntil(b"\n")
                except asyncio.IncompleteReadError as exc:
                    line = exc.partial  # the last line, without its newline
                    if line.strip():
                        _pass_or_answer(line, out, writer)
                    return
                except asyncio.LimitOverrunError:
                    await _skip_line(source, limit)
                    writer.write(
                        _error(INVALID_REQUEST, "Invalid Request", f"a message is at most {limit} bytes")
                    )
                    continue
                if line.strip():
                    _pass_or_answer(line, out, writer)
        finally:
            out.feed_eof()

    return out, asyncio.get_running_loop().create_task(pump(), name="turnpool.acp.screen")


def _pass_or_answer(line: bytes, out: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    answer = refusal(line)
    if answer is None:
        out.feed_data(line if line.endswith(b"\n") else line + b"\n")
    else:
        log.warning("refused a message from the editor: %s", answer.decode().strip()[:200])
        writer.write(answer)


async def _skip_line(source: asyncio.StreamReader, limit: int) -> None:
    """Drop the rest of a line above the limit, up to and including its newline."""
    while True:
        try:
            await source.readuntil(b"\n")
            return
        except asyncio.LimitOverrunError as exc:
            await source.readexactly(exc.consumed)
        except asyncio.IncompleteReadError:
            return
