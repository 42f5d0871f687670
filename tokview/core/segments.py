"""Segments and loss mask, read off the ids alone.

The reasoning structure of a sample is decided by the delimiter *ids*, never by re-rendered or
decoded text. The rule for the start state is the one vLLM uses (`is_reasoning_end`): if the last
think delimiter in the prompt is the opener, the output starts inside reasoning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import NamedTuple

from tokview.core.profiles import ModelProfile

PROMPT = "prompt"
PREFILLED_OPENER = "prefilled_opener"
OPENER = "opener"
REASONING = "reasoning"
CLOSER = "closer"
ANSWER = "answer"
STOP = "stop"
SEGMENT_KINDS = (PROMPT, PREFILLED_OPENER, OPENER, REASONING, CLOSER, ANSWER, STOP)


@dataclass(frozen=True)
class Segment:
    """A run of ids of one kind: positions [start, end) in prompt_ids + output_ids."""

    kind: str
    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start


def prompt_opens_reasoning(prompt_ids: Sequence[int], profile: ModelProfile) -> bool:
    """True when the last think delimiter in the prompt is the opener (the template pre-filled it)."""
    open_id, close_id = profile.think_open_id, profile.think_close_id
    for tid in reversed(prompt_ids):
        if tid == open_id:
            return True
        if tid == close_id:
            return False
    return False


def prefilled_opener_position(prompt_ids: Sequence[int], profile: ModelProfile) -> int | None:
    """Position of the opener that the template pre-filled, if the prompt opened reasoning."""
    if not prompt_opens_reasoning(prompt_ids, profile):
        return None
    for pos in range(len(prompt_ids) - 1, -1, -1):
        if prompt_ids[pos] == profile.think_open_id:
            return pos
    return None


class DelimiterPositions(NamedTuple):
    """Output positions of the opener id and of the closer id (each found once per capture: the kinds
    and the finding checks both read them)."""

    openers: tuple[int, ...]
    closers: tuple[int, ...]


def delimiter_positions(output_ids: Sequence[int], profile: ModelProfile) -> DelimiterPositions:
    output = output_ids if isinstance(output_ids, list) else list(output_ids)
    return DelimiterPositions(
        tuple(positions_of(output, profile.think_open_id)), tuple(positions_of(output, profile.think_close_id))
    )


def token_kinds(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    profile: ModelProfile,
    delimiters: DelimiterPositions | None = None,
) -> list[str]:
    """The segment kind of every id in prompt_ids + output_ids.

    Kinds change only at a think delimiter and at a final stop id, so the delimiters are found with
    `list.index` (or given: `delimiter_positions` of these output ids) and the runs between them
    filled whole: no Python step per id."""
    kinds = [PROMPT] * len(prompt_ids)
    prefill = prefilled_opener_position(prompt_ids, profile)
    if prefill is not None:
        kinds[prefill] = PREFILLED_OPENER
    output = output_ids if isinstance(output_ids, list) else list(output_ids)
    if delimiters is None:
        delimiters = delimiter_positions(output, profile)
    marks = dict.fromkeys(delimiters.closers, CLOSER)
    marks.update(dict.fromkeys(delimiters.openers, OPENER))  # the opener wins a tie
    in_reasoning = prefill is not None
    done = 0
    for pos, kind in sorted(marks.items()):
        kinds += [REASONING if in_reasoning else ANSWER] * (pos - done)
        kinds.append(kind)
        in_reasoning, done = kind == OPENER, pos + 1
    kinds += [REASONING if in_reasoning else ANSWER] * (len(output) - done)
    if output and done < len(output) and output[-1] in profile.stop_ids:
        kinds[-1] = STOP
    return kinds


def positions_of(ids: Sequence[int], token_id: int | None) -> list[int]:
    """Every index of one id (none for None), found with `list.index`, so a rare id costs no Python loop."""
    found: list[int] = []
    if token_id is None:
        return found
    ids = ids if isinstance(ids, list) else list(ids)
    at = -1
    try:
        while True:
            at = ids.index(token_id, at + 1)
            found.append(at)
    except ValueError:
        return found


def segment(prompt_ids: Sequence[int], output_ids: Sequence[int], profile: ModelProfile) -> list[Segment]:
    """Consecutive runs of one kind; together they partition prompt_ids + output_ids exactly."""
    return segments_from_kinds(token_kinds(prompt_ids, output_ids, profile), len(prompt_ids))


def run_starts(
    prompt_ids: Sequence[int], output_len: int, profile: ModelProfile, delimiters: DelimiterPositions
) -> list[int]:
    """Every position where `token_kinds` may start a new run (and some where it does not): the
    prompt's pre-filled opener and the id after it, each output delimiter and the id after it, the
    output's first and last ids. `segments_from_kinds` looks only there instead of at every id."""
    n = len(prompt_ids)
    starts = {0, n, n + output_len - 1}
    prefill = prefilled_opener_position(prompt_ids, profile)
    if prefill is not None:
        starts.update((prefill, prefill + 1))
    for pos in (*delimiters.openers, *delimiters.closers):
        starts.update((n + pos, n + pos + 1))
    return sorted(starts)


def segments_from_kinds(kinds: Sequence[str], n_prompt: int, starts: Sequence[int] | None = None) -> list[Segment]:
    """Consecutive runs of one kind; none straddles the prompt/output boundary.

    `starts`: sorted positions that include every position where a run begins (`run_starts`); the
    runs are then read off those few positions. Without them `itertools.groupby` finds the runs in C."""
    if starts is not None:
        return _segments_at(kinds, n_prompt, starts)
    segments: list[Segment] = []
    for start, part in ((0, kinds[:n_prompt]), (n_prompt, kinds[n_prompt:])):
        for kind, run in groupby(part):
            end = start + len(list(run))
            segments.append(Segment(kind, start, end))
            start = end
    return segments


def _segments_at(kinds: Sequence[str], n_prompt: int, starts: Sequence[int]) -> list[Segment]:
    segments: list[Segment] = []
    bounds = [p for p in starts if 0 < p < len(kinds)]
    begin = 0
    for end in [*bounds, len(kinds)]:
        if end <= begin:
            continue
        kind = kinds[begin]
        if segments and segments[-1].kind == kind and begin != n_prompt:
            segments[-1] = Segment(kind, segments[-1].start, end)
        else:
            segments.append(Segment(kind, begin, end))
        begin = end
    return segments


def loss_mask(prompt_ids: Sequence[int], output_ids: Sequence[int]) -> list[int]:
    """0 over every prompt id (the pre-filled opener included: the model never generated it), 1 over output."""
    return [0] * len(prompt_ids) + [1] * len(output_ids)
