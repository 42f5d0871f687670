"""Which tokenizer and profile a command analyses with: named, else recorded by the run, else the default."""

import pytest

from tokview.core.resolve import resolve_for_stored, resolve_tokenizer_and_profile
from tokview.core.tokenizer import TokenizerError


def test_default_is_the_kimi_layout(kimi_tok_dir):
    tok, profile = resolve_tokenizer_and_profile()
    assert tok.source == kimi_tok_dir and profile.name == "kimi-k2.5"


def test_recorded_run_wins_over_the_default(qwen_tok_dir):
    tok, profile = resolve_for_stored(None, None, recorded_tokenizer_dir=str(qwen_tok_dir), recorded_profile="qwen3")
    assert tok.source == qwen_tok_dir and profile.name == "qwen3"


def test_named_wins_over_recorded(qwen_tok_dir, kimi_tok_dir):
    tok, profile = resolve_for_stored(kimi_tok_dir, "kimi-k2.5", recorded_tokenizer_dir=str(qwen_tok_dir),
                                      recorded_profile="qwen3")
    assert tok.source == kimi_tok_dir and profile.name == "kimi-k2.5"


def test_custom_recorded_profile_is_detected(qwen_tok_dir):
    _, profile = resolve_for_stored(None, None, recorded_tokenizer_dir=str(qwen_tok_dir), recorded_profile="my-glm")
    assert profile.think_open_id == 151667


def test_gone_recorded_folder_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerError, match="pass --tokenizer"):
        resolve_for_stored(None, None, recorded_tokenizer_dir=str(tmp_path / "gone"), recorded_profile=None)


def test_loaded_tokenizer_is_reused(qwen_tok):
    tok, profile = resolve_for_stored(None, None, recorded_tokenizer_dir="/nonexistent", recorded_profile="qwen3",
                                      tokenizer=qwen_tok)
    assert tok is qwen_tok and profile.name == "qwen3"
