"""The recent-renders cache must not hand one conversation the render of another.

A template's `tojson` writes a mapping's keys in their order (transformers' filter does not sort), so two tool
declarations that differ only in key order are two different prompts; the cache key must tell them apart."""

from __future__ import annotations

from tokview.core.tokenizer import load_tokenizer


def _tools(order: list[str]) -> list[dict[str, object]]:
    properties = {name: {"type": "string"} for name in order}
    return [{"type": "function", "function": {"name": "look", "parameters": {"properties": properties}}}]


def test_tools_in_another_key_order_render_their_own_prompt(qwen_tok_dir):
    tok = load_tokenizer(qwen_tok_dir)  # its own recent renders, not the session fixture's
    messages = [{"role": "user", "content": "hi"}]
    first = tok.render_text(messages, template_kwargs={"tools": _tools(["city", "country"])})
    second = tok.render_text(messages, template_kwargs={"tools": _tools(["country", "city"])})
    assert first.index('"city"') < first.index('"country"')
    assert second.index('"country"') < second.index('"city"')
    fresh = load_tokenizer(qwen_tok_dir)
    assert tok.render(messages, template_kwargs={"tools": _tools(["country", "city"])}) == fresh.render(
        messages, template_kwargs={"tools": _tools(["country", "city"])}
    )
