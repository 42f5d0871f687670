"""Profiles describe a format (think tags, Harmony channels, plain), how the template treats history
reasoning, and the thinking/effort kwargs; the built-ins gpt-oss, glm-4.5, glm-4.7 and kimi-k2.6; profile
files for a new family of either kind; the existing profiles unchanged."""

from __future__ import annotations

import pytest

from tokview.core.profiles import (
    BUILTIN_PROFILES,
    HARMONY,
    PLAIN,
    THINK,
    ProfileError,
    get_profile,
    profile_fields,
    profile_from_fields,
)


def test_every_builtin_names_its_format_and_history_rule():
    formats = {name: (p.format, p.history_reasoning) for name, p in BUILTIN_PROFILES.items()}
    assert formats["gpt-oss"] == (HARMONY, "last_loop")
    assert formats["plain"] == (PLAIN, "none")
    for name in ("kimi-k2.5", "kimi-k2-thinking", "qwen3", "deepseek-r1", "glm-4.5", "glm-4.7", "kimi-k2.6"):
        assert formats[name][0] == THINK, name


def test_the_new_builtins():
    oss, glm45, glm47, k26 = (get_profile(n) for n in ("gpt-oss", "glm-4.5", "glm-4.7", "kimi-k2.6"))
    assert not oss.has_reasoning
    assert oss.effort_kwarg == "reasoning_effort"
    assert oss.reasoning_parser == "openai_gptoss"
    assert set(oss.stop_ids) == {200002, 200012, 199999}
    assert (glm45.think_open_id, glm45.think_close_id, glm45.prefills_opener) == (151350, 151351, False)
    assert (glm47.prefills_opener, glm47.history_kwarg) == (True, "clear_thinking")
    assert k26.history_kwarg == "preserve_thinking"
    assert k26.tool_calls == get_profile("kimi-k2.5").tool_calls
    assert get_profile("harmony") is oss


def test_existing_profiles_keep_their_fields():
    k25 = get_profile("kimi-k2.5")
    assert (k25.think_open_id, k25.think_close_id, k25.stop_ids, k25.prefills_opener) == (
        163606,
        163607,
        (163586,),
        True,
    )
    assert (k25.format, k25.history_reasoning, k25.effort_kwarg) == (THINK, "after_last_user", None)
    assert get_profile("qwen3").template_kwargs(True) == {"enable_thinking": True}


def test_a_recorded_profile_reads_back_with_its_format_and_an_older_row_as_think():
    oss = get_profile("gpt-oss")
    assert profile_from_fields(profile_fields(oss)) == oss
    older = profile_fields(get_profile("qwen3"))
    for key in ("format", "history_reasoning", "history_kwarg", "effort_kwarg"):
        older.pop(key)
    assert profile_from_fields(older) == get_profile("qwen3")


def test_a_profile_file_describes_a_new_harmony_family(tmp_path):
    path = tmp_path / "my-oss.toml"
    path.write_text('base = "gpt-oss"\nname = "my-oss"\nstop_ids = [200002, 200012]\n', encoding="utf-8")
    p = get_profile(str(path))
    assert (p.name, p.format, p.stop_ids, p.has_reasoning) == ("my-oss", HARMONY, (200002, 200012), False)
    full = tmp_path / "fresh.toml"
    full.write_text('name = "fresh"\nformat = "harmony"\nstop_ids = [200002]\n', encoding="utf-8")
    q = get_profile(str(full))
    assert (q.format, q.think_open_id, q.history_reasoning) == (HARMONY, None, "after_last_user")


def test_a_profile_file_describes_a_new_think_family_with_its_history_rule(tmp_path):
    path = tmp_path / "glm5.toml"
    path.write_text('base = "glm-4.7"\nname = "glm-5"\nhistory_reasoning = "all"\n', encoding="utf-8")
    p = get_profile(str(path))
    assert (p.name, p.format, p.history_reasoning, p.think_open_id) == ("glm-5", THINK, "all", 151350)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('base = "qwen3"\nformat = "channels"\n', "format = 'channels'"),
        ('base = "qwen3"\nhistory_reasoning = "some"\n', "history_reasoning = 'some'"),
        ('base = "qwen3"\neffort_kwarg = 3\n', "effort_kwarg has the wrong type"),
    ],
)
def test_a_bad_format_key_is_one_clear_error(tmp_path, body, message):
    path = tmp_path / "bad.toml"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(ProfileError, match=message):
        get_profile(str(path))


def test_think_tag_tokenizers_are_detected_as_before(kimi_tok, qwen_tok):
    from tokview.core.profiles import detect_profile

    assert detect_profile(kimi_tok).format == THINK
    assert detect_profile(qwen_tok).name == "qwen3"


def test_kimi_k26_is_detected_from_a_template_that_reads_preserve_thinking(kimi_tok_dir, tmp_path):
    """K2.6's template is K2.5's plus `preserve_thinking`: the detected profile keeps all history reasoning."""
    import json
    import shutil

    from tokview.core.profiles import detect_profile
    from tokview.core.tokenizer import load_tokenizer

    folder = shutil.copytree(kimi_tok_dir, tmp_path / "k26")
    extra = "{%- if preserve_thinking is defined and preserve_thinking %}{% endif -%}"
    template = extra + (folder / "chat_template.jinja").read_text(encoding="utf-8")
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    p = detect_profile(load_tokenizer(folder))
    assert (p.name, p.history_kwarg, p.prefills_opener, p.format) == ("kimi-k2.6", "preserve_thinking", True, THINK)


def test_a_detected_builtin_family_keeps_its_history_rule(kimi_tok):
    from tokview.core.profiles import detect_profile

    p = detect_profile(kimi_tok)
    assert (p.name, p.history_reasoning, p.history_kwarg) == ("kimi-k2.5", "after_last_user", None)
