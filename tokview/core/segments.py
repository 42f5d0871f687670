"""Segments and loss mask, read off the ids alone.

The reasoning structure of a sample is decided by the delimiter *ids*, never by re-rendered or
decoded text. The rule for the start state is the one vLLM uses (`is_reasoning_end`): if the last
think delimiter in the prompt is the opener, the output starts inside reasoning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


def token_kinds(prompt_ids: Sequence[int], output_ids: Sequence[int], profile: ModelProfile) -> list[str]:
    """The segment kind of every id in prompt_ids + output_ids."""
    kinds = [PROMPT] * len(prompt_ids)
    prefill = prefilled_opener_position(prompt_ids, profile)
    if prefill is not None:
        kinds[prefill] = PREFILLED_OPENER
    in_reasoning = prefill is not None
    stops = set(profile.stop_ids)
    last = len(output_ids) - 1
    for i, tid in enumerate(output_ids):
        if tid == profile.think_open_id:
            kinds.append(OPENER)
            in_reasoning = True
        elif tid == profile.think_close_id:
            kinds.append(CLOSER)
            in_reasoning = False
        elif i == last and tid in stops:
            kinds.append(STOP)
        else:
            kinds.append(REASONING if in_reasoning else ANSWER)
    return kinds


def segment(prompt_ids: Sequence[int], output_ids: Sequence[int], profile: ModelProfile) -> list[Segment]:
    """Consecutive runs of one kind; together they partition prompt_ids + output_ids exactly."""
    return segments_from_kinds(token_kinds(prompt_ids, output_ids, profile), len(prompt_ids))


def segments_from_kinds(kinds: Sequence[str], n_prompt: int) -> list[Segment]:
    segments: list[Segment] = []
    start = 0
    for pos in range(1, len(kinds) + 1):
        # A run also breaks at the prompt/output boundary, so no segment straddles it.
        if pos == len(kinds) or kinds[pos] != kinds[start] or pos == n_prompt:
            segments.append(Segment(kinds[start], start, pos))
            start = pos
    return segments


def loss_mask(prompt_ids: Sequence[int], output_ids: Sequence[int]) -> list[int]:
    """0 over every prompt id (the pre-filled opener included: the model never generated it), 1 over output."""
    return [0] * len(prompt_ids) + [1] * len(output_ids)
