"""The HTTP API from other languages: the README's Node client runs as written against a real daemon
(Node 20 has ``fetch`` but no ``EventSource``: the example reads the SSE stream by hand)."""

from __future__ import annotations

import json
import shutil

import anyio
import pytest

from tests.support.daemonkit import FAST, HTTP, ROOT, serving

pytestmark = pytest.mark.anyio

NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="node is not installed on this machine")
async def test_the_node_example_submits_follows_and_gets_the_result() -> None:
    """``node examples/sse_client.mjs URL AGENT INPUT``: one line per event in order, then the
    completed result; exit 0."""
    assert NODE is not None
    with serving(*FAST, *HTTP) as d:
        with anyio.fail_after(60):
            done = await anyio.run_process(
                [NODE, "examples/sse_client.mjs", d.http_url, "examples.agents:streamer", '{"count": 3}'],
                cwd=ROOT,
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [line["event"]["i"] for line in lines[:-1]] == [0, 1, 2]
    assert lines[-1]["result"]["outcome"] == "completed"
    assert lines[-1]["result"]["output"] == {"events": 3}
