"""Alignment of returned text fields onto ids: kept, trimmed, hidden, drifted."""

from tokview.core.alignment import DRIFT, HIDDEN, KEPT, PARTIAL, align


def _run(pieces, texts, special=None):
    pieces = [p.encode() for p in pieces]
    return align(pieces, texts, special or [False] * len(pieces)).statuses


def test_all_kept_and_special_hidden():
    assert _run(["Okay", ",", "</think>", "The"], ["Okay,", "The"], [False, False, True, False]) == \
        (KEPT, KEPT, HIDDEN, KEPT)


def test_trimmed_whitespace_is_partial_and_blank_ids_hidden():
    assert _run(["Hi", "\n\n", "\n\nThe", " end", "\n"], ["Hi", "The end"]) == (KEPT, HIDDEN, PARTIAL, KEPT, HIDDEN)


def test_inserted_text_is_drift_not_a_cascade():
    statuses = _run([" the", " cat", " sat"], [" the dog and the cat sat"])
    assert statuses == (KEPT, DRIFT, KEPT)


def test_resync_needs_the_next_piece_too():
    # " the" occurs early by chance; only the later occurrence is followed by " end".
    statuses = _run(["X", " the", " end"], ["Y the cat, the end"])
    assert statuses == (HIDDEN, DRIFT, KEPT)


def test_text_no_id_accounts_for_is_reported():
    result = align([b"a"], ["a and more"], [False])
    assert result.statuses == (KEPT,) and result.unmatched_text == " and more"


def test_fields_say_which_text_kept_each_id():
    # reasoning "ab", content "cd"; the closer is hidden; a None field is skipped but keeps its index.
    result = align([b"a", b"b", b"</think>", b"c", b"d"], ["ab", None, "cd"], [False, False, True, False, False])
    assert result.statuses == (KEPT, KEPT, HIDDEN, KEPT, KEPT)
    assert result.fields == (0, 0, None, 2, 2)


def test_an_answer_filed_as_reasoning_is_attributed_to_reasoning():
    result = align([b"Hmm", b"</think>", b"Yes"], ["HmmYes", ""], [False, True, False])
    assert result.fields == (0, None, 0)
