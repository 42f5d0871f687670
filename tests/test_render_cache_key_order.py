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


def _with_default(value: object) -> dict[str, object]:
    """Tools whose one parameter defaults to `value` (the template writes them with `tojson`)."""
    tool = _tools(["city"])
    tool[0]["function"]["parameters"]["properties"]["city"]["default"] = value  # type: ignore[index]
    return {"tools": tool}


def test_a_nan_and_a_null_render_their_own_prompts(qwen_tok_dir):
    """A key written by a JSON writer that puts a float NaN or infinity down as `null` (orjson does) would hand a NaN
    None's render, or the reverse. The template's `tojson` writes `NaN`, `Infinity` and `null`."""
    tok, fresh = load_tokenizer(qwen_tok_dir), load_tokenizer(qwen_tok_dir)
    messages = [{"role": "user", "content": "hi"}]
    values = (None, float("nan"), float("inf"))
    renders = [tok.render_text(messages, template_kwargs=_with_default(v)) for v in values]
    assert '"default": null' in renders[0] and '"default": NaN' in renders[1] and '"default": Infinity' in renders[2]
    assert renders == [fresh.render_text(messages, template_kwargs=_with_default(v)) for v in values]


def test_inputs_orjson_cannot_write_are_still_rendered_right(qwen_tok_dir):
    """A lone surrogate, an int past 64 bits, a key that is no string: each rendered as a fresh tokenizer renders
    it, never handed another's cached render."""
    tok = load_tokenizer(qwen_tok_dir)
    messages = [{"role": "user", "content": "hi"}]
    values = ("\ud800 x", 2**70, {1: "a"}, "plain", 7)
    renders = [tok.render_text(messages, template_kwargs=_with_default(v)) for v in values]
    assert len(set(renders)) == len(values)
    fresh = load_tokenizer(qwen_tok_dir)
    assert renders == [fresh.render_text(messages, template_kwargs=_with_default(v)) for v in values]
