"""A rendered prompt encoded piece by piece between added tokens (`core.segment_memo`) gives the whole encoding.

The memo is only worth having if it is exact: random texts made of every layout's added tokens and text around
them (whitespace on both sides of a token, digits, unicode, newlines, a token's own prefix, empty pieces,
repeats) encode to the same ids through the memo as whole, remembered or not, with a bound that forgets; a
tokenizer whose pieces could depend on their neighbours gets no memo at all. Real tokenizer files (Qwen3's as
shipped, the Kimi and GLM layouts tokview builds).
"""

from __future__ import annotations

import random
import re
import sys
import threading
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from tokview.core import segment_memo
from tokview.core.segment_memo import MIN_CHARS, SegmentMemo, exact_markers, longest_first
from tokview.core.tokenizer import TokenizerAdapter
from tokview.core.tokenizer_folder import TokenizerFolder
from tokview.core.tokenizer_json import TokenizerJson

FILLERS = [
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "hello",
    " world",
    "42",
    "3.14159",
    "naïve café",
    "日本語のテキスト",
    "🙂👍🏽",
    "def f(x):\n    return x",
    '{"a": [1, 2]}',
    "<",
    "<|",
    "|>",
    "think",
    "'s",
    "\u00a0",
    "e\u0301",  # decomposed: NFC joins it with the letter before
]


def _native(folder: Path) -> TokenizerJson:
    tok = TokenizerJson.from_folder(TokenizerFolder(folder))
    assert tok is not None
    return tok


def _random_text(rng: random.Random, markers: list[str], parts: int) -> str:
    out = []
    for _ in range(parts):
        roll = rng.random()
        if roll < 0.3:
            out.append(rng.choice(markers))
        elif roll < 0.35 and out:
            out.append(out[-1][:3])  # a token's first characters, or a filler's
        else:
            out.append("".join(rng.choices(FILLERS, k=rng.randint(1, 4))))
    return "".join(out)


@pytest.fixture(params=["qwen3", "kimi", "glm"])
def native(request, qwen_tok_dir, kimi_tok_dir, glm_tok_dir) -> TokenizerJson:
    return _native({"qwen3": qwen_tok_dir, "kimi": kimi_tok_dir, "glm": glm_tok_dir}[request.param])


def test_pieces_encode_to_the_whole_texts_ids(native):
    memo = native._segment_memo()
    assert memo is not None  # every layout tokview ships cuts exactly
    small = SegmentMemo(memo.markers, native._encode_pieces, max_bytes=400)  # forgets nearly everything
    markers = sorted(memo.markers)
    rng = random.Random(7)
    texts = [_random_text(rng, markers, rng.randint(1, 40)) for _ in range(300)]
    texts += ["", markers[0], markers[0] * 3, " " + markers[0] + " ", texts[5] + texts[9]]
    for _round in range(2):  # the second time every piece is remembered (or forgotten, for `small`)
        for text in texts:
            whole = native.encode(text, add_special_tokens=False)
            assert memo.encode(text) == whole, repr(text)
            assert small.encode(text) == whole, repr(text)
    assert small._bytes <= 400


def test_a_conversation_rendered_turn_by_turn_gives_the_ids_of_its_whole_render(qwen_tok_dir, qwen_tok):
    """The adapter's render (what `prompt_render_mismatch` compares with the served ids) goes through the memo once
    the render is long; every turn's ids equal encoding its whole text, and the earlier turns' pieces are reused."""
    native = _native(qwen_tok_dir)
    native.chat_template = qwen_tok.chat_template  # the template tokview loads for Qwen3 (the package has none)
    adapter = TokenizerAdapter(native, source=qwen_tok_dir)
    rng = random.Random(3)
    messages = [{"role": "system", "content": "You are terse. " * 200}]
    for turn in range(6):
        messages.append({"role": "user", "content": _random_text(rng, ["<think>", "</think>"], 30)})
        ids = adapter.render(messages)
        text = adapter.render_text(messages)
        assert ids == native.encode(text, add_special_tokens=False)
        if turn == 0:
            assert len(text) >= MIN_CHARS
        messages.append({"role": "assistant", "content": _random_text(rng, ["\n"], 20)})
    memo = native._segment_memo()
    assert memo is not None and len(memo._pieces) > 6


def _toy(added: AddedToken, pre: pre_tokenizers.PreTokenizer | None = None) -> Tokenizer:
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate("abcdefghij <>x")}, merges=[]))
    if pre is not None:
        tok.pre_tokenizer = pre
    tok.add_special_tokens([added])
    return tok


