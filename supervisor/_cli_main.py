"""``python -m supervisor._cli_main`` runs the ``turnpool`` command (same as the console script)."""

from ._cli import entry

entry()
