"""The closed cancellation-cause vocabulary and its strict validation boundary.

A cause says *who or what* asked a turn to stop. It is a closed union: the only accepted
input is a plain ``dict`` (or a :class:`Cause`) with exactly the key ``kind`` and one of
the supported values. Anything else is rejected synchronously, before anything is sent.
The accepted value is a detached, immutable :class:`Cause`.
"""

from __future__ import annotations

from typing import Any, Final, Literal, get_args

import msgspec

CauseKind = Literal["user", "parent", "deadline", "memory", "disposed"]
CAUSE_KINDS: Final[frozenset[str]] = frozenset(get_args(CauseKind))


class Cause(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An accepted cancellation cause: immutable, hashable, equal to its dict form.

    ``Cause("user") == {"kind": "user"}`` holds, so code that compares with plain dicts
    keeps working; ``cause["kind"]`` and ``cause.kind`` both read the kind.
    """

    kind: CauseKind

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Cause):
            return other.kind == self.kind
        if isinstance(other, dict):
            return len(other) == 1 and other.get("kind") == self.kind
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        # msgspec.Struct compares != itself (as structs), so without this ``cause != {"kind": ...}``
        # was True even when ``==`` was True too.
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(("Cause", self.kind))

    def __getitem__(self, key: str) -> str:
        if key != "kind":
            raise KeyError(key)
        return self.kind

    def to_dict(self) -> dict[str, str]:
        """A fresh plain-dict copy, for JSON output."""
        return {"kind": self.kind}

    def __repr__(self) -> str:
        return f"Cause({self.kind!r})"


# One shared instance per kind: causes are immutable, so sharing is safe and cheap.
_BY_KIND: Final[dict[str, Cause]] = {k: Cause(k) for k in CAUSE_KINDS}  # type: ignore[arg-type]
USER: Final = _BY_KIND["user"]
PARENT: Final = _BY_KIND["parent"]
DEADLINE: Final = _BY_KIND["deadline"]
MEMORY: Final = _BY_KIND["memory"]
DISPOSED: Final = _BY_KIND["disposed"]


# TURN-CAUSES: causes are strict and closed; the accepted value is detached and frozen.
def validate_cause(value: Any, *, default: Cause | None = USER) -> Cause:
    """Return the detached immutable :class:`Cause` for ``value`` or raise.

    ``None`` means the default (``{"kind": "user"}``). Accepted: a :class:`Cause`, or an exact
    ``dict`` (not a subclass) whose only key is ``"kind"`` with a supported value.

    Raises ``TypeError`` for a value of the wrong type (string, list, exception, class
    instance, dict subclass, non-string keys or kind) and ``ValueError`` for a dict with
    missing or extra keys or an unknown kind.
    """
    if value is None:
        if default is None:
            raise TypeError("a cancellation cause is required")
        return default
    if type(value) is Cause:
        return value
    if type(value) is not dict:
        raise TypeError(
            f"cause must be a dict like {{'kind': 'user'}}, not {type(value).__name__}: {value!r}"
        )
    if any(not isinstance(k, str) for k in value):
        raise TypeError(f"cause keys must be strings: {value!r}")
    if set(value) != {"kind"}:
        extra = sorted(set(value) - {"kind"})
        if extra:
            raise ValueError(f"cause has unexpected keys {extra}: only 'kind' is allowed")
        raise ValueError("cause is missing the key 'kind'")
    kind = value["kind"]
    if type(kind) is not str:
        raise TypeError(f"cause kind must be a string, not {type(kind).__name__}")
    try:
        return _BY_KIND[kind]
    except KeyError:
        raise ValueError(f"unknown cause kind {kind!r}: expected one of {sorted(CAUSE_KINDS)}") from None
