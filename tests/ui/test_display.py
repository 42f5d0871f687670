"""The token panes' model: visible whitespace, style classes per id, alignment gaps, wrapping."""

from __future__ import annotations

import random

from facts import IM_END, IM_USER, THINK_CLOSE
from rich.cells import cell_len

from tokview.ui import display as d
from tokview.ui.examples import CONTENT, REASONING

REASONING_AND_ANSWER = REASONING + CONTENT


def test_visible_makes_whitespace_and_controls_visible():
    assert d.visible(" a\tb\r\n") == "·a⇥b␍↵"
    assert d.visible("\x00\x1b\x7f") == "␀␛␡"
    assert d.visible("") == "∅"
    assert d.visible("中文🙂") == "中文🙂"


def test_served_seq_classes_name_delimiters_stop_and_specials(short, tokenizer):
    capture, analysis = short
    seq = d.served_seq(capture, analysis, tokenizer)
    cls = {name: d.CLASS_INDEX[name] for name in d.STYLE_CLASSES}
    n = len(capture.prompt_ids)
    assert seq.n_prompt == n
    assert len(seq) == n + len(capture.output_ids)
    assert seq.classes[0] == cls["prompt-special"]  # <|im_user|>
    assert seq.classes[3] == cls["prompt"]  # 'W'
    assert seq.classes[n - 1] == cls["delimiter"]  # pre-filled <think> 163606
    assert seq.classes[n] == cls["reasoning"]  # 'Okay'
    close = n + capture.output_ids.index(THINK_CLOSE)
    assert seq.classes[close] == cls["delimiter"]
    assert seq.pieces[close] == "</think>"
    assert seq.classes[close + 1] == cls["answer"]
    assert seq.classes[-1] == cls["stop"]
    assert seq.ids[-1] == IM_END
    assert seq.pieces[n + 2] == "·let"  # the space made visible
    assert seq.status[n] == "kept"
    assert seq.status[close] == "hidden"
    assert seq.status[0] is None


def test_kept_seq_shows_hidden_ids_as_gaps_of_equal_width(short, tokenizer, profile):
    capture, analysis = short
    served = d.served_seq(capture, analysis, tokenizer)
    kept = d.kept_seq(capture, analysis, tokenizer)
    assert [cell_len(p) for p in kept.pieces] == [cell_len(p) for p in served.pieces]
    close = served.n_prompt + capture.output_ids.index(THINK_CLOSE)
    assert kept.pieces[close] == d.GAP_CHAR * len("</think>")
    assert kept.classes[close] == d.CLASS_INDEX["gap"]
    assert kept.classes[-1] == d.CLASS_INDEX["gap"]  # <|im_end|> is in no text field either
    assert kept.pieces[close + 1] == "The"
    assert kept.classes[close + 1] == d.CLASS_INDEX["answer"]
    assert kept.classes[0] == d.CLASS_INDEX["empty"]
    assert kept.pieces[0].strip() == ""


def test_kept_seq_marks_partial_and_drift(tokenizer, profile):
    from tokview.core.analysis import analyze
    from tokview.ui.examples import short_capture

    capture = short_capture()
    capture.reasoning = "Okay, let me think about this carefully."
    capture.content = "The answer is EXTRA forty-two!"  # text no id explains → drift on ' forty'
    analysis = analyze(capture, profile, tokenizer)
    kept = d.kept_seq(capture, analysis, tokenizer)
    forty = kept.n_prompt + capture.output_ids.index(279)
    assert kept.status[forty] == "drift"
    assert kept.classes[forty] == d.CLASS_INDEX["drift"]


def test_wrap_flows_tokens_and_breaks_after_newlines():
    assert d.wrap([3, 3, 3], 6) == [0, 2]
    assert d.wrap([3, 3, 3], 100, [True, False, False]) == [0, 1]
    assert d.wrap([10, 2], 4) == [0, 1]  # a token wider than the pane gets its own row
    assert d.wrap([], 10) == []
    assert d.row_of([0, 2, 5], 4) == 1
    assert d.row_of([0, 2, 5], 5) == 2


