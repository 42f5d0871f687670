"""Whether a prompt can be asked for without thinking: a template with no switch may open reasoning all the same.

Why a module of its own: it renders with the tokenizer and reads the prompt's segments (`core.segments`), which
import the profiles; the profiles module cannot import them back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokview.core.profiles import HARMONY, ModelProfile
from tokview.core.segments import prefilled_opener_position

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter


def thinking_off_refusal(profile: ModelProfile, tokenizer: TokenizerAdapter, kwargs: dict[str, Any]) -> str | None:
    """Why a prompt cannot be asked for without thinking (None: it can, or nothing says it thinks): rendered with the
    kwargs that would be sent (`kwargs`), the template still opens reasoning (Qwen3-2507 Thinking, deepseek-r1: a
    pre-filled opener, no switch), so every sample would be `reasoning_with_thinking_off`; and gpt-oss reasons in
    every answer, as Kimi-K2-Thinking does (its template reads no switch; the model writes its own `<think>`). A
    template that opens nothing (Qwen3-2507 Instruct, a model that never thinks) is no reason to refuse.
    Each reason ends with what to do: a model that always reasons has no switch to name."""
    if profile.format == HARMONY:
        return "gpt-oss reasons in every answer: leave thinking on (its reasoning_effort is set with --chat-template-kwargs)"
    if profile.name == "kimi-k2-thinking":
        return (
            "Kimi-K2-Thinking reasons in every answer (its template reads no switch; the model writes <think> itself): "
            "leave thinking on"
        )
    if not profile.has_reasoning or not tokenizer.chat_template:
        return None
    hi = [{"role": "user", "content": "hi"}]
    rendered = tokenizer.render(hi, add_generation_prompt=True, template_kwargs=kwargs)
    unread = _unread_switch(profile, tokenizer, kwargs, rendered)
    if unread is not None:
        return (
            f"profile {profile.name} names no thinking switch, and its template reads `{unread}`: sent without it, "
            f'every sample would think (set thinking_kwarg = "{unread}" in the profile file, or pass '
            f"--chat-template-kwargs '{{\"{unread}\": false}}')"
        )
    if prefilled_opener_position(rendered, profile) is None:
        return None
    return (
        f"profile {profile.name}'s template opens reasoning in the prompt all the same (it reads no switch among "
        f"{sorted(kwargs) or 'no kwargs'}): every sample would be flagged reasoning_with_thinking_off; leave thinking "
        "on, or name the template's switch: --chat-template-kwargs"
    )


KNOWN_SWITCHES = ("enable_thinking", "thinking")
"""The kwargs reasoning templates read to turn thinking off (Qwen3, GLM: `enable_thinking`; Kimi, DeepSeek: `thinking`)."""


def _unread_switch(
    profile: ModelProfile, tokenizer: TokenizerAdapter, kwargs: dict[str, Any], rendered: list[int]
) -> str | None:
    """A switch the template reads that neither the profile nor the request sets (a profile file `base = "deepseek-r1"`
    on a Qwen3 template): the prompt renders otherwise with it off. `--no-thinking` changed nothing then, and every
    sample was flagged `reasoning_with_thinking_off`."""
    if profile.thinking_kwarg is not None:
        return None
    template = tokenizer.chat_template or ""
    for switch in KNOWN_SWITCHES:
        if switch in kwargs or switch not in template:
            continue
        off = tokenizer.render(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, template_kwargs={**kwargs, switch: False}
        )
        if off != rendered:
            return switch
    return None
