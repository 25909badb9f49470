"""``python -m supervisor.cli`` runs the ``turnpool`` command (same as the console script)."""

from .main import entry

entry()
