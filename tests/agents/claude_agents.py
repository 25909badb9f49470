"""Claude Agent SDK options as agents, run against a stand-in ``claude`` CLI
(``fake_claude_cli.py``: the SDK's stream-json protocol, no model service)."""

from pathlib import Path

from claude_agent_sdk import ClaudeAgentOptions

CLI = str(Path(__file__).with_name("fake_claude_cli.py"))

assistant = ClaudeAgentOptions(cli_path=CLI, include_partial_messages=True)
whole = ClaudeAgentOptions(cli_path=CLI)  # no partial messages: text and thinking come as whole blocks
# never connects: a cancel comes mid-connect()
mute = ClaudeAgentOptions(cli_path=CLI, env={"FAKE_CLAUDE_MUTE": "1"})
