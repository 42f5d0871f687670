"""What a token pane shows, as flat arrays: display text, cell width and a style class per token.

Why flat arrays: a 32,000-token sample must wrap in a few milliseconds and repaint one line at a
time, so the token view never walks objects per token. This module holds no Textual code; it is the
part of the UI that tests can check exactly (visible whitespace, which ids are think delimiters,
what the parser hid) without running an app.
"""

from __future__ import annotations

import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING

from rich.cells import cell_len, get_character_cell_size, set_cell_size

from tokview.core import segments as seg
from tokview.core.alignment import DRIFT, HIDDEN, KEPT, PARTIAL
from tokview.core.profiles import HERMES
from tokview.core.tool_calls import field_name
from tokview.untrusted_text import printable, printable_line

if TYPE_CHECKING:
    from rich.text import Text
    from textual.content import Content

    from tokview.core.analysis import Analysis
    from tokview.core.record import Capture
    from tokview.core.tokenizer import TokenizerAdapter

VIEW_MODES = ("pieces", "ids", "both")


# Style classes: each maps to a component class `token-view--<name>` themed in CSS.
PROMPT, PROMPT_SPECIAL, DELIMITER, REASONING, ANSWER, STOP, SPECIAL = (
    "prompt",
    "prompt-special",
    "delimiter",
    "reasoning",
    "answer",
    "stop",
    "special",
)
GAP, PARTIAL_CLS, DRIFT_CLS, EMPTY = "gap", "partial", "drift", "empty"
TOOL_MARKER_CLS, TOOL_ID, TOOL_ARGS, COMMENTARY_CLS, HEADER = (
    "tool-marker",
    "tool-id",
    "tool-args",
    "commentary",
    "header",
)
"""A tool call's markers, its id text and its arguments (issue 23: the ids a tool parser turns into the
`tool_calls` field, told apart from the answer); Harmony's commentary channel and its message headers."""
HEAT_CLASSES = tuple(f"heat-{level}" for level in range(5))
"""The inspect heat view (ui/heat.py): 0 easy/likely … 4 hard/unlikely."""
STYLE_CLASSES = (
    PROMPT,
    PROMPT_SPECIAL,
    DELIMITER,
    REASONING,
    ANSWER,
    STOP,
    SPECIAL,
    GAP,
    PARTIAL_CLS,
    DRIFT_CLS,
    EMPTY,
    *HEAT_CLASSES,
    TOOL_MARKER_CLS,
    TOOL_ID,
    TOOL_ARGS,
    COMMENTARY_CLS,
    HEADER,
)
CLASS_INDEX = {name: i for i, name in enumerate(STYLE_CLASSES)}

_VISIBLE = {" ": "·", "\n": "↵", "\t": "⇥", "\r": "␍", "\x7f": "␡", "\u00a0": "⍽"}
GAP_CHAR = "░"


def visible(text: str) -> str:
    """Whitespace and control characters as visible glyphs; a raw \\t or \\r would corrupt a line. C1
    controls (a byte-level token can decode to U+009B, CSI) and lone surrogates (which no terminal can be
    sent) are shown as escapes by `printable`."""
    out = []
    last = len(text) - 1
    for k, ch in enumerate(text):
        mapped = _VISIBLE.get(ch)
        category = unicodedata.category(ch)
        if mapped is not None:
            out.append(mapped)
        elif ord(ch) < 0x20:
            out.append(chr(0x2400 + ord(ch)))  # ␀ ␁ … ␟
        elif category in _LINE_SEPARATORS or (category == "Cf" and (k == 0 or k == last)):
            out.append(_named(ch))
        else:
            out.append(ch)
    shown = printable("".join(out))
    if shown and unicodedata.combining(shown[0]):
        shown = "◌" + shown  # a token that starts with a combining mark: drawn on its own, not onto the token before
    if shown and not cell_len(shown):  # a variation selector, a skin tone alone: 0 cells, the token and cursor unseen
        shown = "".join(_named(ch) if not cell_len(ch) else ch for ch in shown)
    return shown or "∅"


def _named(ch: str) -> str:
    return f"‹U+{ord(ch):04X}›"


_LINE_SEPARATORS = frozenset({"Zl", "Zp"})
"""U+2028 and U+2029, named wherever they are (a terminal may break the line there). Other format characters (ZWJ,
ZWSP, a BOM, direction marks) are named at a token's edges: one alone drew in 0 cells, and one that begins a token
made the whole token 0 cells wide to the layout; inside a token (a ZWJ in an emoji sequence, a ZWNJ in a Persian
word) it draws as the text it joins."""


