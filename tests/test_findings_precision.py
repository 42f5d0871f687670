"""Findings that fired on sound samples, or missed broken ones (a sweep of every rule's borderline cases): each case
as the sweep built it, on the real tokenizers, through `analyze`."""

from __future__ import annotations

from typing import Any

import pytest
from finding_family import Family

from tokview.core.analysis import analyze
from tokview.core.findings import ERROR
from tokview.core.profiles import get_profile
from tokview.core.record import Capture

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]


def _codes(c: Capture, profile: Any, tok: Any) -> dict[str, Any]:
    return {f.code: f for f in analyze(c, profile, tok).findings}


@pytest.fixture(scope="module")
def kimi_family(kimi_tok, kimi_profile) -> Family:
    prompt = kimi_tok.render(QUESTION, template_kwargs=kimi_profile.template_kwargs(True))
    reasoning, answer = kimi_tok.encode("Six sevens."), kimi_tok.encode("42.")
    return Family(kimi_tok, kimi_profile, prompt, reasoning, answer, QUESTION)


def test_an_empty_tool_call_section_with_no_answer_is_no_answer(kimi_family):
    """`<|tool_calls_section_begin|><|tool_calls_section_end|>` and the stop: no call, no answer, and it passed."""
    f, layout = kimi_family, kimi_family.profile.tool_calls
    empty = f.output(answer=[layout.section_begin_id, layout.section_end_id])
    found = _codes(f.capture(output_ids=empty), f.profile, f.tok)["empty_answer"]
    assert found.severity == ERROR and "its tool-call section holds no call" in found.detail
    assert "empty_answer" not in _codes(f.capture(), f.profile, f.tok)


def test_a_turn_whose_stop_id_is_its_last_allowed_id_is_not_truncated(kimi_family):
    """SGLang (and older vLLM) check the length before the stop id: a whole turn said `length`, marked truncated."""
    f = kimi_family
    whole = f.capture(finish_reason="length", settings={"thinking": True, "max_new_tokens": len(f.output())})
    assert _codes(whole, f.profile, f.tok).keys() <= {"think_open_in_prompt"}
    cut = f.capture(output_ids=f.output(stop=False), finish_reason="length")
    assert "truncated" in _codes(cut, f.profile, f.tok)


def test_a_repeating_output_the_server_counted_whole_is_no_echo(kimi_family):
    """An output that begins as the prompt ends (a list, a pattern) is an echo only when the server did not count
    those ids as generated (SGLang #17240 counts them out of completion_tokens)."""
    f = kimi_family
    out = f.prompt[-5:] + f.output()
    repeat = f.capture(output_ids=out, usage={"prompt_tokens": len(f.prompt), "completion_tokens": len(out)})
    assert "output_prefix_overlap" not in _codes(repeat, f.profile, f.tok)
    echo = f.capture(output_ids=out, usage={"prompt_tokens": len(f.prompt), "completion_tokens": len(out) - 5})
    assert "output_prefix_overlap" in _codes(echo, f.profile, f.tok)
    unknown = f.capture(output_ids=out, usage=None)
    assert "output_prefix_overlap" in _codes(unknown, f.profile, f.tok)


def test_a_user_who_types_the_think_opener_is_no_template_prefill(qwen_tok):
    """Text spelling `<think>` in a user's message is encoded as the opener's id: it was taken for the template's
    prefill (an info finding pointing into the user's message; a model answering without thinking then had
    `think_close_missing`, its whole answer read as reasoning)."""
    profile = get_profile("qwen3")
    messages = [{"role": "user", "content": "What does the <think> tag do?"}]
    prompt = qwen_tok.render(messages, template_kwargs=profile.template_kwargs(True))
    assert profile.think_open_id in prompt
    answer = qwen_tok.encode("It marks reasoning.") + [profile.stop_ids[0]]
    c = Capture(
        prompt_ids=prompt,
        output_ids=answer,
        finish_reason="stop",
        endpoint="sglang-generate",
        settings={"max_new_tokens": 256},
        messages=messages,
        usage={"prompt_tokens": len(prompt), "completion_tokens": len(answer)},
    )
    codes = _codes(c, profile, qwen_tok)
    assert "think_open_in_prompt" not in codes and "think_close_missing" not in codes


def test_think_open_missing_names_no_kwarg_a_profile_has_not(kimi_tok):
    """deepseek-r1 has no thinking switch: the advice said `the template kwargs (None) did not reach the template`."""
    profile = get_profile("kimi-k2.5").with_overrides(thinking_kwarg=None, name="no-switch")
    prompt = kimi_tok.encode("<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|>")
    out = kimi_tok.encode("42.") + [profile.stop_ids[0]]
    c = Capture(
        prompt_ids=prompt,
        output_ids=out,
        finish_reason="stop",
        endpoint="sglang-generate",
        settings={"thinking": True, "max_new_tokens": 256},
        usage={"prompt_tokens": len(prompt), "completion_tokens": len(out)},
    )
    found = _codes(c, profile, kimi_tok)["think_open_missing"]
    assert "(None)" not in found.detail and "did not pre-fill it" in found.detail
