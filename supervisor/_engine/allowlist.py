"""Which agents a pool may run: ``allow_agents``, glob patterns on ``"package.module:attr"`` (SEC-ALLOW).

``serve --allow-agent PATTERN`` (repeatable; TOML ``allow_agents``) and ``Supervisor(allow_agents=...)``
build one ``AgentAllowlist``. Admission (``admission.py``) asks it about every turn before the turn is
recorded: a client's submit through any front end, a child a running turn spawns, a turn the journal
readmits. A name no pattern matches is refused with ``AgentNotAllowed`` (an ``InvalidAgent``) and is
never imported: the supervisor never imports agents, and a refused turn never reaches a worker.

Patterns use ``fnmatch``'s syntax, matched case-sensitively against the whole name: ``*`` matches
any run of characters (dots and the colon included), ``?`` one character, ``[...]`` a set. So
``myapp.agents:*`` allows every attribute of ``myapp.agents``, ``myapp.*`` everything under the
package ``myapp``, and ``*`` every agent (an explicit choice, written down).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from typing import Any

from .._errors import AgentNotAllowed

MAX_PATTERN = 300
MAX_PATTERNS = 1000
_KNOWN = 4096  # names remembered as allowed (a submit's check is then one set lookup)
_SHOWN = 5  # patterns named in a refusal


class AgentAllowlist:
    """The agents a pool may run; see the module docstring."""

    __slots__ = ("_allowed", "_regex", "patterns")

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = check_patterns(patterns)
        joined = "|".join(f"(?:{fnmatch.translate(p)})" for p in self.patterns)
        self._regex = re.compile(joined)
        self._allowed: set[str] = set()

    @classmethod
    def of(cls, patterns: Any) -> AgentAllowlist | None:
        """The allowlist of ``patterns`` (``None``: every agent is allowed)."""
        if patterns is None:
            return None
        if isinstance(patterns, AgentAllowlist):
            return patterns
        return cls(patterns)

    def allows(self, agent: str) -> bool:
        if agent in self._allowed:
            return True
        if self._regex.fullmatch(agent) is None:
            return False
        if len(self._allowed) < _KNOWN:
            self._allowed.add(agent)
        return True

    # SEC-ALLOW: a name no pattern matches is refused before its turn exists; nothing imports it.
    def check(self, agent: str) -> str:
        """``agent`` if a pattern matches it, else ``AgentNotAllowed`` naming the patterns."""
        if self.allows(agent):
            return agent
        shown = ", ".join(repr(p) for p in self.patterns[:_SHOWN])
        more = f" and {len(self.patterns) - _SHOWN} more" if len(self.patterns) > _SHOWN else ""
        raise AgentNotAllowed(
            f"agent {agent!r} is not allowed here: this pool runs only agents matching {shown}{more} "
            "(allow_agents / serve --allow-agent)"
        )


def check_patterns(patterns: Any) -> tuple[str, ...]:
    """``patterns`` as a non-empty tuple of glob patterns, or ``TypeError``/``ValueError`` saying why."""
    if isinstance(patterns, str) or not isinstance(patterns, Iterable):
        raise TypeError(
            f"allow_agents must be a list of patterns like 'myapp.agents:*', got {type(patterns).__name__}"
        )
    out = tuple(patterns)
    if not out:
        raise ValueError("allow_agents is empty: it would refuse every agent; give at least one pattern")
    if len(out) > MAX_PATTERNS:
        raise ValueError(f"allow_agents holds {len(out)} patterns; at most {MAX_PATTERNS}")
    for p in out:
        if not isinstance(p, str):
            raise TypeError(f"an allow_agents pattern must be a string like 'myapp.agents:*', got {p!r}")
        if not p or len(p) > MAX_PATTERN or any(ch.isspace() or not ch.isprintable() for ch in p):
            raise ValueError(
                f"allow_agents pattern {p[:MAX_PATTERN]!r} must be 1-{MAX_PATTERN} printable characters "
                "without spaces, like 'myapp.agents:*'"
            )
    return out
