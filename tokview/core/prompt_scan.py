"""What the checks read off every prompt id, read once per prompt prefix.

Two checks read every prompt id: `unknown_token_id` (each id against the vocabulary) and `literal_think_text` (the
bytes of every run of text ids between two ids that spell no text). On an agent's 46,000-id prompt that was 7.5 ms a
request, although all but the newest messages were the previous request's prompt. Both facts are exact on a prefix:
the unknown ids inside a prefix, and the runs that end at a cut inside it, are the same in every prompt that starts
with it. So a long prompt's scan is remembered (`prefix_memo`) with its last cuts as checkpoints, and the next prompt
that starts with it, or with it up to one of those cuts, is read from there on. The checkpoints matter: a harness's
next prompt re-renders the end of the previous one (its generation prompt, and the text run the answer continues).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokview.core import segments as seg
from tokview.core.alignment import true_positions
from tokview.core.prefix_memo import prefix_memo, stands_for

if TYPE_CHECKING:
    from tokview.core.finding_context import Vocabulary
    from tokview.core.tokenizer import TokenizerAdapter

CHECKPOINTS = 4
"""The last cuts a remembered scan can be read at: a generation prompt holds two or three (Kimi's
`<|im_assistant|>`, `<|im_middle|>`, `<think>`), and the next prompt may render any of them otherwise."""

_BYTES_PER_POSITION = 36
"""What a position kept in a scan's tuples costs: the tuple's pointer and the int (a prompt of unknown or special ids
holds nine times its packed ids)."""


@dataclass(frozen=True)
class PromptScan:
    """One prompt's ids as the checks read them."""

    cuts: tuple[int, ...]
    """Positions of the ids that spell no text (the tokenizer's special ids, the profile's delimiters), ascending; none
    are looked for when nothing reads them (no markers and a prompt too short to remember)."""
    unknown: tuple[int, ...]
    """Positions of the ids the vocabulary lacks, ascending."""
    spelled_at: int | None
    """The cut that ends the first run of text ids whose bytes hold a marker; None when no run ending at a cut does
    (the run after the last cut goes on into the output: `literal_think_text` reads it with the output)."""

    @property
    def text_from(self) -> int:
        """Where the prompt's last run of text ids begins (0 when no cuts were looked for)."""
        return self.cuts[-1] + 1 if self.cuts else 0

    def up_to(self, length: int) -> PromptScan:
        """This scan as it reads the prompt's first `length` ids, minus their last run (which a longer prompt
        continues): exact for any prompt that starts with those ids."""
        cuts = self.cuts[: bisect_left(self.cuts, length)]
        start = cuts[-1] + 1 if cuts else 0
        spelled = self.spelled_at if self.spelled_at is not None and self.spelled_at < start else None
        return PromptScan(cuts, self.unknown[: bisect_left(self.unknown, start)], spelled)


def scan_prompt(
    prompt: Sequence[int],
    tokenizer: TokenizerAdapter,
    vocabulary: Vocabulary,
    hidden: frozenset[int],
    markers: tuple[bytes, ...],
    packed: bytes | None,
) -> PromptScan:
    """The scan of `prompt`, read past the longest remembered prompt it starts with. `hidden`: the delimiter ids
    (cuts besides the special ids); `markers`: what a run must not spell; `packed`: `prefix_memo.packed_ids` of
    the prompt (None: too short to remember, read whole)."""
    memo = prefix_memo(tokenizer, ("prompt_scan", markers, hidden)) if packed is not None else None
    found = memo.longest(packed) if memo is not None and packed is not None else None
    known = found[2].up_to(found[0]) if found is not None else PromptScan((), (), None)
    start = known.text_from
    rest = prompt[start:] if start else prompt
    cuts: set[int] = set()
    if markers or memo is not None:  # the runs need them, and the memo's checkpoints
        cuts.update(true_positions(tokenizer.special_flags(rest)))
        for delimiter in hidden:
            cuts.update(seg.positions_of(rest, delimiter))
    new_cuts = sorted(cuts)
    spelled = known.spelled_at
    if spelled is None and markers:
        at = first_spelling_cut(tokenizer.pieces_bytes(rest), new_cuts, markers)
        spelled = None if at is None else start + at
    scan = PromptScan(
        (*known.cuts, *(start + c for c in new_cuts)),
        (*known.unknown, *(start + u for u in vocabulary.unknown_positions(rest))),
        spelled,
    )
    if memo is not None and packed is not None:
        checkpoints = tuple(c + 1 for c in scan.cuts[-CHECKPOINTS:])
        held = (len(scan.cuts) + len(scan.unknown)) * _BYTES_PER_POSITION
        replaces = stands_for(found, packed) if found is not None else None
        memo.remember(packed, scan, checkpoints, replaces=replaces, value_bytes=held)
    return scan


def first_spelling_cut(pieces: Sequence[bytes], cuts: Sequence[int], markers: Sequence[bytes]) -> int | None:
    """The first of `cuts` (sorted) that ends a run of `pieces` whose bytes hold a marker; the run after the last cut
    is read only when `len(pieces)` is among them. Each run is one `join` and its search stays in C."""
    start = 0
    for cut in cuts:
        if cut > start:
            run = b"".join(pieces[start:cut])
            if any(m in run for m in markers):
                return cut
        start = cut + 1
    return None
