"""The exit codes of every ``turnpool`` command, named once (the batch runner returns them too),
and how an error that reached the top of a command becomes one of them."""

from __future__ import annotations

EXIT_OK = 0  # done (and, where a turn was waited for, it completed)
EXIT_FAILED = 1  # failed: refused, unreachable, or a waited-for turn / a batch job did not complete
EXIT_USAGE = 2  # bad usage or input
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (128 + SIGINT)
EXIT_PIPE = 141  # stdout was closed by the reader (`| head`): 128 + SIGPIPE, as a shell tool ends; quiet


def innermost(
    exc: BaseException, kinds: type[BaseException] | tuple[type[BaseException], ...]
) -> BaseException | None:
    """``exc`` if it is one of ``kinds``, else the first one of ``kinds`` in the exception groups it
    wraps, depth first (a task group wraps what its tasks raise: ``submit --wait`` raised a
    53-line ``ExceptionGroup`` for a bad agent name)."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = innermost(inner, kinds)
            if found is not None:
                return found
    return None


__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PIPE", "EXIT_USAGE", "innermost"]
