"""Claude Agent SDK options that run the real ``claude`` CLI (the one the SDK's wheel bundles),
pointed at the loopback Messages-API stand-in the test started (``tests.support.anthropic_server``:
its URL in ``TURNPOOL_TEST_ANTHROPIC_URL``, the CLI's home in ``TURNPOOL_TEST_CLAUDE_HOME``, both
read when the workers import this module)."""

import os

from claude_agent_sdk import ClaudeAgentOptions

_home = os.environ.get("TURNPOOL_TEST_CLAUDE_HOME", "/nonexistent")

assistant = ClaudeAgentOptions(
    include_partial_messages=True,
    cwd=_home,
    env={
        "ANTHROPIC_BASE_URL": os.environ.get("TURNPOOL_TEST_ANTHROPIC_URL", "http://127.0.0.1:9"),
        "ANTHROPIC_API_KEY": "test",
        "HOME": _home,  # the CLI's settings and sessions, in the test's directory
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no telemetry, no update checks: loopback only
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    },
)
