"""Threshold terms in the samples search box: `acc<=2.5` (mean acceptance length), `nll<=1.5` (target NLL).

Why in the search box: the filter bar has no room for two more inputs, and a person already types
there; what is not a threshold term stays the text search. A sample without the measured value does
not pass a threshold (no metrics, not scored), never a guess.
"""

from __future__ import annotations

import re

TERM = re.compile(r"(?i)\b(acc|nll)\s*<=?\s*((?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?)(?![\w.])")
"""`acc<=N`, `nll<=N` (or `<`: the values are measured, not counted, so the two bounds select alike)."""
NEAR = re.compile(r"(?i)\b(?:acc|nll)\s*[<>=!]+\s*\S*")
"""What a person types meaning a threshold that is not one `TERM` reads (`nll>2`, `nll>=2`, `nll<=abc`)."""


def parse_search(text: str) -> tuple[str | None, float | None, float | None]:
    """(text search or None, max acceptance length or None, max mean NLL or None)."""
    limits: dict[str, float] = {}
    for name, value in TERM.findall(text):
        limits[name.lower()] = float(value)
    rest = " ".join(TERM.sub(" ", text).split())
    return rest or None, limits.get("acc"), limits.get("nll")


def unread_threshold(text: str) -> str | None:
    """A threshold-like term `parse_search` would take as text to search for (matching no sample), or None. The
    samples box searches as a person types (`nll<` on the way to `nll<=1`); `tokview review` refuses one."""
    found = NEAR.search(TERM.sub(" ", text))
    return found.group(0) if found else None