def test_wrap_by_running_sum_agrees_with_the_token_by_token_rule():
    """`CellWidths.wrap` bisects a running sum; it must place every row where a plain scan would."""

    def scan(widths, width, breaks):
        starts, used = ([0] if widths else []), 0
        for i, w in enumerate(widths):
            if used and used + w > width:
                starts.append(i)
                used = 0
            used += w
            if breaks is not None and breaks[i] and i + 1 < len(widths):
                starts.append(i + 1)
                used = 0
        return starts

    rng = random.Random(7)
    for _ in range(3000):
        n = rng.randint(0, 40)
        widths = [rng.choice([0, 1, 1, 2, 3, 5, 9]) for _ in range(n)]  # zero-width and wider-than-pane tokens
        breaks = [rng.random() < 0.15 for _ in range(n)] if rng.random() < 0.7 else None
        width = rng.randint(1, 12)
        expected = scan(widths, width, breaks)
        cells = d.CellWidths.of(widths, breaks)
        assert cells.wrap(width) == expected, (widths, width, breaks)
        assert cells.min_rows(width) <= len(expected)


def test_cell_texts_both_mode_puts_piece_over_id_in_equal_width(short, tokenizer):
    capture, analysis = short
    seq = d.served_seq(capture, analysis, tokenizer)
    tops, bottoms = d.cell_texts(seq, "both")
    assert bottoms is not None
    for top, bottom, tid in zip(tops, bottoms, seq.ids):
        assert cell_len(top) == cell_len(bottom)
        assert bottom.strip() == str(tid)
    ids_only, none = d.cell_texts(seq, "ids")
    assert none is None
    assert ids_only[0] == f"{IM_USER} "


def test_detail_lines_name_bytes_segment_mask_and_field(short, tokenizer):
    capture, analysis = short
    seq = d.served_seq(capture, analysis, tokenizer)
    close = seq.n_prompt + capture.output_ids.index(THINK_CLOSE)
    rows = dict(
        d.detail_lines(seq, close, tokenizer, kinds=analysis.kinds, loss_mask=analysis.loss_mask, logprobs=[-0.5] * 18)
    )
    assert rows["id"] == str(THINK_CLOSE)
    assert rows["piece"] == "</think>"
    assert rows["bytes"] == b"</think>".hex(" ")
    assert rows["segment"] == "closer"
    assert rows["loss mask"] == "1"
    assert rows["position"] == f"{close} (output[9])"
    assert rows["logprob"] == "-0.5000"
    assert rows["text field"] == "hidden by the parser"
    prompt_rows = dict(
        d.detail_lines(seq, 0, tokenizer, kinds=analysis.kinds, loss_mask=analysis.loss_mask, logprobs=None)
    )
    assert prompt_rows["loss mask"] == "0"
    assert "logprob" not in prompt_rows


def test_kept_seq_colours_pieces_by_the_field_that_kept_them(tokenizer, profile):
    from tokview.core.analysis import analyze
    from tokview.ui.examples import CONTENT, REASONING, short_capture

    capture = short_capture()
    capture.reasoning, capture.content = REASONING + CONTENT, ""  # the parser filed the answer as reasoning
    analysis = analyze(capture, profile, tokenizer)
    served = d.served_seq(capture, analysis, tokenizer)
    kept = d.kept_seq(capture, analysis, tokenizer)
    answer_pos = served.n_prompt + capture.output_ids.index(THINK_CLOSE) + 1
    assert served.classes[answer_pos] == d.CLASS_INDEX["answer"]
    assert kept.classes[answer_pos] == d.CLASS_INDEX["reasoning"]


def _dual(parsed_output_ids):
    from tokview.ui.examples import short_capture

    capture = short_capture()
    capture.endpoint, capture.parsed_output_ids = "dual", parsed_output_ids
    return capture


