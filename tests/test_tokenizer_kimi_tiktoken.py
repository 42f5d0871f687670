"""Kimi's tiktoken tokenizer read natively: no folder code, no --trust-remote-code, ids equal tiktoken's.

The folder is built by our own code (`build_kimi_tiktoken_dir`: 163,584 base tokens, Kimi's special
names in `added_tokens_decoder`, `auto_map` → tokenization_kimi.TikTokenTokenizer) plus a
`tokenization_kimi.py` booby trap that records any import. The reference is a `tiktoken.Encoding` built
here from the same ranks, the split pattern as the issue spells it, and the special tokens Kimi's file
derives; long inputs are cut with a line-by-line port of Kimi's `_split_whitespaces_or_nonwhitespaces`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokview.core.kimi_layout import KIMI_SPECIAL_TOKENS, build_kimi_tiktoken_dir, kimi_tiktoken_ranks
from tokview.core.kimi_tiktoken import split_for_encoding
from tokview.core.tokenizer import LOADED_NATIVE_TIKTOKEN, TokenizerError, load_tokenizer

# The pattern exactly as Kimi's tokenization_kimi.py (and the issue) spells it, kept apart from the module's copy.
PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

TRAP = """
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("tokenization_kimi.py was imported")
raise RuntimeError("tokview must not import a model folder's code")
"""


def kimi_split(s: str, max_len: int):
    """Kimi's `_split_whitespaces_or_nonwhitespaces`, transcribed."""
    current_slice_len = 0
    current_slice_is_space = s[0].isspace() if len(s) > 0 else False
    slice_start = 0
    for i in range(len(s)):
        is_now_space = s[i].isspace()
        if current_slice_is_space ^ is_now_space:
            current_slice_len = 1
            current_slice_is_space = is_now_space
        else:
            current_slice_len += 1
            if current_slice_len > max_len:
                yield s[slice_start:i]
                slice_start = i
                current_slice_len = 1
    yield s[slice_start:]