@pytest.mark.parametrize(
    ("added", "pre", "exact"),
    [
        (AddedToken("<x>", special=True, normalized=False), pre_tokenizers.ByteLevel(add_prefix_space=False), True),
        (AddedToken("<x>", special=True, normalized=False), None, True),
        (AddedToken("<x>", special=True, normalized=False, lstrip=True), None, False),
        (AddedToken("<x>", special=True, normalized=False, rstrip=True), None, False),
        (AddedToken("<x>", special=True, normalized=False, single_word=True), None, False),
        (AddedToken("<x>", special=True, normalized=False), pre_tokenizers.Metaspace(), False),
        (
            AddedToken("<x>", special=True, normalized=False),
            pre_tokenizers.Sequence([pre_tokenizers.Digits(), pre_tokenizers.Metaspace()]),
            False,
        ),
    ],
)
def test_a_tokenizer_whose_pieces_could_depend_on_their_neighbours_gets_no_memo(added, pre, exact):
    tok = _toy(added, pre)
    state = tok.pre_tokenizer.__getstate__() if tok.pre_tokenizer is not None else None
    markers = exact_markers(tok.get_added_tokens_decoder().items(), state)
    assert (markers == {"<x>": tok.token_to_id("<x>")}) if exact else markers is None


def test_tokens_matched_in_normalized_text_are_left_to_the_pieces_encoding():
    tok = _toy(AddedToken("<x>", special=False, normalized=True))
    assert exact_markers(tok.get_added_tokens_decoder().items(), None) is None  # nothing to cut at


def _leftmost_longest(text: str, markers: list[str]) -> list[str]:
    """What `tokenizers` cuts a text into, by brute force: at the leftmost position where a marker starts, the
    longest marker there."""
    out, start, i = [], 0, 0
    while i < len(text):
        found = max((m for m in markers if text.startswith(m, i)), key=len, default=None)
        if found is None:
            i += 1
            continue
        out += [text[start:i], found]
        i = start = i + len(found)
    return [*out, text[start:]]


def test_the_cutting_pattern_takes_the_leftmost_longest_marker():
    """A trie, not an alternation (258 markers that all begin with `<|` made cutting cost more than encoding):
    markers that are prefixes of each other, share long starts or sit inside others, on random texts of them."""
    rng = random.Random(11)
    for _ in range(200):
        alphabet = rng.choice(["ab", "abc", "<|>ab"])
        markers = list({"".join(rng.choices(alphabet, k=rng.randint(1, 6))) for _ in range(rng.randint(1, 8))})
        pattern = re.compile(f"({longest_first(markers)})")
        for _ in range(20):
            text = "".join(rng.choices([*alphabet, "x", *markers], k=rng.randint(0, 30)))
            assert pattern.split(text) == _leftmost_longest(text, markers), (markers, text)
    assert re.compile(f"({longest_first([])})").split("abc") == ["abc"]  # no marker: no cut
    for depth in (300, 600, 1500):  # nested past what the regex parser (or emit) recurses to: the alternation
        deep = ["a" * k for k in range(1, depth)]
        rest = 1600 - (depth - 1)
        got = re.compile(f"({longest_first(deep)})").split("b" + "a" * 1600)
        assert "".join(got) == "b" + "a" * 1600 and got[1] == "a" * (depth - 1) and got[3] == "a" * min(rest, depth - 1)


def test_short_pieces_are_not_remembered_and_the_bound_counts_what_python_holds(native):
    memo = native._segment_memo()
    assert memo is not None
    marker = next(iter(memo.markers))
    short = [f"w{i}" for i in range(500)]  # distinct short pieces: encoded again each time, never kept
    assert memo.encode(marker.join(short)) == native.encode(marker.join(short), add_special_tokens=False)
    assert not any(p in memo._pieces for p in short)
    tight = SegmentMemo(memo.markers, native._encode_pieces, max_bytes=20_000)
    long_pieces = [f"{i} " + "word " * 40 for i in range(200)]
    tight.encode(marker.join(long_pieces))
    held = sum(sys.getsizeof(p) + sys.getsizeof(ids) for p, ids in tight._pieces.items())
    assert 0 < held <= tight._bytes <= 20_000


