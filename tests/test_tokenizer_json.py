"""A generic fast tokenizer is read from tokenizer.json without transformers, and gives transformers' answers.

`tokview batch` spent most of its start-up importing transformers, and transformers' Python wrapper
cost more per sample than the Rust encode itself. The native reader (`core/tokenizer_json.py`) must be
indistinguishable from transformers on every folder it accepts: same ids, texts, special ids, vocabulary
(so sample ids and resumes do not change), pieces and rendered prompts. Each folder below is loaded both
ways and compared; folders transformers would alter while loading go to transformers, as before.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys

import pytest

from tokview.core.tokenizer import TokenizerAdapter, _load_with_transformers, load_tokenizer
from tokview.core.tokenizer_folder import TokenizerFolder
from tokview.core.tokenizer_json import TokenizerJson

TEXTS = [
    "Okay, let me think about this carefully.",
    "<|im_user|>user<|im_middle|>hi<|im_end|><think>",
    "<|im_start|>assistant\n<think>\nfine</think>\n\nThe answer is 42.<|im_end|>",
    "中文 and émoji 👍 1234567 ﬁ Ångström",
    "   spaces\n\n\ttabs \r\n  ",
    "",
    "[BOS] [EOS] <|endoftext|> [PAD] plain words",
    "a" * 300 + " " + "b c " * 50,
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is 6 times 7?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "中文?"},
    ],
]


def _copy(tmp_path, source, name, config_changes=None, drop=()):
    d = tmp_path / name
    shutil.copytree(source, d)
    if config_changes is not None:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg.update(config_changes)
        for key in drop:
            cfg.pop(key, None)
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def _both(d) -> tuple[TokenizerAdapter, TokenizerAdapter]:
    native = load_tokenizer(d)
    reference = _load_with_transformers(TokenizerFolder.open(d), False)
    return native, reference


def _assert_same(native: TokenizerAdapter, ref: TokenizerAdapter, template_kwargs=None) -> None:
    assert isinstance(native.tok, TokenizerJson)
    assert native.loaded_by == ref.loaded_by
    assert native.vocab_fingerprint() == ref.vocab_fingerprint()  # sample ids, so resumes, do not move
    assert native.fingerprint() == ref.fingerprint()
    assert native.vocab_size == ref.vocab_size
    assert native.special_ids == ref.special_ids
    assert native.added_ids == ref.added_ids
    assert native._control_ids == ref._control_ids
    assert native.eos_token_id == ref.eos_token_id
    assert native.model_max_length == ref.model_max_length
    assert native.chat_template == ref.chat_template
    for attr in ("bos_token_id", "unk_token_id", "pad_token_id"):
        assert getattr(native.tok, attr) == getattr(ref.tok, attr), attr
    for text in TEXTS:
        ids = ref.encode(text)
        assert native.encode(text) == ids, text
        assert native.decode(ids) == ref.decode(ids)
        assert native.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
        assert native.tok.encode(text, add_special_tokens=True) == ref.tok.encode(text, add_special_tokens=True)
        split = native.tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert split == list(ref.tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
        assert native.pieces(ids) == ref.pieces(ids)
    rng = random.Random(7)
    ids = [rng.randrange(native.vocab_size) for _ in range(3000)] + sorted(ref.special_ids)
    assert native.decode(ids) == ref.decode(ids)
    assert native.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    for _ in range(300):  # short random runs: split and invalid UTF-8 sequences, specials, unknown ids
        some = [rng.choice(ids) if rng.random() < 0.9 else native.vocab_size + rng.randrange(9) for _ in range(6)]
        for skip in (False, True):
            assert native.decode(some, skip_special_tokens=skip) == native.tok._tokenizer.decode(
                some, skip_special_tokens=skip
            )
            assert native.decode(some, skip_special_tokens=skip) == ref.decode(some, skip_special_tokens=skip)
    assert native.pieces_bytes(ids) == [ref.piece_bytes(i) for i in ids]
    assert native.special_flags(ids) == [ref.is_special(i) for i in ids]
    assert native.tok.convert_ids_to_tokens(ids[:500]) == ref.tok.convert_ids_to_tokens(ids[:500])
    assert [native.piece_bytes(i) for i in ids[:500]] == [ref.piece_bytes(i) for i in ids[:500]]
    for token in ("<|im_end|>", "no-such-token-anywhere", "a"):
        assert native.token_to_id(token) == ref.token_to_id(token)
    for messages in CONVERSATIONS:
        for generation in (True, False):
            assert native.render_text(
                messages, add_generation_prompt=generation, template_kwargs=template_kwargs
            ) == ref.render_text(messages, add_generation_prompt=generation, template_kwargs=template_kwargs)
            assert native.render(messages, template_kwargs=template_kwargs) == ref.render(
                messages, template_kwargs=template_kwargs
            )


def test_kimi_layout_reads_natively_and_matches_transformers(kimi_tok_dir):
    for thinking in (True, False):
        _assert_same(*_both(kimi_tok_dir), template_kwargs={"thinking": thinking})


@pytest.mark.parametrize("tokenizer_class", ["PreTrainedTokenizerFast", "TokenizersBackend"])
def test_a_real_vocabulary_under_the_generic_class_matches(tmp_path, qwen_tok_dir, tokenizer_class):
    """Qwen3's 151k-entry byte-level BPE with its added tokens, extra special tokens and real template."""
    d = _copy(tmp_path, qwen_tok_dir, "qwen-generic", {"tokenizer_class": tokenizer_class})
    if tokenizer_class == "TokenizersBackend":  # transformers 5's own spelling of the extra tokens
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["extra_special_tokens"] = cfg.pop("additional_special_tokens")
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    for thinking in (True, False):
        _assert_same(*_both(d), template_kwargs={"enable_thinking": thinking})


