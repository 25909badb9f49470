"""``Cause`` compares equal to its dict form both ways, with ``==`` and ``!=`` agreeing."""

from __future__ import annotations

import pytest

from wire import CAUSE_KINDS, Cause, validate_cause


@pytest.mark.parametrize("kind", sorted(CAUSE_KINDS))
def test_cause_eq_and_ne_agree(kind: str) -> None:
    """``cause != {"kind": k}`` is the negation of ``==`` (msgspec's struct ``!=`` used to win,
    so a cause was both equal and unequal to its dict)."""
    cause = validate_cause({"kind": kind})
    same, other = {"kind": kind}, {"kind": "user" if kind != "user" else "parent"}
    assert cause == same and cause == same and same == cause
    assert cause != other and cause != other
    assert cause == Cause(kind) and cause == Cause(kind)
    assert cause != {"kind": kind, "extra": 1} and cause != kind and cause != None  # noqa: E711
