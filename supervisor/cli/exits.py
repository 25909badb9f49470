"""The exit codes of every ``turnpool`` command, named once (the batch runner returns them too)."""

EXIT_OK = 0  # done (and, where a turn was waited for, it completed)
EXIT_FAILED = 1  # failed: refused, unreachable, or a waited-for turn / a batch job did not complete
EXIT_USAGE = 2  # bad usage or input
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (128 + SIGINT)

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE"]