def test_batch_start_up_never_imports_transformers(kimi_tok_dir):
    code = (
        "import sys\n"
        "from tokview.core.resolve import load_tokenizer_and_profile\n"
        f"tok, profile = load_tokenizer_and_profile({str(kimi_tok_dir)!r}, None)\n"
        "tok.decode(tok.render([{'role': 'user', 'content': 'hi'}]))\n"
        "print(type(tok.tok).__name__, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["TokenizerJson", "False"]


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"add_bos_token": True}, "transformers rewrites the post-processor"),
        ({"add_prefix_space": True}, "transformers rewrites the pre-tokenizer"),
        ({"pad_token": "<|a token tokenizer.json lacks|>"}, "transformers adds the token"),
        ({"extra_special_tokens": {"image_token": "[PAD]"}}, "named extra tokens become roles"),
        ({"clean_up_tokenization_spaces": True}, "decoded spaces get cleaned up"),
        ({"tokenizer_class": "Qwen2Tokenizer"}, "a model class may rebuild parts in code (test_tokenizer_equivalence)"),
    ],
)
def test_folders_transformers_would_alter_still_load_through_it(tmp_path, kimi_tok_dir, changes, why, monkeypatch):
    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))  # no verdict yet on a model class's folder
    d = _copy(tmp_path, kimi_tok_dir, "altered", changes)
    tok = load_tokenizer(d)
    assert not isinstance(tok.tok, TokenizerJson), why
    reference = _load_with_transformers(TokenizerFolder.open(d), False)
    assert tok.encode(TEXTS[1]) == reference.encode(TEXTS[1])


def test_added_token_the_config_declares_differently_goes_to_transformers(tmp_path, kimi_tok_dir):
    cfg = json.loads((kimi_tok_dir / "tokenizer_config.json").read_text())
    first = next(iter(cfg["added_tokens_decoder"]))
    d = _copy(tmp_path, kimi_tok_dir, "declared")
    cfg["added_tokens_decoder"][first] = {**cfg["added_tokens_decoder"][first], "content": "<|renamed|>"}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert TokenizerJson.from_folder(TokenizerFolder.open(d)) is None


def test_decode_from_kept_bytes_is_the_byte_level_decoders(tmp_path, kimi_tok_dir):
    """Added tokens outside the byte alphabet (a space, a CJK character) decode to their UTF-8; others map."""
    from tokenizers import AddedToken as RustAddedToken

    native = load_tokenizer(kimi_tok_dir).tok
    assert native._byte_level
    native._tokenizer.add_tokens([RustAddedToken("a b", special=False), RustAddedToken("中", special=True)])
    native._special_contents = native._special_contents | {"中"}
    extra = [native._tokenizer.token_to_id("a b"), native._tokenizer.token_to_id("中")]
    ids = [*native.encode("Hello ĠÄ é"), *extra, 163586, 163586 + 10**6]
    for skip in (False, True):
        assert native.decode(ids, skip_special_tokens=skip) == native._tokenizer.decode(ids, skip_special_tokens=skip)
    with pytest.raises(OverflowError):
        native.decode([5, -1])


def test_truncation_saved_in_the_file_goes_to_transformers(tmp_path, kimi_tok_dir):
    d = _copy(tmp_path, kimi_tok_dir, "truncating")
    data = json.loads((d / "tokenizer.json").read_text())
    data["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    (d / "tokenizer.json").write_text(json.dumps(data))
    assert TokenizerJson.from_folder(TokenizerFolder.open(d)) is None
    assert len(load_tokenizer(d).encode(TEXTS[0] * 4)) > 8  # and transformers does not truncate either


def test_the_native_readers_byte_alphabet_is_gpt2s() -> None:
    from tokenizers.pre_tokenizers import ByteLevel

    from tokview.core.tokenizer import bytes_to_unicode
    from tokview.core.tokenizer_folder import byte_alphabet, byte_of_character

    assert byte_alphabet() == bytes_to_unicode()
    assert sorted(byte_of_character()) == sorted(ByteLevel.alphabet())
