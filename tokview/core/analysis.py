"""One call from a capture to everything derived from it: segments, loss mask, alignment, findings.

The batch command, the store, the exports, the doctor and the UI all go through `analyze`, so a
sample is judged the same way wherever it is looked at.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokview.core import segments as seg
from tokview.core.alignment import Alignment, align, align_with_tool_calls
from tokview.core.finding_context import Context, OutputPieces, output_id_set
from tokview.core.findings import ERROR, Finding, run_checks
from tokview.core.profiles import HARMONY, ModelProfile, with_tokenizer_stops
from tokview.core.record import Capture
from tokview.core.tool_calls import ToolCallsOnIds, parse_tool_calls

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter


@dataclass(frozen=True)
class Analysis:
    segments: tuple[seg.Segment, ...]
    kinds: tuple[str, ...]
    loss_mask: tuple[int, ...]
    alignment: Alignment | None
    """Per id of `capture.aligned_output_ids`: kept / partial / hidden / drift."""
    aligned_kinds: tuple[str, ...]
    """Segment kinds of prompt_ids + aligned_output_ids (== kinds unless a dual capture diverged)."""
    findings: tuple[Finding, ...]

    @property
    def valid(self) -> bool:
        return not any(f.severity == ERROR for f in self.findings)

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def with_recorded(self, stored: Sequence[Finding]) -> Analysis:
        """This analysis plus the stored findings no capture can rebuild (`RECORDED_ONLY`): `tokview proxy` finds
        a session's prefix break from the turns before it, which a re-analysis of one sample does not see."""
        have = set(self.codes)
        extra = tuple(f for f in stored if f.code in RECORDED_ONLY and f.code not in have)
        return dataclasses.replace(self, findings=self.findings + extra) if extra else self


RECORDED_ONLY = frozenset({"session_prefix_break"})
"""Finding codes written when a sample was recorded from what came before it (a proxy session's earlier turns):
shown from the store, since re-analysing the sample alone cannot find them."""


def align_text_fields(
    capture: Capture,
    tokenizer: TokenizerAdapter,
    pieces: OutputPieces | None = None,
    tool_calls: ToolCallsOnIds | None = None,
) -> Alignment | None:
    """Align the returned text fields to the ids they came from (None when no text came back).

    `pieces`: those of `capture.aligned_output_ids`, when the caller has them already. `tool_calls`: the
    calls on those ids (the profile's layout): their ids are aligned to the server's `tool_calls` field
    (`alignment.align_with_tool_calls`), their markers hidden by the tool parser."""
    if not capture.has_text_fields and not capture.tool_calls:
        return None
    if capture.reasoning is not None or capture.content is not None or capture.tool_calls:
        texts = [capture.reasoning, capture.content]
    else:
        texts = [capture.text]
    if pieces is None:
        pieces = OutputPieces.of(capture.aligned_output_ids, tokenizer)
    if tool_calls is None or not tool_calls.found:
        return align(pieces.piece_bytes, texts, pieces.special, special_at=pieces.special_at)
    return align_with_tool_calls(
        pieces.piece_bytes, texts, pieces.special, tool_calls, capture.tool_calls, special_at=pieces.special_at
    )


def tool_calls_of(
    output_ids: Sequence[int],
    profile: ModelProfile,
    tokenizer: TokenizerAdapter | None,
    tools: object = None,
    held: AbstractSet[int] | None = None,
) -> ToolCallsOnIds | None:
    """The profile's tool calls in these ids, with their texts when there is a tokenizer (None: no layout).

    `tools`, the request's: GLM's parser keeps the values of `string` parameters as written (`"75001"` stays text).
    `held`: the set of these ids, when the caller has it: without a marker id in it there is no call, and the
    parser is given no ids (the same empty result, without its pass over the output per marker id)."""
    layout = profile.tool_calls
    if layout is None:
        return None
    if held is not None and held.isdisjoint(layout.marker_ids):
        output_ids = ()
    return parse_tool_calls(output_ids, layout, tokenizer, tools)


def analyze(
    capture: Capture,
    profile: ModelProfile,
    tokenizer: TokenizerAdapter | None = None,
    severities: dict[str, str] | None = None,
    *,
    reencoded: Sequence[int] | None = None,
) -> Analysis:
    """Derive segments, loss mask, alignment and findings from the ids (and the text fields).

    A profile that names no stop ids (`plain` read back by name from a store) takes the tokenizer's.
    `reencoded`: `finding_context.reencode_output(tokenizer, capture.output_ids)` when the caller
    computed it ahead (the batch writer does, on another thread); else the drift check computes it.
    """
    profile = with_tokenizer_stops(profile, tokenizer)
    n_prompt, diverge = len(capture.prompt_ids), capture.paths_diverge
    held = output_id_set(capture.output_ids)  # one pass instead of one per id looked for
    delimiters = seg.delimiter_positions(capture.output_ids, profile, held)
    calls = tool_calls_of(capture.output_ids, profile, tokenizer, capture.settings.get("tools"), held)
    prefill = None if profile.format == HARMONY else seg.prefilled_opener_position(capture.prompt_ids, profile)
    kinds = tuple(seg.token_kinds(capture.prompt_ids, capture.output_ids, profile, delimiters, calls, prefill))
    starts = seg.run_starts(capture.prompt_ids, len(capture.output_ids), profile, delimiters, calls, prefill)
    segments = tuple(seg.segments_from_kinds(kinds, n_prompt, starts))
    # One pass over the output's pieces serves the alignment and the checks that read bytes.
    pieces = OutputPieces.of(capture.output_ids, tokenizer) if tokenizer is not None else None
    tools = capture.settings.get("tools")
    aligned_calls = tool_calls_of(capture.aligned_output_ids, profile, tokenizer, tools) if diverge else calls
    alignment = None
    if tokenizer is not None:
        alignment = align_text_fields(capture, tokenizer, None if diverge else pieces, aligned_calls)
    aligned_kinds, aligned_segments = kinds, None
    if diverge:
        aligned_kinds = tuple(
            seg.token_kinds(
                capture.prompt_ids, capture.aligned_output_ids, profile, tool_calls=aligned_calls, prefill=prefill
            )
        )
        aligned_segments = seg.segments_from_kinds(aligned_kinds, n_prompt)
    ctx = Context(
        capture=capture,
        profile=profile,
        tokenizer=tokenizer,
        segments=segments,
        alignment=alignment,
        aligned_segments=aligned_segments,
        output_pieces=pieces,
        delimiters=delimiters,
        reencoded=reencoded,
        tool_calls=calls,
        aligned_tool_calls=aligned_calls,
        held_output_ids=held,
    )
    return Analysis(
        segments=segments,
        kinds=kinds,
        loss_mask=tuple(seg.loss_mask(capture.prompt_ids, capture.output_ids)),
        alignment=alignment,
        aligned_kinds=aligned_kinds,
        findings=tuple(run_checks(ctx, severities)),
    )
