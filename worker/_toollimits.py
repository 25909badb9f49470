"""An isolated call's limits (``Limits``) and the environment a scrubbed call keeps (TOOL-ENV): what
``worker.isolated`` checks when it decorates a function, apart from where the limits are enforced
(``_toolgroups``), so that a process that only decorates (a functions template, WORKER-LAZY) does not
import the groups' code."""

from __future__ import annotations

import os
from dataclasses import dataclass

# TOOL-ENV: what a scrubbed environment keeps (env=None), and prefixes kept whole.
ENV_ALLOW = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "USER", "LOGNAME", "SHELL", "PWD")
ENV_ALLOW_PREFIXES = ("LC_",)
_ALLOWED = frozenset(ENV_ALLOW)


@dataclass(frozen=True)
class Limits:
    memory_mb: float | None = 256
    timeout: float | None = 30.0
    cpu_s: float | None = None
    pids: int | None = 64
    output_mb: float | None = 8
    env: dict[str, str] | None = None
    network: bool = True
    grace: float = 1.0
    kill_after: float = 1.0
    cgroups: bool | None = None  # None: use them where they work; False: rlimits only

    def check(self) -> None:
        for name in ("memory_mb", "timeout", "cpu_s", "output_mb"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
            ):
                raise ValueError(f"{name} must be a positive number or None, not {value!r}")
        for name in ("grace", "kill_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, not {value!r}")
        if self.pids is not None and (
            isinstance(self.pids, bool) or not isinstance(self.pids, int) or self.pids < 1
        ):
            raise ValueError(f"pids must be a positive int or None, not {self.pids!r}")
        if self.env is not None and not (
            isinstance(self.env, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items())
        ):
            raise TypeError("env must be a dict of str to str or None")

    def environment(self) -> dict[str, str]:
        keep = dict(_scrubbed())
        keep.update(self.env or {})
        return keep


_scrubbed_of: tuple[dict[bytes, bytes], dict[str, str]] | None = None


def _scrubbed() -> dict[str, str]:
    """TOOL-ENV: what the process's environment keeps when scrubbed; taken again only when the
    environment changed (one comparison of its raw block, not a decode of every variable per call),
    and then names looked up and values decoded only for what is kept."""
    global _scrubbed_of
    raw: dict[bytes, bytes] | None = getattr(os.environ, "_data", None)  # (None: os.environ replaced)
    if _scrubbed_of is None or raw is None or _scrubbed_of[0] != raw:
        env = os.environ
        keep = {k: env[k] for k in env if k in _ALLOWED or k.startswith(ENV_ALLOW_PREFIXES)}
        _scrubbed_of = (dict(raw or {}), keep)
        if raw is None:
            return keep
    return _scrubbed_of[1]