def kimi_pieces(text: str, chunk: int = 400_000, run: int = 25_000) -> list[str]:
    return [p for i in range(0, len(text), chunk) for p in kimi_split(text[i : i + chunk], run)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = build_kimi_tiktoken_dir(tmp_path_factory.mktemp("kimi-tiktoken"))
    (d / "tokenization_kimi.py").write_text(TRAP)
    return d


@pytest.fixture(scope="module")
def tok(folder):
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def reference():
    import tiktoken

    ranks = kimi_tiktoken_ranks()
    n = len(ranks)
    names = {i: KIMI_SPECIAL_TOKENS.get(i, f"<|reserved_token_{i}|>") for i in range(n, n + 258)}
    return tiktoken.Encoding(
        name="reference", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={s: i for i, s in names.items()}
    )


def reference_ids(enc, text: str) -> list[int]:
    return [i for p in kimi_pieces(text) for i in enc.encode(p, allowed_special="all")]


CORPUS = [
    "中文分词测试：今天天气很好，我们去公园吧。",
    "Hello World HELLO world hELLo",
    "I'M sure you'RE right, DON'T they've we'll she'd it's",
    "1 12 123 1234 12345 1234567890 3.14159 2026-11-30",
    "   leading\tand\ttabs\n\n\n   trailing   \r\n\r\n  \u3000\u00a0end  ",
    "emoji 👍🏽 🎉🎉 👨‍👩‍👧 and ❤️ mixed with 中文 and English",
    "<|im_user|>user<|im_middle|>What is 6 times 7?<|im_end|><|im_assistant|>assistant<|im_middle|><think>",
    "".join(KIMI_SPECIAL_TOKENS.values())
    + "".join(f"<|reserved_token_{i}|>" for i in range(163584, 163842) if i not in KIMI_SPECIAL_TOKENS),
    "abc" * 10_000,  # a 30,000-character run: Kimi cuts it at 25,000, and here that changes the ids
    "x " + " " * 30_000 + "y",
    "Mixed Case Words and 数字 123 " * 16_000,  # 464,000 characters: two 400,000-character chunks
]


def test_loads_natively_without_running_folder_code(folder, tok):
    assert tok.loaded_by == LOADED_NATIVE_TIKTOKEN
    assert not (folder / "IMPORTED").exists()
    assert "tokenization_kimi" not in sys.modules
    assert type(tok.tok).__module__ == "tokview.core.kimi_tiktoken"


def test_loading_imports_no_transformers(folder):
    """The native path is also the quick one: neither transformers nor folder code is imported."""
    code = (
        "import sys\nfrom tokview.core.tokenizer import load_tokenizer\n"
        f"tok = load_tokenizer({str(folder)!r})\n"
        "assert tok.encode('<think>') == [163606]\n"
        "assert 'transformers' not in sys.modules and 'tokenization_kimi' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_special_ids_follow_kimi(tok):
    assert tok.vocab_size == 163584 + 258
    for i, name in KIMI_SPECIAL_TOKENS.items():
        assert tok.token_to_id(name) == i
        assert tok.tok.convert_ids_to_tokens(i) == name
        assert tok.encode(name) == [i]
    for i in (163589, 163592, 163840, 163841):
        assert tok.tok.convert_ids_to_tokens(i) == f"<|reserved_token_{i}|>"
        assert tok.encode(f"<|reserved_token_{i}|>") == [i]
    assert tok.tok.convert_ids_to_tokens(163842) is None
    assert (tok.tok.bos_token_id, tok.eos_token_id) == (163584, 163585)
    assert tok.is_special(163586)
    assert tok.is_special(163606)
    assert not tok.is_special(100)
    assert tok.pieces([163587, 163606, 163589]) == ["<|im_user|>", "<think>", "<|reserved_token_163589|>"]


@pytest.mark.parametrize("index", range(len(CORPUS)))
def test_ids_equal_tiktoken_and_decode_round_trips(tok, reference, index):
    text = CORPUS[index]
    ids = tok.encode(text)
    assert ids == reference_ids(reference, text)
    assert tok.decode(ids) == text


def test_long_run_cut_matters(reference):
    """The 30,000-character case would pass without the cut only if cutting changed nothing: it does."""
    text = "abc" * 10_000
    assert reference_ids(reference, text) != reference.encode(text, allowed_special="all")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab \t\n\u3000é中"), max_size=60), st.integers(1, 7), st.integers(1, 5))
def test_split_matches_kimi(text, chunk, run):
    assert list(split_for_encoding(text, chunk=chunk, run=run)) == kimi_pieces(text, chunk, run)


def test_split_special_tokens_encodes_the_text(tok):
    ids = tok.tok("<think>", add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert 163606 not in ids
    assert tok.decode(ids) == "<think>"


def test_skip_special_tokens_drops_what_transformers_drops(tok):
    ids = tok.encode("[BOS]hi<|im_end|><think>x")
    # bos/eos/unk/pad and additional_special_tokens go; <think> is not one of them in Kimi's class.
    assert tok.decode(ids, skip_special_tokens=True) == "hi<think>x"


def test_template_renders_as_transformers_does(tok, kimi_tok):
    """Same template, same messages: the native renderer and transformers' agree character for character."""
    conversations = [
        [{"role": "user", "content": "What is 6 times 7?"}],
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "U"}]},
            {"role": "assistant", "content": "A", "reasoning_content": "R"},
            {"role": "user", "content": "again"},
        ],
    ]
    for messages in conversations:
        for kwargs in ({}, {"thinking": False}, {"thinking": True}):
            assert tok.render_text(messages, template_kwargs=kwargs) == kimi_tok.render_text(
                messages, template_kwargs=kwargs
            )
    prompt = tok.render(conversations[0])
    assert prompt[0] == 163587
    assert prompt[-1] == 163606


def test_generation_tag_and_builtins_render(tmp_path, folder):
    import shutil

    d = tmp_path / "k"
    shutil.copytree(folder, d)
    (d / "chat_template.jinja").write_text(
        "{% for m in messages %}{% generation %}{{ m.content | tojson }}{% endgeneration %}{% endfor %}"
        "{{ bos_token }}{% if add_generation_prompt %}<|im_assistant|>{% endif %}"
    )
    tok = load_tokenizer(d)
    assert tok.render_text([{"role": "user", "content": "<b>é</b>"}]) == '"<b>é</b>"[BOS]<|im_assistant|>'


def test_vocab_fingerprint_and_fingerprint(tok, folder):
    assert len(tok.vocab_fingerprint()) == 16
    assert len(tok.fingerprint()) == 16
    assert len(tok.tok.get_vocab()) == 163584 + 258


@pytest.mark.parametrize(
    "content, message",
    [
        ("bm90IGEgbGluZQ==\n", "line 1 is not a 'base64-token rank' line"),
        ("YQ== 0\nYg== 2\n", "ranks are not 0..1"),
        ("", "holds no tokens"),
    ],
)
def test_broken_tiktoken_model_is_one_line(tmp_path, folder, content, message):
    import shutil

    d = tmp_path / "k"
    shutil.copytree(folder, d)
    (d / "tiktoken.model").write_text(content)
    with pytest.raises(TokenizerError, match=re.escape(message)) as info:
        load_tokenizer(d)
    assert "\n" not in str(info.value)


