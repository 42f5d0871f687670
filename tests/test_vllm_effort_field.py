"""The reasoning effort goes to vLLM at the top level too (issue 28): vLLM's Harmony path (gpt-oss) reads the
request's `reasoning_effort` and never `chat_template_kwargs`, so an effort sent only as a template kwarg is
recorded but not what the server renders; other templates read the kwarg, which vLLM's serving_chat applies
after the top-level field, so both carry the same value."""

from __future__ import annotations

from tokview.servers.vllm import chat_body

SETTINGS = {"max_new_tokens": 8, "temperature": 0.0, "top_p": 1.0}


def test_the_effort_kwarg_is_also_sent_at_the_top_level():
    kwargs = {"reasoning_effort": "low", "current_date": "2026-01-02"}
    body = chat_body([], {**SETTINGS, "chat_template_kwargs": kwargs}, "m", stream=False)
    assert body["reasoning_effort"] == "low"


def test_the_template_kwargs_are_sent_unchanged():
    kwargs = {"reasoning_effort": "high"}
    body = chat_body([], {**SETTINGS, "chat_template_kwargs": kwargs}, "m", stream=False)
    assert body["chat_template_kwargs"] == {"reasoning_effort": "high"}


def test_no_effort_kwarg_sends_no_effort_field():
    """vLLM turns a top-level effort into `enable_thinking` for other templates: never sent unasked."""
    body = chat_body([], {**SETTINGS, "chat_template_kwargs": {"thinking": True}}, "m", stream=False)
    assert "reasoning_effort" not in body
