"""Where two id sequences differ: the first divergence and the positions to mark (compare screen).

Textual-free, so it is tested exactly. Position by position after the common prefix would mark everything
once one sample drifts by an id; a sequence diff marks what really differs, but costs quadratic time in the
worst case, so past `DIFF_LIMIT` ids a pane marks everything from the first divergence on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

DIFF_LIMIT = 20_000


@dataclass(frozen=True)
class IdDiff:
    first: int | None
    """The first index where the sequences differ (one ends early counts); None when they are equal."""
    left: frozenset[int]
    right: frozenset[int]
    """Indices of each side that the other side does not have."""


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def diff_ids(a: Sequence[int], b: Sequence[int]) -> IdDiff:
    first = first_divergence(a, b)
    if first is None:
        return IdDiff(None, frozenset(), frozenset())
    if max(len(a), len(b)) > DIFF_LIMIT:
        return IdDiff(first, frozenset(range(first, len(a))), frozenset(range(first, len(b))))
    left: set[int] = set()
    right: set[int] = set()
    matcher = SequenceMatcher(None, a[first:], b[first:], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            left.update(range(first + i1, first + i2))
            right.update(range(first + j1, first + j2))
    return IdDiff(first, frozenset(left), frozenset(right))