@dataclass
class TokenSeq:
    """One pane's tokens: ids, display pieces, style class per token, and per-token facts for the detail panel."""

    ids: list[int]
    pieces: list[str]
    classes: list[int]
    n_prompt: int
    breaks_after: list[bool] = field(default_factory=list)
    """True where the piece ends in a newline: pieces mode starts a new row after it."""
    status: list[str | None] = field(default_factory=list)
    """Alignment status per token (None for prompt tokens or when no text fields came back)."""
    fields: list[str] = field(default_factory=list)
    """The right pane: the text field that kept each token (`reasoning`, `tool_calls[0].id`…), "" if none."""

    def __len__(self) -> int:
        return len(self.ids)


_BY_KIND = {
    seg.PREFILLED_OPENER: DELIMITER,
    seg.OPENER: DELIMITER,
    seg.CLOSER: DELIMITER,
    seg.STOP: STOP,
    seg.TOOL_MARKER: TOOL_MARKER_CLS,
    seg.TOOL_CALL_ID: TOOL_ID,
    seg.TOOL_ARGUMENTS: TOOL_ARGS,
    seg.TOOL_SECTION: HEADER,
    seg.HARMONY_HEADER: HEADER,
    seg.MESSAGE_END: DELIMITER,
}
"""Kinds painted the same whether their ids are special or not (a marker, a header, a delimiter)."""
_BODY = {seg.REASONING: REASONING, seg.ANALYSIS: REASONING, seg.COMMENTARY: COMMENTARY_CLS, seg.FINAL: ANSWER}
"""Message bodies (a special id inside one shows as special): Harmony's analysis is the reasoning, final the
answer."""


def _class_for(kind: str, special: bool) -> int:
    if kind == seg.PROMPT:
        return CLASS_INDEX[PROMPT_SPECIAL if special else PROMPT]
    if kind in _BY_KIND:
        return CLASS_INDEX[_BY_KIND[kind]]
    if special:
        return CLASS_INDEX[SPECIAL]
    return CLASS_INDEX[_BODY.get(kind, ANSWER)]


def _kept_class(field_index: int) -> int:
    """The class of an id a text field kept: reasoning, content, or a server call's id / arguments."""
    if field_index >= 2:
        return CLASS_INDEX[TOOL_ID if field_index % 2 == 0 else TOOL_ARGS]
    return CLASS_INDEX[REASONING if field_index == 0 else ANSWER]


def served_seq(capture: Capture, analysis: Analysis, tokenizer: TokenizerAdapter) -> TokenSeq:
    """The left pane: prompt ids then output ids exactly as served."""
    ids = list(capture.prompt_ids) + list(capture.output_ids)
    raw = tokenizer.pieces(capture.prompt_ids) + tokenizer.pieces(capture.output_ids)
    classes = [_class_for(k, tokenizer.is_special(t)) for k, t in zip(analysis.kinds, ids)]
    n_prompt = len(capture.prompt_ids)
    status: list[str | None] = [None] * len(ids)
    al = analysis.alignment
    if al is not None and not capture.paths_diverge:  # the statuses are per aligned id: here the same ids
        for i, s in enumerate(al.statuses[: len(capture.output_ids)]):
            status[n_prompt + i] = s
    return TokenSeq(ids, [visible(p) for p in raw], classes, n_prompt, [p.endswith("\n") for p in raw], status)


def kept_seq(capture: Capture, analysis: Analysis, tokenizer: TokenizerAdapter) -> TokenSeq:
    """The right pane: what the text fields kept, aligned id by id to the ids they came from.

    Those ids are `capture.aligned_output_ids` (the parsed path's in a dual capture) and their kinds
    `analysis.aligned_kinds`; both come from core, so this pane agrees with the findings. Kept pieces
    show as themselves; ids the parser hid show as a gap marker of the same width (so both panes wrap
    identically and scroll line for line); partial and drifted ids are marked. Prompt positions are
    blank: no text field carries the prompt.
    """
    out_ids = capture.aligned_output_ids
    ids = list(capture.prompt_ids) + list(out_ids)
    n_prompt = len(capture.prompt_ids)
    prompt_raw = tokenizer.pieces(capture.prompt_ids)
    out_raw = tokenizer.pieces(out_ids)
    kinds = analysis.aligned_kinds
    al = analysis.alignment
    statuses: list[str | None] = list(al.statuses) if al is not None else [HIDDEN] * len(out_ids)
    # Which text field kept each id (core's alignment knows): an answer the parser filed as reasoning
    # shows in reasoning colour here while the left pane, coloured by the ids, shows answer.
    split = capture.reasoning is not None or capture.content is not None or bool(capture.tool_calls)
    fields = al.fields if al is not None and split else None
    parser = HERMES if seg.TOOL_ARGUMENTS in kinds and seg.TOOL_CALL_ID not in kinds else None
    names = [field_name(f, parser) for f in fields] if fields is not None else []
    pieces = [" " * cell_len(visible(p)) for p in prompt_raw]
    classes = [CLASS_INDEX[EMPTY]] * n_prompt
    status: list[str | None] = [None] * n_prompt
    kept_in = [""] * n_prompt
    for i, (tid, piece) in enumerate(zip(out_ids, out_raw)):
        shown = visible(piece)
        st = statuses[i] if i < len(statuses) else HIDDEN
        status.append(st)
        kept_in.append(names[i] if st != HIDDEN and i < len(names) else "")
        if st == HIDDEN:
            pieces.append(GAP_CHAR * cell_len(shown))
            classes.append(CLASS_INDEX[GAP])
            continue
        pieces.append(shown)
        if st == PARTIAL:
            classes.append(CLASS_INDEX[PARTIAL_CLS])
        elif st == DRIFT:
            classes.append(CLASS_INDEX[DRIFT_CLS])
        else:
            kept_by = fields[i] if fields is not None and i < len(fields) else None
            special = tokenizer.is_special(tid)
            if kept_by is None or special:
                classes.append(_class_for(kinds[n_prompt + i], special))
            else:
                classes.append(_kept_class(kept_by))
    breaks = [p.endswith("\n") for p in prompt_raw + out_raw]
    return TokenSeq(ids, pieces, classes, n_prompt, breaks, status, kept_in)