def test_dual_capture_whose_paths_diverge_shows_the_parsed_ids_with_their_own_kinds(tokenizer, profile):
    from tokview.core.analysis import analyze
    from tokview.ui.examples import KIMI_OUTPUT_IDS

    # The parsed path never closed reasoning: the answer ids there are reasoning by their kinds.
    parsed = [t for t in KIMI_OUTPUT_IDS if t != THINK_CLOSE]
    capture = _dual(parsed)
    capture.reasoning, capture.content = REASONING_AND_ANSWER, None
    analysis = analyze(capture, profile, tokenizer)
    assert capture.paths_diverge
    assert analysis.aligned_kinds != analysis.kinds
    served = d.served_seq(capture, analysis, tokenizer)
    kept = d.kept_seq(capture, analysis, tokenizer)
    n = served.n_prompt
    assert kept.ids == capture.prompt_ids + parsed
    assert served.ids == capture.prompt_ids + capture.output_ids
    assert set(served.status[n:]) == {None}  # the statuses belong to the other path's ids
    assert kept.status[n:] == list(analysis.alignment.statuses)
    special = {i for i, t in enumerate(kept.ids) if tokenizer.is_special(t)}
    for i in range(n, len(kept.ids)):
        if i not in special and kept.status[i] == "kept":
            assert kept.classes[i] == d.CLASS_INDEX["reasoning"]  # all text came back as reasoning
    assert kept.classes[-1] == d.CLASS_INDEX["gap"]  # <|im_end|> is in no text field


def test_dual_capture_with_an_empty_parsed_path_shows_no_output_ids(tokenizer, profile):
    from tokview.core.analysis import analyze

    capture = _dual([])
    capture.reasoning, capture.content = None, None
    analysis = analyze(capture, profile, tokenizer)
    kept = d.kept_seq(capture, analysis, tokenizer)
    assert kept.ids == capture.prompt_ids  # not the raw path's ids: those are not what the fields came from
    assert len(d.served_seq(capture, analysis, tokenizer)) == len(capture.prompt_ids) + len(capture.output_ids)


def test_dual_capture_whose_paths_agree_keeps_the_statuses_on_the_served_pane(tokenizer, profile):
    from tokview.core.analysis import analyze
    from tokview.ui.examples import KIMI_OUTPUT_IDS

    capture = _dual(list(KIMI_OUTPUT_IDS))
    analysis = analyze(capture, profile, tokenizer)
    served = d.served_seq(capture, analysis, tokenizer)
    assert served.status[served.n_prompt :] == list(analysis.alignment.statuses)
    assert d.kept_seq(capture, analysis, tokenizer).classes == d.kept_seq(_dual(None), analysis, tokenizer).classes


def test_capped_cuts_a_cjk_or_emoji_name_to_the_cells_a_table_gives_it():
    """A session's or a run's name is capped for a table by terminal cells: a CJK name of 30 characters took 60 cells
    (len() left it whole), and a cut through a double-width character must leave it out, not overflow."""
    for name in ("長い名前のセッション" * 3, "👨‍👩‍👧" * 30, "run-中文-" * 10):
        for width in (d.NAME_CELLS, 21, 10, 9, 2):
            out = d.capped(name, width)
            assert width - 1 <= cell_len(out) <= width, (name, width, out)
            assert out.endswith("…")
    assert d.capped("中文") == "中文"


def test_a_turns_answer_is_cut_to_sixty_cells_and_an_ellipsis():
    from datetime import datetime

    from tokview.store.sessions_query import TurnRow
    from tokview.ui.screens.sessions import turn_cells

    row = TurnRow("s", 1, 10, 10, "stop", "pending", [], True, 0.5, "答え" * 50, datetime(2026, 1, 1))
    answer = turn_cells(row)[-1]
    assert cell_len(str(answer)) <= 61
    assert str(answer).endswith("…")


def test_first_and_last_cells_keep_whole_characters_and_never_more_than_the_cells():
    from tokview.ui.display import first_cells, last_cells

    for text in ("abc", "日本語", "a日b本c"):
        for cells in range(0, 8):
            for part in (first_cells(text, cells), last_cells(text, cells)):
                assert cell_len(part) <= cells and part in text, (text, cells, part)
            assert last_cells(text, cells) == text[len(text) - len(last_cells(text, cells)) :]
    assert last_cells("abc", 5) == first_cells("abc", 5) == "abc"
    assert last_cells("a日b本c", 3) == "本c" and first_cells("a日b本c", 2) == "a"