def test_long_pieces_are_kept_as_tuples_too_exact_and_bounded(native, monkeypatch):
    """A piece of many ids (an agent's system prompt) is read from a tuple after its first encoding: the ids stay
    the whole text's, a tuple is made once, and the tuples together hold at most HOT_MAX_IDS ids, the least
    recently used dropped first."""
    system = "You answer in full sentences about tools. " * 30
    other = "A second long piece of plain words to encode. " * 25
    sizes = [len(native.encode(t, add_special_tokens=False)) for t in (system, other)]
    monkeypatch.setattr(segment_memo, "HOT_MIN_IDS", 64)
    monkeypatch.setattr(segment_memo, "HOT_MAX_IDS", sum(sizes) + 10)  # room for these two
    memo = SegmentMemo(native._segment_memo().markers, native._encode_pieces)
    marker = next(iter(memo.markers))
    first = None
    for turn in range(4):
        text = system + marker + f"question {turn} " * 3 + marker + other
        assert memo.encode(text) == native.encode(text, add_special_tokens=False)
        kept = memo._hot.get(system)
        assert (
            kept is not None and type(kept) is tuple and list(kept) == native.encode(system, add_special_tokens=False)
        )
        assert first is None or kept is first  # made once, then read
        first = kept
    assert set(memo._hot) == {system, other} and memo._hot_ids == sum(sizes)
    again = "x " + system  # a third long piece: the one used least recently (`other`) goes
    text = again + marker + system
    assert memo.encode(text) == native.encode(text, add_special_tokens=False)
    assert set(memo._hot) == {system, again} and memo._hot_ids <= sum(sizes) + 10
    assert memo._hot_ids == sum(len(ids) for ids in memo._hot.values())


def test_bpe_dropout_gets_no_memo():
    """With dropout each encoding is a random draw: remembered pieces would freeze one of them."""
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate("abc<>x")}, merges=[], dropout=0.5))
    tok.add_special_tokens([AddedToken("<x>", special=True, normalized=False)])
    assert TokenizerJson(tok, {})._segment_memo() is None


def test_encoding_special_token_text_as_text_never_changes_other_threads_encodings(kimi_tok_dir):
    """`split_special_tokens` (a dataset's literal text) once flipped a flag on the tokenizer every thread shares:
    a render encoded at that moment had its markers as text."""
    native = _native(kimi_tok_dir)
    marker = "<|im_end|>"
    marker_id = native.encode(marker, add_special_tokens=False)
    assert len(marker_id) == 1
    native._literal_tokenizer()  # built before the threads run, so that they overlap from the first call
    stop = threading.Event()
    wrong: list[list[int]] = []
    literal_calls: list[list[int]] = []

    def literal() -> None:
        while not stop.is_set():
            literal_calls.append(native.encode(marker, add_special_tokens=False, split_special_tokens=True))

    thread = threading.Thread(target=literal)
    thread.start()
    try:
        for _ in range(2000):
            got = native.encode("hi" + marker, add_special_tokens=False)
            if got[-1:] != marker_id:
                wrong.append(got)
    finally:
        stop.set()
        thread.join()
    assert wrong == []
    assert len(literal_calls) > 10 and all(len(ids) > 1 for ids in literal_calls)  # text, not the marker's id


def test_a_tokenizer_with_its_memo_and_literal_copy_can_still_be_copied(kimi_tok_dir):
    """`copy.deepcopy` of a tokenizer (an export copies one to change its template) once failed on the locks: a
    copy starts with an empty memo and no literal copy, and encodes as the original does."""
    import copy
    import pickle

    native = _native(kimi_tok_dir)
    text = "<|im_end|>".join(["a long piece of text " * 5] * 200)
    ids = native.encode_rendered(text)
    literal = native.encode("<|im_end|>", split_special_tokens=True)
    for twin in (copy.deepcopy(native), pickle.loads(pickle.dumps(native))):
        memo = twin._segment_memo()
        assert memo is not None and memo is not native._segment_memo() and not memo._pieces  # starts empty
        assert twin._literal is None
        assert memo._encode_many.__self__ is twin  # encodes with its own tokenizer
        assert twin.encode_rendered(text) == ids and twin.encode("<|im_end|>", split_special_tokens=True) == literal


def test_the_memo_is_built_at_the_first_long_text_not_at_a_short_render(kimi_tok_dir, tmp_path):
    """Building it (the markers' pattern, 8 ms on Kimi's 256) at start-up's first render held back a one-prompt run's
    first request; a short text is encoded whole either way."""
    from tokview.core.kimi_layout import build_kimi_tiktoken_dir
    from tokview.core.tokenizer import load_tokenizer

    short, long = "<|im_end|>hello" * 10, "<|im_end|>a long piece of text " * 200
    for native in (_native(kimi_tok_dir), load_tokenizer(build_kimi_tiktoken_dir(tmp_path / "tiktoken")).tok):
        assert native.encode_rendered(short) == native.encode(short, add_special_tokens=False)
        assert native._memo is False  # not built yet
        assert native.encode_rendered(long) == native.encode(long, add_special_tokens=False)
        assert native._memo  # built now
