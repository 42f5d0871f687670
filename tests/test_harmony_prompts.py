"""Reproducible Harmony prompts (issue 28 item 3): gpt-oss's template stamps the current date, so every request
names its date (and reasoning effort) in chat_template_kwargs, the capture records them, a profile file or
`--chat-template-kwargs` pins them, and a served prompt that differs from the local render only by the date is
the finding `prompt_date_mismatch` (not a tokenizer or template mismatch)."""

from __future__ import annotations

import datetime as dt

import pytest

from tokview.core import gpt_oss_tokenizer as g
from tokview.core.analysis import analyze
from tokview.core.profiles import get_profile, profile_fields, profile_from_fields
from tokview.core.record import Capture
from tokview.core.template_dates import date_only_difference

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
CLEAN = "<|channel|>analysis<|message|>Six sevens.<|end|><|start|>assistant<|channel|>final<|message|>42.<|return|>"


@pytest.fixture(scope="module")
def oss_tok():
    from tokview.core.tokenizer import load_tokenizer

    try:
        return load_tokenizer(g.gpt_oss_tokenizer_dir())
    except g.GptOssDataError as exc:
        pytest.skip(f"no o200k ranks on this machine (npm pack js-tiktoken into ~/.cache/tokview): {exc}")


def test_gpt_oss_sends_and_records_its_date_and_effort():
    oss = get_profile("gpt-oss")
    kwargs = oss.template_kwargs(True)
    assert kwargs == {"reasoning_effort": "medium", "current_date": dt.date.today().isoformat()}
    assert oss.template_kwargs(None, today="2025-08-05")["current_date"] == "2025-08-05"
    assert profile_from_fields(profile_fields(oss)) == oss
    assert get_profile("qwen3").template_kwargs(True) == {"enable_thinking": True}  # no date, no defaults


def test_a_profile_file_pins_the_date_and_effort(tmp_path):
    path = tmp_path / "oss-pinned.toml"
    path.write_text(
        'base = "gpt-oss"\nname = "oss-pinned"\n[default_kwargs]\ncurrent_date = "2025-08-05"\n'
        'reasoning_effort = "high"\n',
        encoding="utf-8",
    )
    p = get_profile(str(path))
    assert p.template_kwargs(True) == {"current_date": "2025-08-05", "reasoning_effort": "high"}
    assert profile_from_fields(profile_fields(p)) == p


def test_a_profile_file_with_a_bad_default_kwargs_is_one_clear_error(tmp_path):
    from tokview.core.profiles import ProfileError

    path = tmp_path / "bad.toml"
    path.write_text('base = "gpt-oss"\ndefault_kwargs = "2025-08-05"\n', encoding="utf-8")
    with pytest.raises(ProfileError, match="default_kwargs"):
        get_profile(str(path))


def test_the_recorded_date_renders_the_same_ids_on_another_day(oss_tok):
    oss = get_profile("gpt-oss")
    monday = oss_tok.render(QUESTION, template_kwargs=oss.template_kwargs(True, today="2026-03-02"))
    tuesday = oss_tok.render(QUESTION, template_kwargs=oss.template_kwargs(True, today="2026-03-03"))
    assert monday != tuesday
    again = oss_tok.render(QUESTION, template_kwargs={"reasoning_effort": "medium", "current_date": "2026-03-02"})
    assert again == monday


def test_date_only_difference_names_the_two_dates():
    a = "Knowledge cutoff: 2024-06\nCurrent date: 2026-03-02\n\nhi"
    assert date_only_difference(a, a.replace("2026-03-02", "2026-03-03")) == ("2026-03-02", "2026-03-03")
    assert date_only_difference(a, a) is None
    assert date_only_difference(a, a.replace("hi", "ho")) is None  # more than the date differs
    assert date_only_difference(a, a.replace("2026-03-02", "2026-03-02 ")) is None
    assert date_only_difference("Today Date: 26 Jul 2024", "Today Date: 2 Aug 2024") == ("26 Jul 2024", "2 Aug 2024")


def _capture(tok, served_date: str, recorded_date: str, messages=QUESTION) -> Capture:
    prompt = tok.render(messages, template_kwargs={"reasoning_effort": "medium", "current_date": served_date})
    out = tok.encode(CLEAN)
    return Capture(
        prompt_ids=prompt,
        output_ids=out,
        finish_reason="stop",
        endpoint="vllm-chat",
        settings={"chat_template_kwargs": {"reasoning_effort": "medium", "current_date": recorded_date}},
        messages=QUESTION,
        reasoning="Six sevens.",
        content="42.",
        reasoning_field="reasoning",
        usage={"prompt_tokens": len(prompt), "completion_tokens": len(out)},
    )


def test_a_served_prompt_stamped_with_another_date_is_prompt_date_mismatch(oss_tok):
    oss = get_profile("gpt-oss")
    c = _capture(oss_tok, "2026-03-03", "2026-03-02")
    found = {f.code: f for f in analyze(c, oss, oss_tok).findings}
    hit = found["prompt_date_mismatch"]
    assert "2026-03-03" in hit.detail
    assert "2026-03-02" in hit.detail
    assert "current_date" in hit.detail
    local = oss_tok.render(QUESTION, template_kwargs={"reasoning_effort": "medium", "current_date": "2026-03-02"})
    first = next(i for i, (a, b) in enumerate(zip(local, c.prompt_ids)) if a != b)
    assert hit.positions == (first,)


def test_a_date_only_difference_is_no_template_mismatch(oss_tok):
    codes = analyze(_capture(oss_tok, "2026-03-03", "2026-03-02"), get_profile("gpt-oss"), oss_tok).codes
    assert "prompt_render_mismatch" not in codes  # the template and tokenizer are the server's: only the date


def test_no_date_finding_on_the_same_date_or_on_another_difference(oss_tok):
    oss = get_profile("gpt-oss")
    same = analyze(_capture(oss_tok, "2026-03-02", "2026-03-02"), oss, oss_tok).codes
    assert "prompt_date_mismatch" not in same
    assert "prompt_render_mismatch" not in same
    other = [{"role": "user", "content": "What is 6 times 8?"}]
    codes = analyze(_capture(oss_tok, "2026-03-03", "2026-03-02", other), oss, oss_tok).codes
    assert "prompt_date_mismatch" not in codes
    assert "prompt_render_mismatch" in codes


def test_a_profile_file_may_not_set_what_the_render_passes_itself(tmp_path):
    """`add_generation_prompt` (or the messages, the tools) in `[default_kwargs]` failed every request on its own
    ("got multiple values for keyword argument"): refused when the file is read."""
    from tokview.core.profiles import ProfileError, load_profile_toml

    path = tmp_path / "p.toml"
    path.write_text('base = "gpt-oss"\nname = "x"\n[default_kwargs]\nadd_generation_prompt = false\n', encoding="utf-8")
    with pytest.raises(ProfileError, match="may not set add_generation_prompt"):
        load_profile_toml(path)
