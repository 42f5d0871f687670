"""Test argv helpers: defaults a test's own flags replace (a one-value flag given twice is refused by the CLI)."""

from __future__ import annotations

from collections.abc import Sequence


def unless_given(defaults: Sequence[str], given: Sequence[str]) -> list[str]:
    """`defaults` (flag, value pairs) without the flags `given` names."""
    pairs = zip(defaults[::2], defaults[1::2], strict=True)
    return [item for flag, value in pairs if flag not in given for item in (flag, value)]
