"""Which tokenizer and profile a command analyses with: named, else recorded by the run, else the default."""

import pytest

from tokview.core.resolve import load_tokenizer_and_profile, resolve_for_stored
from tokview.core.tokenizer import TokenizerError


def test_default_is_the_kimi_layout(kimi_tok_dir):
    tok, profile = load_tokenizer_and_profile()
    assert tok.source == kimi_tok_dir and profile.name == "kimi-k2.5"


def test_recorded_run_wins_over_the_default(qwen_tok_dir):
    tok, profile = resolve_for_stored(None, None, recorded_tokenizer_dir=str(qwen_tok_dir), recorded_profile="qwen3")
    assert tok.source == qwen_tok_dir and profile.name == "qwen3"


def test_named_wins_over_recorded(qwen_tok_dir, kimi_tok_dir):
    tok, profile = resolve_for_stored(
        kimi_tok_dir, "kimi-k2.5", recorded_tokenizer_dir=str(qwen_tok_dir), recorded_profile="qwen3"
    )
    assert tok.source == kimi_tok_dir and profile.name == "kimi-k2.5"


def test_custom_recorded_profile_is_detected(qwen_tok_dir):
    _, profile = resolve_for_stored(None, None, recorded_tokenizer_dir=str(qwen_tok_dir), recorded_profile="my-glm")
    assert profile.think_open_id == 151667


def test_gone_recorded_folder_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerError, match="pass --tokenizer"):
        resolve_for_stored(None, None, recorded_tokenizer_dir=str(tmp_path / "gone"), recorded_profile=None)


def test_loaded_tokenizer_is_reused(qwen_tok):
    tok, profile = resolve_for_stored(
        None, None, recorded_tokenizer_dir="/nonexistent", recorded_profile="qwen3", tokenizer=qwen_tok
    )
    assert tok is qwen_tok and profile.name == "qwen3"


def _code_folder(tmp_path, kimi_tok_dir):
    """A folder whose tokenizer class only its own code defines (not Kimi's, which loads natively)."""
    import json
    import shutil

    d = tmp_path / "custom"
    d.mkdir()
    shutil.copy(kimi_tok_dir / "tokenizer.json", d / "tokenizer.json")
    (d / "tokenization_custom.py").write_text("raise RuntimeError('never imported')\n")
    (d / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "CustomTokenizer",
                "auto_map": {"AutoTokenizer": ["tokenization_custom.CustomTokenizer", None]},
            }
        )
    )
    return d


@pytest.mark.parametrize("flag", [False, True])
def test_recorded_folder_with_code_names_the_exact_flags(tmp_path, kimi_tok_dir, flag):
    """`export --trust-remote-code` without --tokenizer used to answer "pass --trust-remote-code" again."""
    d = _code_folder(tmp_path, kimi_tok_dir)
    with pytest.raises(TokenizerError) as info:
        resolve_for_stored(None, None, recorded_tokenizer_dir=str(d), recorded_profile=None, trust_remote_code=flag)
    message = str(info.value)
    assert message.endswith(f": pass --tokenizer {d} --trust-remote-code")
    assert ("applies only to a folder named on the command line" in message) == flag


def test_recorded_kimi_tiktoken_folder_needs_no_flag(tmp_path):
    from tokview.core.kimi_layout import build_kimi_tiktoken_dir

    d = build_kimi_tiktoken_dir(tmp_path / "kimi")
    tok, profile = resolve_for_stored(None, None, recorded_tokenizer_dir=str(d), recorded_profile="kimi-k2.5")
    assert tok.loaded_by == "native tiktoken" and profile.name == "kimi-k2.5"
