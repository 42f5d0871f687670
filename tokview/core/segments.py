"""Segments and loss mask, read off the ids alone.

The reasoning structure of a sample is decided by the delimiter *ids*, never by re-rendered or
decoded text. The rule for the start state is the one vLLM uses (`is_reasoning_end`): if the last
think delimiter in the prompt is the opener, the output starts inside reasoning. The tool calls, by
the profile's layout (`core.tool_calls`), then get kinds of their own over those ids.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import groupby, islice
from types import EllipsisType
from typing import NamedTuple

from tokview.core.harmony import parse_harmony
from tokview.core.prefix_memo import known_packing, last_aligned
from tokview.core.profiles import HARMONY, ModelProfile
from tokview.core.tool_calls import ToolCallsOnIds, parse_tool_calls

PROMPT = "prompt"
PREFILLED_OPENER = "prefilled_opener"
OPENER = "opener"
REASONING = "reasoning"
CLOSER = "closer"
ANSWER = "answer"
STOP = "stop"
TOOL_MARKER = "tool_marker"
"""A marker id of the profile's tool-call layout (section/call begin and end, argument begin): every tool
parser hides it from every text field."""
TOOL_CALL_ID = "tool_call_id"
"""Kimi: the call id text (`functions.NAME:IDX`), returned only as `tool_calls[].id`."""
TOOL_ARGUMENTS = "tool_arguments"
"""The call's arguments (`tool_calls[].function.arguments`); hermes: the whole JSON with the name."""
TOOL_SECTION = "tool_section"
"""Any other id inside the calls' section (whitespace between calls)."""
TOOL_KINDS = (TOOL_MARKER, TOOL_CALL_ID, TOOL_ARGUMENTS, TOOL_SECTION)
HARMONY_HEADER = "harmony_header"
"""Harmony (gpt-oss): an id of a message header (`<|start|>`, the role, `<|channel|>`, the channel name, the
recipient, `<|constrain|>`, the constraint, `<|message|>`)."""
ANALYSIS = "analysis"
COMMENTARY = "commentary"
FINAL = "final"
"""Harmony: the body of an analysis / commentary / final message (vLLM: reasoning / tool calls / content)."""
MESSAGE_END = "message_end"
"""Harmony: a message's end token (`<|end|>`, or a `<|return|>`/`<|call|>` that is not the final stop)."""
HARMONY_KINDS = (HARMONY_HEADER, ANALYSIS, COMMENTARY, FINAL, MESSAGE_END)
SEGMENT_KINDS = (PROMPT, PREFILLED_OPENER, OPENER, REASONING, CLOSER, ANSWER, STOP, *TOOL_KINDS, *HARMONY_KINDS)
_KEPT_OVER_TOOL_KINDS = frozenset((PREFILLED_OPENER, OPENER, CLOSER, STOP))


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
    return prefilled_opener_position(prompt_ids, profile) is not None


def prefilled_opener_position(prompt_ids: Sequence[int], profile: ModelProfile) -> int | None:
    """Position of the opener that the template pre-filled, if the prompt opened reasoning: its last opener,
    when no closer and no stop id (a turn's end: `<|im_end|>`) come after it; an opener a user's message holds
    (text that spells `<think>` is encoded as the opener's id) is followed by that message's end. Each is looked
    for from the end in C (`operator.indexOf`): a Python step per id cost an agent's 46,000-id prompt 0.9 ms,
    twice per analysis. A prompt packed lately (the proxy's: `prefix_memo.known_packing`) is searched in its
    packed bytes instead (`bytes.rfind`: 0.02 ms where `indexOf` took ~1.4 on a recorder's 40,000-id prompt)."""
    packed = known_packing(prompt_ids)
    if packed is not None:
        return _prefilled_in_packed(packed, profile)
    opener = _index_of(reversed(prompt_ids), profile.think_open_id)  # how many ids come after the last opener
    if opener is None:
        return None
    for after in (profile.think_close_id, *profile.stop_ids):
        if _index_of(islice(reversed(prompt_ids), opener), after) is not None:
            return None
    return len(prompt_ids) - 1 - opener


def _prefilled_in_packed(packed: bytes, profile: ModelProfile) -> int | None:
    if profile.think_open_id is None or (opener := last_aligned(packed, profile.think_open_id)) is None:
        return None
    for after in (profile.think_close_id, *profile.stop_ids):
        if after is not None and last_aligned(packed, after, opener + 1) is not None:
            return None
    return opener


def _index_of(ids: Iterable[int], token_id: int | None) -> int | None:
    """Where `token_id` first is in `ids`, found in C; None when it is not there (or is None)."""
    if token_id is None:
        return None
    try:
        return operator.indexOf(ids, token_id)
    except ValueError:
        return None


class DelimiterPositions(NamedTuple):
    """Output positions of the opener id and of the closer id (each found once per capture: the kinds
    and the finding checks both read them)."""

    openers: tuple[int, ...]
    closers: tuple[int, ...]


def delimiter_positions(
    output_ids: Sequence[int], profile: ModelProfile, held: AbstractSet[int] | None = None
) -> DelimiterPositions:
    """`held`: the set of these ids, when the caller has it: a delimiter it lacks is not searched for (each
    search is a pass over the whole output; most answers hold the closer and not the opener)."""
    output = output_ids if isinstance(output_ids, list) else list(output_ids)

    def at(token_id: int | None) -> tuple[int, ...]:
        if held is not None and token_id not in held:
            return ()
        return tuple(positions_of(output, token_id))

    return DelimiterPositions(at(profile.think_open_id), at(profile.think_close_id))


