"""Which tokenizer and profile a command analyses with: named, else recorded by the run, else the default."""

import pytest

from tokview.core.resolve import load_tokenizer_and_profile, resolve_for_stored
from tokview.core.tokenizer import TokenizerError


def test_default_is_the_kimi_layout(kimi_tok_dir):
    tok, profile = load_tokenizer_and_profile()
    assert tok.source == kimi_tok_dir
    assert profile.name == "kimi-k2.5"


def test_recorded_run_wins_over_the_default(qwen_tok_dir):
    tok, profile = resolve_for_stored(None, None, recorded_tokenizer_dir=str(qwen_tok_dir), recorded_profile="qwen3")
    assert tok.source == qwen_tok_dir
    assert profile.name == "qwen3"


def test_named_wins_over_recorded(qwen_tok_dir, kimi_tok_dir):
    tok, profile = resolve_for_stored(
        kimi_tok_dir, "kimi-k2.5", recorded_tokenizer_dir=str(qwen_tok_dir), recorded_profile="qwen3"
    )
    assert tok.source == kimi_tok_dir
    assert profile.name == "kimi-k2.5"


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
    assert tok is qwen_tok
    assert profile.name == "qwen3"


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
    """`export --trust-remote-code` without --tokenizer names both flags to pass, not --trust-remote-code alone."""
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
    assert tok.loaded_by == "native tiktoken"
    assert profile.name == "kimi-k2.5"


def test_a_runs_recorded_profile_wins_over_a_builtin_of_the_same_name(qwen_tok_dir, tmp_path):
    """A .toml profile named like a built-in (`base = "qwen3"` inherits the name) was swapped for the
    built-in when `show`, the app or `export` read its run back: other delimiters, other stops."""
    from tokview.core.profiles import load_profile_toml, profile_fields

    toml = tmp_path / "glm.toml"
    toml.write_text('base = "qwen3"\nthink_open_id = 7\nthink_close_id = 8\nstop_ids = [4, 0]\n')
    custom = load_profile_toml(toml)
    assert custom.name == "qwen3"
    _, got = resolve_for_stored(
        None,
        None,
        recorded_tokenizer_dir=str(qwen_tok_dir),
        recorded_profile="qwen3",
        recorded_profile_def=profile_fields(custom),
    )
    assert got == custom
    assert got.stop_ids == (4, 0)
    _, named = resolve_for_stored(  # a profile named on the command line still wins
        None,
        "qwen3",
        recorded_tokenizer_dir=str(qwen_tok_dir),
        recorded_profile="qwen3",
        recorded_profile_def=profile_fields(custom),
    )
    assert named.think_open_id == 151667
    _, old = resolve_for_stored(  # a run recorded before profiles were kept whole: the built-in, as before
        None, None, recorded_tokenizer_dir=str(qwen_tok_dir), recorded_profile="qwen3", recorded_profile_def=None
    )
    assert old.think_open_id == 151667


def test_a_detected_reasoning_profile_stops_on_generation_config_eos_ids(qwen_tok_dir, tmp_path):
    """Servers stop on generation_config.json's eos ids (GLM ends turns on <|user|>): a detected profile
    that left them out called every healthy sample's last id answer text (`no_stop_token`)."""
    import json
    import shutil

    from tokview.core.profiles import detect_profile
    from tokview.core.tokenizer import load_tokenizer

    folder = tmp_path / "q"
    shutil.copytree(qwen_tok_dir, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151644]}))
    profile = detect_profile(load_tokenizer(folder))
    assert 151644 in profile.stop_ids
    assert 151645 in profile.stop_ids
    assert 151644 not in detect_profile(load_tokenizer(qwen_tok_dir)).stop_ids


@pytest.mark.parametrize(
    "toml, message",
    [
        ('base = "qwen3"\nthink_open_id = 99999999\n', "think_open_id = 99999999 is not an id of this tokenizer"),
        ('base = "qwen3"\nthink_open_id = 151668\n', "the think opener and closer are the same id (151668)"),
        ('base = "qwen3"\nstop_ids = [151667]\n', "stop id 151667 is also a think delimiter"),
        ('base = "qwen3"\nstop_ids = [151645, 151700]\n', "stop_ids[1] = 151700 is not an id of this tokenizer"),
        ('base = "qwen3"\nthink_open_id = 1000\n', "think_open_id 1000 is "),
    ],
)
def test_a_named_profile_that_does_not_fit_the_tokenizer_is_refused(qwen_tok_dir, tmp_path, toml, message):
    from tokview.core.profiles import ProfileError

    path = tmp_path / "p.toml"
    path.write_text(toml)
    with pytest.raises(ProfileError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_tokenizer_and_profile(qwen_tok_dir, str(path))


def test_another_familys_profile_is_refused_by_its_delimiters(qwen_tok_dir):
    """`--profile deepseek-r1` on a Qwen3 tokenizer split every sample on ' того' and ' thủ'."""
    from tokview.core.profiles import ProfileError

    with pytest.raises(ProfileError, match="think_open_id 128798 is ' того' in this tokenizer, not '<think>'"):
        load_tokenizer_and_profile(qwen_tok_dir, "deepseek-r1")
    assert load_tokenizer_and_profile(qwen_tok_dir, "qwen3")[1].name == "qwen3"
