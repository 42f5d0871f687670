"""Alignment of returned text fields onto ids: kept, trimmed, hidden, drifted."""

from dataclasses import replace
from itertools import groupby

from tokview.core.alignment import DRIFT, HIDDEN, KEPT, PARTIAL, align


def _run(pieces, texts, special=None):
    pieces = [p.encode() for p in pieces]
    return align(pieces, texts, special or [False] * len(pieces)).statuses


def test_all_kept_and_special_hidden():
    assert _run(["Okay", ",", "</think>", "The"], ["Okay,", "The"], [False, False, True, False]) == (
        KEPT,
        KEPT,
        HIDDEN,
        KEPT,
    )


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
    assert result.statuses == (KEPT,)
    assert result.unmatched_text == " and more"


def test_fields_say_which_text_kept_each_id():
    # reasoning "ab", content "cd"; the closer is hidden; a None field is skipped but keeps its index.
    result = align([b"a", b"b", b"</think>", b"c", b"d"], ["ab", None, "cd"], [False, False, True, False, False])
    assert result.statuses == (KEPT, KEPT, HIDDEN, KEPT, KEPT)
    assert result.fields == (0, 0, None, 2, 2)


def test_an_answer_filed_as_reasoning_is_attributed_to_reasoning():
    result = align([b"Hmm", b"</think>", b"Yes"], ["HmmYes", ""], [False, True, False])
    assert result.fields == (0, None, 0)


