"""What the finding checks read about one capture, given once and never written by a check.

`analyze` hands over what it computed anyway (segments, the alignment of the text fields). The
facts several checks share (where the closers are, whether reasoning is open at the end, the
reasoning/answer split decoded from the ids) are derived on first use and kept by
`functools.cached_property`: each is computed at most once per capture, only by the context itself,
and only for the captures whose checks ask for it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import cached_property
from itertools import compress, count, islice
from operator import ne
from typing import TYPE_CHECKING, Any

from tokview.core import segments as seg
from tokview.core.alignment import Alignment, true_positions
from tokview.core.prefix_memo import packed_ids
from tokview.core.profiles import ModelProfile
from tokview.core.prompt_scan import PromptScan, scan_prompt
from tokview.core.record import Capture
from tokview.core.served_messages import messages_as_served
from tokview.core.served_tools import tools_as_served
from tokview.core.sglang_prefill import last_assistant
from tokview.core.tool_calls import ToolCallsOnIds

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

# Every byte but the visible ASCII ones (0x21-0x7e): what `bytes.translate` deletes to find a visible one.
_NOT_VISIBLE_ASCII = bytes(b for b in range(256) if not 0x21 <= b <= 0x7E)
_BLANK_PROBE = 64
"""How many ids `Context.blank` looks at for a visible character before it decodes them all."""


@dataclass(frozen=True)
class Vocabulary:
    """Which ids a tokenizer has: 0 … size-1 (its length), and any id past that it names itself.

    Reading the whole id table to find gaps cost the first analysis of every run 0.12–0.17 s (a 160k-entry
    dict built from Rust), enough to hold the first sample of a small batch back by a landing. The length is
    cached, and an id at or past it (999999 from a gateway, a negative id) is looked up one by one: exact
    for every id past the length. A vocabulary with a gap under its length (ids that run past their count)
    is taken at its word below it."""

    size: int
    """The tokenizer's length: every id under it is taken as the tokenizer's."""
    has_id: Callable[[int], bool]
    """Whether the tokenizer names this id: asked only of ids at or past `size`."""
    logits_size: int = 0
    """The model's vocabulary when it pads the tokenizer's (`TokenizerAdapter.model_vocab_size`): a top-K
    alternative under it is a row of the target's logits, which a distillation trainer indexes, though no text."""

    def unknown_positions(self, ids: Sequence[int], held: AbstractSet[int] | None = None) -> list[int]:
        """Positions of the ids this vocabulary lacks. Two C-level passes (`min`, `max`) settle the usual
        case of none; only then is each id looked at. `held`: the set of these ids, when the caller has it
        (then `min` and `max` pass over its few hundred distinct ids, not the thousands of the list)."""
        if not ids:
            return []
        size = self.size
        values = ids if held is None else held
        if min(values) >= 0 and max(values) < size:
            return []
        return [i for i, t in enumerate(ids) if not 0 <= t < size and (t < 0 or not self.has_id(t))]


_vocabularies: weakref.WeakKeyDictionary[object, Vocabulary] = weakref.WeakKeyDictionary()


