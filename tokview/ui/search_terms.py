"""Threshold terms in the samples search box: `acc<=2.5` (mean acceptance length), `nll<=1.5` (target NLL).

Why in the search box: the filter bar has no room for two more inputs, and a person already types
there; what is not a threshold term stays the text search. A sample without the measured value does
not pass a threshold (no metrics, not scored), never a guess.
"""

from __future__ import annotations

import re

TERM = re.compile(r"(?i)\b(acc|nll)\s*<=\s*(\d+(?:\.\d*)?|\.\d+)")


def parse_search(text: str) -> tuple[str | None, float | None, float | None]:
    """(text search or None, max acceptance length or None, max mean NLL or None)."""
    limits: dict[str, float] = {}
    for name, value in TERM.findall(text):
        limits[name.lower()] = float(value)
    rest = " ".join(TERM.sub(" ", text).split())
    return rest or None, limits.get("acc"), limits.get("nll")
