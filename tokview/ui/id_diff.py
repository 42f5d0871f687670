"""Where two id sequences differ: the first divergence and the positions to mark (compare screen).

Textual-free, so it is tested exactly. Position by position after the common prefix would mark everything
once one sample drifts by an id; a sequence diff marks what really differs, but `difflib` costs worse than
quadratic time on two texts that differ throughout (two 19,000-id answers took 100 s, in a worker that quitting the
app then waited for). So the common prefix and suffix are cut off first, and only a middle of at most `DIFF_WORK`
id pairs is diffed; past that each pane marks its whole middle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

DIFF_WORK = 4_000_000
"""The most (left middle × right middle) ids diffed: two 2,000-id middles, ~0.1 s on one core."""


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
    tail = 0  # the common suffix, never into the common prefix
    while tail < min(len(a), len(b)) - first and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    a_end, b_end = len(a) - tail, len(b) - tail
    if (a_end - first) * (b_end - first) > DIFF_WORK:
        return IdDiff(first, frozenset(range(first, a_end)), frozenset(range(first, b_end)))
    left: set[int] = set()
    right: set[int] = set()
    matcher = SequenceMatcher(None, a[first:a_end], b[first:b_end], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            left.update(range(first + i1, first + i2))
            right.update(range(first + j1, first + j2))
    return IdDiff(first, frozenset(left), frozenset(right))