def cell_texts(seq: TokenSeq, mode: str) -> tuple[list[str], list[str] | None]:
    """Per-token cell text for a view mode: (top row, bottom row or None), padded to equal width."""
    if mode == "pieces":
        return seq.pieces, None
    id_texts = [str(t) for t in seq.ids]
    if mode == "ids":
        return [t + " " for t in id_texts], None
    tops, bottoms = [], []
    for piece, ident in zip(seq.pieces, id_texts):
        w = max(cell_len(piece), len(ident)) + 1
        tops.append(piece + " " * (w - cell_len(piece)))
        bottoms.append(ident + " " * (w - len(ident)))
    return tops, bottoms


@dataclass(frozen=True)
class CellWidths:
    """Per-token cell widths as a running sum, plus the tokens that end a row: computed once per view mode.

    Why a running sum: a resize re-wraps every row, and with `prefix` the end of a row is one bisection
    (the last token whose right edge fits) instead of a step per token, so a 32,000-token sample
    re-wraps in about a millisecond whatever the width.
    """

    prefix: list[int]
    """prefix[i] = total cell width of tokens 0 … i-1 (len(widths) + 1 entries)."""
    breaks: list[int]
    """Indices of the tokens after which a row must end (a newline piece), ascending."""
    widest: int = 0

    @classmethod
    def of(cls, widths: Sequence[int], breaks_after: Sequence[bool] | None = None) -> CellWidths:
        breaks = [i for i, b in enumerate(breaks_after) if b] if breaks_after is not None else []
        return cls([0, *accumulate(widths)], breaks, max(widths, default=0))

    def __len__(self) -> int:
        return len(self.prefix) - 1

    @property
    def total(self) -> int:
        return self.prefix[-1]

    def min_rows(self, width: int) -> int:
        """A lower bound on the rows at `width` (tells a pane that must scroll without wrapping it)."""
        if not len(self):
            return 0
        forced = len(self.breaks) - (1 if self.breaks and self.breaks[-1] == len(self) - 1 else 0)
        filled = -(-self.total // max(1, width)) if self.widest <= width else 1  # rows hold ≤ width cells
        return max(filled, forced + 1)

    def wrap(self, width: int) -> list[int]:
        """Start index of every row at `width` columns (the rules of `wrap`)."""
        n, prefix, breaks = len(self), self.prefix, self.breaks
        width = max(1, width)
        starts: list[int] = []
        start = 0
        while start < n:
            starts.append(start)
            end = bisect_right(prefix, prefix[start] + width) - 1  # tokens start … end-1 fit
            if prefix[end] == prefix[start]:  # nothing wide yet: the next token joins even if it overflows
                end += 1
            j = bisect_left(breaks, start)
            if j < len(breaks) and breaks[j] < end:
                end = breaks[j] + 1
            start = end
        return starts


def wrap(widths: Sequence[int], width: int, breaks_after: Sequence[bool] | None = None) -> list[int]:
    """Start index of every row when tokens of these cell widths flow into `width` columns.

    A token never splits across rows (a token wider than the pane gets a row of its own and is
    cropped); `breaks_after[i]` ends the row after token i (a newline piece).
    """
    return CellWidths.of(widths, breaks_after).wrap(width)


def row_of(starts: Sequence[int], index: int) -> int:
    """The row holding token `index`, given the row starts from `wrap`."""
    return max(0, bisect_right(starts, index) - 1)


def detail_lines(
    seq: TokenSeq,
    index: int,
    tokenizer: TokenizerAdapter | None,
    *,
    kinds: Sequence[str],
    loss_mask: Sequence[int],
    logprobs: Sequence[float] | None,
) -> list[tuple[str, str]]:
    """(label, value) pairs for the token detail panel."""
    tid = seq.ids[index]
    raw = tokenizer.piece_bytes(tid) if tokenizer is not None else b""
    out_pos = index - seq.n_prompt
    where = f"{index} (prompt[{index}])" if out_pos < 0 else f"{index} (output[{out_pos}])"
    rows = [
        ("id", str(tid)),
        ("piece", visible(raw.decode("utf-8", errors="replace")) if raw else seq.pieces[index]),
        ("bytes", raw.hex(" ") if raw else "—"),
        ("position", where),
        ("segment", kinds[index] if index < len(kinds) else "—"),
        ("loss mask", str(loss_mask[index]) if index < len(loss_mask) else "—"),
    ]
    if logprobs is not None and 0 <= out_pos < len(logprobs):
        rows.append(("logprob", f"{logprobs[out_pos]:.4f}"))
    status = seq.status[index] if index < len(seq.status) else None
    kept_in = seq.fields[index] if index < len(seq.fields) else ""
    rows.append(
        (
            "text field",
            {
                None: "— (prompt)" if out_pos < 0 else "— (no text fields)",
                KEPT: f"kept in {kept_in}" if kept_in else "kept",
                PARTIAL: f"partly kept in {kept_in} (whitespace trimmed)"
                if kept_in
                else "partly kept (whitespace trimmed)",
                HIDDEN: "hidden by the parser",
                DRIFT: "drift: text before it no id explains",
            }.get(status, status or "—"),
        )
    )
    return rows


def shown(text: object) -> str:
    """Stored or typed text (a sample id, a tag, a reviewer, a run name) for one line of the screen: its control
    characters as escapes. Rich drops only a few of them: an ESC reached the terminal and ran (a window title)."""
    return printable_line(str(text))


def plain(text: object) -> Content:
    """Text for a label or an option that is never read as Textual markup ("[/INST]" typed in the search box, a tag
    "[/x]" or a run named so crashed the app: "auto closing tag has nothing to close"), its controls escaped."""
    from textual.content import Content

    return Content(printable(str(text)))


NAME_CELLS = 48
"""The most a name (a session's, a run's) takes in a table: one 155-character name pushed every other column off
the screen for every row (the whole name is on its own screen, and in `tokview stats`)."""


def capped(name: str, width: int = NAME_CELLS) -> str:
    """`name` cut to `width` terminal cells with `…` when wider: by cells, as a CJK name as long in characters took
    twice the room."""
    return name if cell_len(name) <= width else first_cells(name, width - 1) + "…"


def capped_middle(name: str, width: int) -> str:
    """`name` cut to `width` cells by its middle (`proxy:proxy-2…382f14:s3`): names that share a long start (a run's
    sessions) keep the end that tells them apart."""
    if cell_len(name) <= width:
        return name
    tail_cells = (width - 1) // 2
    tail, used = "", 0
    for ch in reversed(name):
        size = get_character_cell_size(ch)
        if used + size > tail_cells:
            break
        tail, used = ch + tail, used + size
    return first_cells(name, width - 1 - used) + "…" + tail


def first_cells(text: str, cells: int) -> str:
    """The start of `text` that fits in `cells` terminal cells. Why not `text[:n]`: a CJK character or an emoji takes two
    cells, and an id cut by characters pushed the columns after it; one the edge would split is left out whole."""
    if cell_len(text) <= cells:
        return text
    cut = set_cell_size(text, max(0, cells))
    return cut if text.startswith(cut) else cut[:-1]  # set_cell_size drew a split wide character as a space


def last_cells(text: str, cells: int) -> str:
    """The end of `text` that fits in `cells` terminal cells (`first_cells` from the other side)."""
    if text.isascii():  # one cell a character: the rows' usual ids, drawn every frame
        return text[max(0, len(text) - max(0, cells)) :]
    start, used = len(text), 0
    while start and used + get_character_cell_size(text[start - 1]) <= cells:
        start -= 1
        used += get_character_cell_size(text[start])
    while start < len(text) and not get_character_cell_size(text[start]):  # a combining mark whose letter was cut
        start += 1
    return text[start:]


def pad_cells(text: str, cells: int) -> str:
    """`text` padded with spaces to `cells` terminal cells (`str.ljust` counts characters, not cells)."""
    return text + " " * (cells - cell_len(text))


def cell(text: object) -> Text:
    """A table cell of stored or sent text (a run name, a harness's user-agent, a model's answer): a DataTable reads a
    str cell as markup, and "[/INST]" in an answer crashed the screen; controls escaped."""
    from rich.text import Text

    return Text(printable_line(str(text)), end="")