def vocabulary_of(tokenizer: TokenizerAdapter) -> Vocabulary:
    """The tokenizer's ids, its length read once per tokenizer (cached by the adapter)."""
    known = _vocabularies.get(tokenizer)
    if known is None:
        known = _vocabularies[tokenizer] = Vocabulary(
            tokenizer.vocab_size, tokenizer.has_id, getattr(tokenizer, "model_vocab_size", 0)
        )
    return known


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two id sequences differ, the shorter length when one is a prefix of the
    other, None when they are equal. Walks both in C (`map`/`compress`) and stops at the difference;
    two equal lists (the common case: a drift check that finds none) are told by `==` alone, faster still."""
    if type(a) is list and type(b) is list and a == b:
        return None
    first = next(compress(count(), map(ne, a, b)), None)
    if first is None and len(a) != len(b):
        return min(len(a), len(b))
    return first


def reencode_output(tokenizer: TokenizerAdapter, output_ids: Sequence[int]) -> list[int]:
    """encode(decode(output_ids)): the ids a pipeline that keeps text instead of ids would train on.

    The drift check compares them with the served ids. It is the costliest step of an analysis (a
    2,000-id answer: ~0.45 ms in Rust, as much as every other check together), and it reads nothing
    but the ids, so the batch writer starts it on another thread as soon as a capture is handed over
    and passes the result to `analyze`."""
    return tokenizer.encode(tokenizer.decode(output_ids))


def output_id_set(ids: Sequence[int]) -> AbstractSet[int] | None:
    """The distinct ids of an output, built in one C-level pass: what lets `analyze` skip the passes that
    look for an id the output does not hold (the tool-call markers, a delimiter) and find the smallest and
    largest id among a few hundred values. None for ids a set cannot hold (they then take the passes)."""
    try:
        return set(ids)
    except TypeError:
        return None


@dataclass(frozen=True, eq=False)
class OutputPieces:
    """Per output id: the bytes it stands for and whether it is a special id (one tokenizer pass)."""

    piece_bytes: Sequence[bytes]
    special: Sequence[bool]

    @classmethod
    def of(cls, ids: Sequence[int], tokenizer: TokenizerAdapter) -> OutputPieces:
        return cls(tokenizer.pieces_bytes(ids), tokenizer.special_flags(ids))  # one C-level pass each

    @cached_property
    def special_at(self) -> list[int]:
        """Positions of the special ids, in order (the alignment and `literal_think_text` both cut there)."""
        return true_positions(self.special)


def cut_by_length(finish_reason: str | None, output_ids: Sequence[int], stop_ids: Sequence[int]) -> bool:
    """`finish_reason` length, and the output does not end with a stop id: SGLang (and older vLLM) check the length
    before the stop id, so a turn whose stop id was its last allowed id says `length` too (`truncated` and a chain's
    next turn read it)."""
    return finish_reason == "length" and (not output_ids or output_ids[-1] not in stop_ids)


@dataclass(frozen=True, eq=False)
class Context:
    """One capture as the checks see it. Positions are absolute (into prompt_ids + output_ids) unless a
    name says `out`: those are output-relative."""

    capture: Capture
    profile: ModelProfile
    tokenizer: TokenizerAdapter | None
    segments: Sequence[seg.Segment]
    """Runs of one kind over prompt_ids + output_ids (`segments.segments_from_kinds`)."""
    alignment: Alignment | None = None
    """Per id of `capture.aligned_output_ids`: kept / partial / hidden / drift (None without text fields)."""
    aligned_segments: Sequence[seg.Segment] | None = None
    """Segments of prompt_ids + aligned_output_ids; None when they are `segments` (no divergent dual capture)."""
    output_pieces: OutputPieces | None = None
    """The output ids' pieces, when `analyze` made them for the alignment (else made on first use)."""
    delimiters: seg.DelimiterPositions | None = None
    """Where the output holds the opener and closer, when `analyze` found them for the kinds (else found on first use)."""
    reencoded: Sequence[int] | None = None
    """`reencode_output` of the output ids, when the caller made it ahead (else made on first use)."""
    tool_calls: ToolCallsOnIds | None = None
    """The profile's tool calls on the output ids, with their texts (None: the profile has no layout)."""
    aligned_tool_calls: ToolCallsOnIds | None = None
    """The same of the aligned ids (the parsed path's in a diverged dual capture); None: `tool_calls`."""
    held_output_ids: AbstractSet[int] | None = None
    """The set of the output ids, when `analyze` made it (`output_id_set`); else the checks pass over the list."""

    # -- what analyze gave, in the checks' words -------------------------------------------------
    @property
    def output(self) -> list[int]:
        return self.capture.output_ids

    @cached_property
    def n_prompt(self) -> int:
        return len(self.capture.prompt_ids)

    @cached_property
    def paths_diverge(self) -> bool:
        return self.capture.paths_diverge

    def output_runs(self, *kinds: str, aligned: bool = False) -> list[seg.Segment]:
        """The output's runs of these kinds, in order (of the aligned ids' segments when `aligned`)."""
        runs = self.aligned_segments if aligned and self.aligned_segments is not None else self.segments
        return [s for s in runs if s.kind in kinds and s.start >= self.n_prompt]

    def ids_of(self, ids: Sequence[int], runs: Sequence[seg.Segment], before: int | None = None) -> list[int]:
        """The ids of `ids` (output ids) under these runs, up to output position `before`."""
        end = len(ids) if before is None else before
        out: list[int] = []
        for s in runs:
            out += ids[s.start - self.n_prompt : min(s.end - self.n_prompt, end)]
        return out

    # -- shared facts, each computed once ----------------------------------------------------------
    @cached_property
    def out_closers(self) -> tuple[int, ...]:
        """Output positions of the closer id."""
        return self._delimiters.closers

    @cached_property
    def out_openers(self) -> tuple[int, ...]:
        """Output positions of the opener id."""
        return self._delimiters.openers

    @cached_property
    def _delimiters(self) -> seg.DelimiterPositions:
        if self.delimiters is not None:
            return self.delimiters
        return seg.delimiter_positions(self.output, self.profile, self.held_output_ids)

    @cached_property
    def prefilled_opener(self) -> int | None:
        """Position of the opener the template pre-filled in the prompt, if it did."""
        return next((s.start for s in self.segments if s.kind == seg.PREFILLED_OPENER), None)

    @cached_property
    def reasoning_opened(self) -> bool:
        """The prompt pre-filled the opener or the output emitted one."""
        return self.prefilled_opener is not None or bool(self.out_openers)

    @cached_property
    def cut_by_length(self) -> bool:
        return cut_by_length(self.capture.finish_reason, self.output, self.profile.stop_ids)

    @cached_property
    def open_at_end(self) -> bool:
        """True when the last think delimiter seen (prompt opener or output delimiter) opened reasoning."""
        for s in reversed(self.segments):
            if s.kind in (seg.OPENER, seg.PREFILLED_OPENER):
                return True
            if s.kind == seg.CLOSER:
                return False
        return False

    @cached_property
    def pieces(self) -> OutputPieces | None:
        """The output ids' bytes and special flags; None without a tokenizer."""
        if self.output_pieces is not None or self.tokenizer is None:
            return self.output_pieces
        return OutputPieces.of(self.output, self.tokenizer)

    @cached_property
    def reencoded_output(self) -> list[int] | None:
        """`reencode_output` of the output ids: the caller's, else computed here; None without a tokenizer."""
        if self.reencoded is not None:
            return list(self.reencoded)
        if self.tokenizer is None:
            return None
        return reencode_output(self.tokenizer, self.output)

    @cached_property
    def calls(self) -> ToolCallsOnIds | None:
        """The tool calls on the output ids, when there are any (None: no layout or no marker)."""
        return self.tool_calls if self.tool_calls is not None and self.tool_calls.found else None

    @cached_property
    def id_split(self) -> tuple[str, str] | None:
        """(reasoning text, answer text) as the aligned ids split them, stripped; None without a tokenizer."""
        if self.tokenizer is None:
            return None
        ids = self.capture.aligned_output_ids
        reasoning = self.ids_of(ids, self.output_runs(seg.REASONING, aligned=True))
        answer = self.ids_of(ids, self.output_runs(seg.ANSWER, aligned=True))
        return (
            self.tokenizer.decode(reasoning, skip_special_tokens=True).strip(),
            self.tokenizer.decode(answer, skip_special_tokens=True).strip(),
        )

    @cached_property
    def unknown_ids(self) -> list[int]:
        """Absolute positions of the prompt and output ids the tokenizer does not have (none without one)."""
        if self.tokenizer is None:
            return []
        vocabulary = vocabulary_of(self.tokenizer)
        prompt = list(self.prompt_scan.unknown) if self.prompt_scan is not None else []
        return prompt + [self.n_prompt + i for i in vocabulary.unknown_positions(self.output, self.held_output_ids)]

    @cached_property
    def prompt_scan(self) -> PromptScan | None:
        """The prompt's cuts, unknown ids and spelled markers, read past the longest prompt it extends that was
        read before (`core.prompt_scan`); None without a tokenizer."""
        if self.tokenizer is None:
            return None
        prompt, vocabulary = self.capture.prompt_ids, vocabulary_of(self.tokenizer)
        hidden, markers = self.profile.delimiter_ids, self.think_markers
        return scan_prompt(prompt, self.tokenizer, vocabulary, hidden, markers, packed_ids(prompt))

    @cached_property
    def think_markers(self) -> tuple[bytes, ...]:
        """The profile's think opener and closer as bytes: what `literal_think_text` must not find spelled in text
        (the prompt scan looks for the same)."""
        return tuple(m.encode() for m in (self.profile.think_open, self.profile.think_close) if m)

    @cached_property
    def local_render(self) -> list[int] | Exception | None:
        """The prompt ids this tokenizer renders for the capture's messages with the kwargs it recorded; the error
        when the template cannot render them; None when there is nothing to render. Rendered once for the checks
        that compare it (`prompt_render_mismatch`, `prompt_date_mismatch`)."""
        c, tok = self.capture, self.tokenizer
        if tok is None or not c.messages or not tok.chat_template:
            return None
        # a request may ask for the render without the assistant's header (vLLM's `add_generation_prompt`), or to go
        # on from the assistant's own start (`continue_final_message`, a prefill): the proxy records both
        continued = c.settings.get("continue_final_message") is True
        header = c.settings.get("add_generation_prompt") is not False and not continued
        kwargs = template_kwargs_of(self)
        served = messages_as_served(c.messages, c.server_kind, tok.chat_template)  # text parts joined, nulls as served
        try:
            if c.server_kind == "sglang":  # SGLang's own reading of a last assistant message (`sglang_prefill`)
                messages, prefix = last_assistant(served, continued)
                ids = tok.render(messages, add_generation_prompt=True, template_kwargs=kwargs)
                return ids + tok.encode(prefix) if prefix is not None else ids
            return tok.render(
                served, add_generation_prompt=header, template_kwargs=kwargs, continue_final_message=continued
            )
        except Exception as exc:  # a broken template is itself a mismatch worth showing
            return exc

    @cached_property
    def render_difference(self) -> int | None:
        """`first_difference` of the local render and the served prompt ids (None when they are equal or there is
        no render): read by `prompt_render_mismatch` and `prompt_date_mismatch`, compared once (an agent's
        40,000-id prompt: ~1 ms a comparison)."""
        local = self.local_render
        return first_difference(local, self.capture.prompt_ids) if isinstance(local, list) else None

    # -- words for the details ---------------------------------------------------------------------
    def name(self, token_id: int) -> str:
        if self.tokenizer is None:
            return str(token_id)
        return f"{token_id} {self.tokenizer.piece_text(token_id)!r}"

    def where(self, out_pos: int) -> str:
        return f"output[{out_pos}] (position {self.n_prompt + out_pos})"

    def blank(self, ids: Sequence[int]) -> bool:
        """True when the ids read as nothing but whitespace (special ids skipped): none at all, or, with a
        tokenizer, a blank decode. Without a tokenizer any id counts as text.

        An id the decode keeps whose bytes hold a visible ASCII character makes the text non-blank
        whatever surrounds it, so the first few ids usually settle it without decoding thousands."""
        if not ids:
            return True
        tok = self.tokenizer
        if tok is None:
            return False
        for tid in islice(ids, _BLANK_PROBE):
            if not tok.is_special(tid) and tok.piece_bytes(tid).translate(None, _NOT_VISIBLE_ASCII):
                return False
        return not tok.decode(ids, skip_special_tokens=True).strip()


def template_kwargs_of(ctx: Context) -> dict[str, Any]:
    """The template kwargs the capture's prompt was rendered with: those it recorded, else its profile's for its
    thinking setting, and the request's `tools` as its server renders them (`core.served_tools`), as HF's `tools`
    argument."""
    c = ctx.capture
    kwargs = c.settings.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = ctx.profile.template_kwargs(c.thinking)
    tools = tools_as_served(c.settings.get("tools"), c.server_kind, c.settings.get("tool_choice"))
    return {**kwargs, "tools": tools} if tools else kwargs
