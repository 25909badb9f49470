"""WORKER-ERROR-TEXT: the text of an agent's exception, read without trusting it.

The exception an agent raises is the agent's code: its ``__str__`` may raise, or return text that
UTF-8 cannot carry (a lone surrogate). Either way the turn ends ``failed`` with what can be said of
the error, and the worker stays up (it used to die encoding the End: ``crashed``)."""

from __future__ import annotations


def error_message(exc: BaseException) -> str:
    """``str(exc)`` as UTF-8 can carry it, or a note saying that it could not be read."""
    try:
        return safe_text(str(exc))
    except Exception as inner:  # noqa: BLE001 - the agent's __str__, whatever it raises
        return f"<the error's message could not be read: its __str__ raised {type(inner).__name__}>"


def safe_text(text: str) -> str:
    """``text`` with each lone surrogate written as its ``\\udXXX`` escape."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