def tool_calls_on_ids(output_ids: Sequence[int], profile: ModelProfile) -> ToolCallsOnIds | None:
    """The profile's tool calls in these ids, spans only (no tokenizer); None when the profile reads none."""
    return None if profile.tool_calls is None else parse_tool_calls(output_ids, profile.tool_calls)


def token_kinds(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    profile: ModelProfile,
    delimiters: DelimiterPositions | None = None,
    tool_calls: ToolCallsOnIds | None = None,
    prefill: int | EllipsisType | None = ...,
) -> list[str]:
    """The segment kind of every id in prompt_ids + output_ids. `prefill`: `prefilled_opener_position` of the
    prompt when the caller has it (found here otherwise: a pass over an agent's whole prompt each time).

    Kinds change only at a think delimiter and at a final stop id, so the delimiters are found with
    `list.index` (or given: `delimiter_positions` of these output ids) and the runs between them filled
    whole: no Python step per id. `tool_calls` (`tool_calls_on_ids` of these output ids, as `analyze`
    passes it): the ids of the calls then get their tool kinds (`paint_tool_kinds`); without it the kinds
    are the reasoning structure alone. A Harmony profile's kinds are its messages' (`harmony_kinds`)."""
    if profile.format == HARMONY:
        return harmony_kinds(prompt_ids, output_ids, profile)
    kinds = [PROMPT] * len(prompt_ids)
    if prefill is ...:
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
    if tool_calls is not None and tool_calls.found:
        paint_tool_kinds(kinds, len(prompt_ids), tool_calls)
    return kinds


def paint_tool_kinds(kinds: list[str], n_prompt: int, calls: ToolCallsOnIds) -> None:
    """Give the ids of the calls their tool kinds; the think delimiters and the final stop keep theirs (the
    reasoning checks read them). Only the few ids of the calls are visited."""

    def paint(span: tuple[int, int] | None, kind: str) -> None:
        if span is None:
            return
        for i in range(n_prompt + span[0], n_prompt + span[1]):
            if kinds[i] not in _KEPT_OVER_TOOL_KINDS:
                kinds[i] = kind

    for section in calls.sections:
        paint(section, TOOL_SECTION)
    for call in calls.calls:
        paint(call.span, TOOL_SECTION)
        paint(call.id_span, TOOL_CALL_ID)
        paint(call.arguments_span, TOOL_ARGUMENTS)
    for pos in calls.markers:
        paint((pos, pos + 1), TOOL_MARKER)


def tool_run_starts(n_prompt: int, calls: ToolCallsOnIds | None) -> set[int]:
    """Every absolute position where a tool kind may begin or end (for `run_starts`)."""
    if calls is None or not calls.found:
        return set()
    spans = [*calls.sections, *(c.span for c in calls.calls)]
    spans += [s for c in calls.calls for s in (c.id_span, c.arguments_span) if s is not None]
    spans += [(p, p + 1) for p in calls.markers]
    return {n_prompt + edge for span in spans for edge in span}


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


def segment(
    prompt_ids: Sequence[int], output_ids: Sequence[int], profile: ModelProfile, *, tool_calls: bool = False
) -> list[Segment]:
    """Consecutive runs of one kind; together they partition prompt_ids + output_ids exactly.

    `tool_calls`: the ids of the profile's tool calls get their own kinds (as `analyze` gives them)."""
    calls = tool_calls_on_ids(output_ids, profile) if tool_calls else None
    return segments_from_kinds(token_kinds(prompt_ids, output_ids, profile, tool_calls=calls), len(prompt_ids))


def run_starts(
    prompt_ids: Sequence[int],
    output_len: int,
    profile: ModelProfile,
    delimiters: DelimiterPositions,
    tool_calls: ToolCallsOnIds | None = None,
    prefill: int | EllipsisType | None = ...,
) -> list[int]:
    """Every position where `token_kinds` may start a new run (and some where it does not): the
    prompt's pre-filled opener and the id after it, each output delimiter and the id after it, the
    output's first and last ids, the edges of the tool calls (`tool_calls`: the parse `token_kinds`
    was given). `segments_from_kinds` looks only there instead of at every id."""
    n = len(prompt_ids)
    if profile.format == HARMONY:
        return list(range(n + output_len))  # Harmony kinds change at every header: every position may start a run
    starts = {0, n, n + output_len - 1}
    starts |= {p for p in tool_run_starts(n, tool_calls) if p < n + output_len}
    if prefill is ...:
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


CHANNEL_KIND = {"analysis": ANALYSIS, "commentary": COMMENTARY, "final": FINAL}


def harmony_kinds(prompt_ids: Sequence[int], output_ids: Sequence[int], profile: ModelProfile) -> list[str]:
    """The segment kind of every id: prompt, header ids, each channel's body, end tokens (the last one a
    stop when it is one of the profile's stop ids)."""
    kinds = [PROMPT] * len(prompt_ids)
    out = output_ids if isinstance(output_ids, list) else list(output_ids)
    body = [HARMONY_HEADER] * len(out)
    for msg in parse_harmony(out):
        kind = CHANNEL_KIND.get(msg.channel or "", COMMENTARY)
        body[msg.body[0] : msg.body[1]] = [kind] * (msg.body[1] - msg.body[0])
        if msg.end_pos is not None:
            body[msg.end_pos] = MESSAGE_END
    if out and out[-1] in profile.stop_ids and body[-1] == MESSAGE_END:
        body[-1] = STOP
    return kinds + body