def test_kept_runs_match_the_id_by_id_walk():
    """The run fast path gives exactly what the per-id walk gives, on drifting and clean texts alike."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    words = st.sampled_from([b"a", b"b", b" c", b"\n", b"", b"dd", b"  ", "é".encode(), b"</think>"])

    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(st.tuples(words, st.booleans()), max_size=30),
        st.lists(st.sampled_from(["a", "b c", "dd", " ", "é", "x", ""]), max_size=8),
        st.integers(0, 3),
    )
    def check(ids, extra, mode):
        pieces = [p for p, _ in ids]
        special = [s and p == b"</think>" for p, s in ids]
        plain = "".join(p.decode("utf-8", "replace") for p, s in zip(pieces, special) if not s)
        texts = {
            0: [plain],
            1: [plain[: len(plain) // 2], plain[len(plain) // 2 :]],
            2: ["".join(extra) + plain],
            3: [plain.strip(), "".join(extra)],
        }[mode]
        fast = align(pieces, texts, special)
        slow = align(pieces, texts, special, fast_runs=False)
        assert fast == slow
        read_off = [(status, len(list(run))) for status, run in groupby(fast.statuses)]
        assert fast.status_runs() == slow.status_runs() == read_off  # as recorded by the walk
        assert replace(fast).status_runs() == read_off  # a copy carries no recorded runs: read off the statuses
        assert "_runs" not in replace(fast).__dict__
        assert "_runs" in fast.__dict__

    check()


def test_a_long_answer_in_two_fields_matches_the_walk(kimi_tok):
    """A 2,000-id answer whose reasoning and content split inside a run: fields change at the right id."""
    reasoning = "Okay, let me think about this carefully. " * 40
    content = "The answer is forty-two! 中文 👍 " * 30
    close = kimi_tok.token_to_id("</think>")
    ids = kimi_tok.encode(reasoning) + [close] + kimi_tok.encode(content)
    pieces = kimi_tok.pieces_bytes(ids)
    special = kimi_tok.special_flags(ids)
    assert pieces == [kimi_tok.piece_bytes(i) for i in ids]
    assert special == [kimi_tok.is_special(i) for i in ids]
    for texts in ([reasoning, content], [reasoning[:100], reasoning[100:] + content], [reasoning + content]):
        fast = align(pieces, texts, special)
        assert fast == align(pieces, texts, special, fast_runs=False)
        assert fast.statuses.count(HIDDEN) == 1
        assert not fast.unmatched_text
    split = align(pieces, [reasoning[:100], reasoning[100:] + content], special)
    first_of_second = next(i for i, f in enumerate(split.fields) if f == 1)
    assert len(b"".join(pieces[:first_of_second])) >= 100 > len(b"".join(pieces[: first_of_second - 1]))


def test_positions_lists_every_index_of_a_status_in_order():
    """`Alignment.positions` scans with `tuple.index`; it must name exactly the indexes a plain scan does."""
    import random

    from tokview.core.alignment import DRIFT, HIDDEN, KEPT, PARTIAL, Alignment

    rng = random.Random(7)
    for n in (0, 1, 5, 300):
        statuses = tuple(rng.choice((KEPT, KEPT, KEPT, PARTIAL, HIDDEN, DRIFT)) for _ in range(n))
        # statuses read back from a store are equal strings, not the same objects
        copied = tuple("".join(list(s)) for s in statuses)
        for status in (KEPT, PARTIAL, HIDDEN, DRIFT):
            expected = [i for i, s in enumerate(statuses) if s == status]
            assert Alignment(statuses, "").positions(status) == expected
            assert Alignment(copied, "").positions(status) == expected


def test_runs_are_cut_at_every_special_flag_whatever_sequence_holds_the_flags():
    """`align` finds the special ids with `list.index(True)` on a list and `compress` otherwise: same result."""
    from tokview.core.alignment import true_positions

    pieces = [b"a", b"<s>", b"b", b"c", b"<e>", b"d"]
    flags = [False, True, False, False, True, False]
    assert true_positions(flags) == true_positions(tuple(flags)) == [1, 4]
    assert true_positions([False] * 5) == []
    assert true_positions([True, True]) == [0, 1]
    for given, at in ((flags, None), (tuple(flags), None), (flags, [1, 4])):
        result = align(pieces, ["a", "bc", "d"], given, special_at=at)
        assert result.statuses == (KEPT, HIDDEN, KEPT, KEPT, HIDDEN, KEPT)
        assert result.fields == (0, None, 1, 1, None, 2)


def test_ids_the_text_never_held_are_hidden_and_the_text_still_starts_at_its_first_id():
    """An SGLang output that echoes the prompt's tail (#17240) before its own text: the text fields hold only
    the generation. The echoed ids are hidden; the walk must not jump ahead to a chance match of 'an'+'t'
    inside 'important' and call every id before it hidden."""
    pieces = ["t", "an", "t", "<|im_middle|>", "<think>", "Okay", ",", " let", " me", " check", " the", " important"]
    pieces += [" part", "</think>", "Yes", "<|im_end|>"]
    special = [p.startswith("<") for p in pieces]
    text = "Okay, let me check the important part"
    for fast in (True, False):
        result = align([p.encode() for p in pieces], [text + "Yes", None], special, fast_runs=fast)
        assert result.positions(HIDDEN) == [0, 1, 2, 3, 4, 13, 15]
        assert result.statuses[5:13] == (KEPT,) * 8
        assert not result.unmatched_text


def test_an_echo_longer_than_the_drift_it_could_be_is_still_drift():
    """Text no id accounts for (' dog and') stays drift: skipping it costs fewer bytes than hiding ids."""
    assert _run([" the", " cat", " sat"], [" the dog and the cat sat"]) == (KEPT, DRIFT, KEPT)
    assert _run(["X", "Y", " the", " end"], [" the end"]) == (HIDDEN, HIDDEN, KEPT, KEPT)


def test_pieces_of_a_long_prompt_with_a_few_new_ids_look_up_only_the_new_ones(kimi_tok_dir, monkeypatch):
    """An agent's next prompt repeats ids seen before and adds a few: only those are looked up one by one (the
    rest in C), and the pieces are those of `piece_bytes`, for ids of every kind (special, out of the vocabulary)."""
    from tokview.core.tokenizer import TokenizerAdapter, load_tokenizer

    tok = load_tokenizer(kimi_tok_dir)  # its own cache: the session's tokenizer is shared by other tests
    seen = tok.encode("Okay, let me think about this carefully. " * 500)
    assert tok.pieces_bytes(seen) == [tok.piece_bytes(i) for i in seen]
    new = [tok.token_to_id("</think>"), 163_999_999, *tok.encode("zebra quux 中文 👍")]
    looked_up: list[int] = []
    piece_bytes = TokenizerAdapter.piece_bytes

    def counted(self: TokenizerAdapter, token_id: int) -> bytes:
        looked_up.append(token_id)
        return piece_bytes(self, token_id)

    monkeypatch.setattr(TokenizerAdapter, "piece_bytes", counted)
    fresh = [t for t in new if t not in tok._bytes_cache]
    got = tok.pieces_bytes([*seen, *new, *seen[:50], *new])
    assert sorted(looked_up) == sorted(set(fresh))  # each new id once, no seen id
    monkeypatch.setattr(TokenizerAdapter, "piece_bytes", piece_bytes)
    assert got == [tok.piece_bytes(i) for i in [*seen, *new, *seen[:50], *new]]
