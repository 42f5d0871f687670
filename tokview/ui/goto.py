"""Go to a position, an id or a text inside one sample: what `:` in inspect asks for and where it lands.

Why its own module: the parsing and the search are plain data work over a pane's `TokenSeq` (no Textual),
so they are tested exactly, and the screen only prompts, moves the cursor and says what it found.

    120         the token at absolute position 120 (the detail panel's "position")
    #163607     the next token with id 163607 after the cursor (round to the start); "id 163607" too
    let me      the next token where the text "let me" starts (case-insensitive), round to the start
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from tokview.ui.display import TokenSeq, visible

_ID = re.compile(r"^(?:#|id[\s:=]*)(\d+)$", re.IGNORECASE)


@dataclass(frozen=True)
class Target:
    kind: Literal["position", "id", "text"]
    value: str

    def describe(self) -> str:
        return {"position": f"position {self.value}", "id": f"id {self.value}", "text": f"text {self.value!r}"}[
            self.kind
        ]


def parse(query: str) -> Target | None:
    """What the typed query asks for; None for a blank one."""
    text = query.strip()
    if not text:
        return None
    if text.isdecimal():  # int() reads these; "²" is a digit it refuses
        return Target("position", text)
    match = _ID.match(text)
    if match:
        return Target("id", match.group(1))
    return Target("text", query.strip("\n"))


def find(seq: TokenSeq, target: Target, cursor: int) -> int | None:
    """The token the target names: a position as is (None past the end), an id or a text at its next
    occurrence after `cursor`, round to the start (the cursor's own token last)."""
    n = len(seq)
    if n == 0:
        return None
    if target.kind == "position":
        index = int(target.value)
        return index if index < n else None
    order = [*range(cursor + 1, n), *range(0, cursor + 1)]
    if target.kind == "id":
        wanted = int(target.value)
        return next((i for i in order if seq.ids[i] == wanted), None)
    return _find_text(seq, target.value, order)


def _find_text(seq: TokenSeq, text: str, order: list[int]) -> int | None:
    """The first token in `order` where `text` starts, matched on the pane's visible pieces ("let me" is
    "let·me" there), so a match can span tokens."""
    needle = visible(text).lower()
    starts, pieces = [], []
    at = 0
    for piece in seq.pieces:
        starts.append(at)
        pieces.append(piece.lower())
        at += len(piece)
    joined = "".join(pieces)
    hits: set[int] = set()
    offset = joined.find(needle)
    while offset != -1:
        hits.add(_token_at(starts, offset))
        offset = joined.find(needle, offset + 1)
    return next((i for i in order if i in hits), None)


def _token_at(starts: list[int], offset: int) -> int:
    from bisect import bisect_right

    return bisect_right(starts, offset) - 1