def test_unknown_role_token_is_one_line(tmp_path, folder):
    import shutil

    d = tmp_path / "k"
    shutil.copytree(folder, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["eos_token"] = "<|nope|>"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TokenizerError, match=re.escape("eos_token '<|nope|>'")):
        load_tokenizer(d)


def test_a_rendered_prompt_encoded_by_remembered_pieces_gives_the_same_ids(tok):
    """`encode_rendered` (an agent's next prompt repeats its conversation: pieces between special tokens are
    remembered) equals `encode` on every text here, long runs and 400,000-character chunks included, and on
    random texts of special tokens and text around them, the first time and again."""
    import random

    native = tok.tok
    specials = list(KIMI_SPECIAL_TOKENS.values())
    rng = random.Random(5)
    fillers = [" ", "\n", "hello", " World", "123", "中文", "👍🏽", "<|", "|>", "\u3000", "'s", "x" * 50]
    texts = [*CORPUS, *("".join(rng.choices(specials + fillers * 3, k=rng.randint(1, 600))) for _ in range(60))]
    texts.append(CORPUS[6] * 300)  # a conversation-like prompt past the length the memo starts at
    for _round in range(2):
        for text in texts:
            assert native.encode_rendered(text) == native.encode(text), repr(text[:80])
    assert native._memo is not None and native._memo._pieces  # the memo was used, and holds pieces


PLAIN_RANKS_CASES = [
    "YQ== 0\nYg== 1\nYWI= 2\n",  # plain: read in passes
    "YQ== 0\nYg== 1\nYWI= 2",  # no newline at the end
    "Yg== 1\nYQ== 0\n",  # ranks out of order: a permutation, read line by line
    "YQ== 0\n\nYg== 1\n",  # a blank line
    "YQ== 0\r\nYg== 1\r\n",  # CRLF
    "YQ==\t0\nYg== 1\n",  # a tab
    "YQ==  0\nYg== 1\n",  # two spaces
    " YQ== 0\nYg== 1\n",  # a space at a line's start
    "YQ== 0 \nYg== 1\n",  # ... and at its end
    "YQ== 0 7\nYg==\n",  # three fields, then one: as many fields as two lines hold
    "YQ=a 0\nYg== 1\n",  # padding inside a token
    "YQ=== 0\nYg== 1\n",  # three of it
    "== 0\nYg== 1\n",  # a token of padding alone
    "YQ== 0\n== 1\n",
    "YWJj 0\nYQ= 1\n",  # a length base64 does not allow
    "QUI== 0\n",  # ... which the lenient decoder takes (b"AB"), with padding in its place
    "wAQ== 0\nYg== 1\n",
    "YQ== 0\nYg== +1\n",  # a rank with a sign
    "YQ== 0\nYg== 01\n",  # ... with a leading zero
    "YQ== 0\nYQ== 1\n",  # one token twice
    "YQ== 0\nYg== x\n",  # a rank that is not a number
    "YQ== 0\nYg==\n",  # a line of one field
    "\n",
]


@pytest.mark.parametrize("content", PLAIN_RANKS_CASES)
def test_plain_ranks_read_in_passes_as_line_by_line(tmp_path, content):
    """The fast reader of a plain `tiktoken.model` gives exactly what the line-by-line reader gives, or leaves the
    file to it (which then reads it, or says what is wrong): never other ranks, never a file the other refuses."""
    from tokview.core.kimi_tiktoken import _plain_ranks, _ranks_by_line, read_tiktoken_ranks
    from tokview.core.tokenizer_folder import FolderError

    path = tmp_path / "tiktoken.model"
    path.write_bytes(content.encode())
    fast = _plain_ranks(content.encode())
    try:
        by_line: dict[bytes, int] | str = _ranks_by_line(path, content.encode())
    except FolderError as exc:
        by_line = str(exc)
    if fast is not None:
        assert fast == by_line and list(fast.values()) == list(range(len(fast)))
    try:
        read: dict[bytes, int] | str = read_tiktoken_ranks(path)
    except FolderError as exc:
        read = str(exc)
    assert read == by_line or (isinstance(read, str) and isinstance(by_line, dict)), (read, by_line)


def test_plain_ranks_of_the_kimi_layout_are_read_in_passes(folder):
    """Kimi's own file is plain: the fast reader reads it, and to the same ranks as line by line."""
    from tokview.core.kimi_tiktoken import _plain_ranks, _ranks_by_line

    path = folder / "tiktoken.model"
    data = path.read_bytes()
    fast = _plain_ranks(data)
    assert fast is not None and len(fast) == 163584
    assert fast == _ranks_by_line(path, data)
