"""Checks a format makes before anything is written (or a FIFO's reader is woken): a format whose rows
cannot be trained on as served, for the run's chat template, is refused as a whole, in one line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokview.core.profiles import HARMONY, ModelProfile
from tokview.export.export_error import ExportError

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter


def reasoning_renders_once_inline(tokenizer: TokenizerAdapter, profile: ModelProfile) -> None:
    """Refuse reasoning inline in the content when the template writes its own think tags around it
    (kimi-inline): the rendered row would hold the tags twice (`<think></think><think>…`)."""
    if profile.format == HARMONY:
        raise ExportError(
            "--format kimi-inline refused: a gpt-oss run's reasoning is Harmony's analysis channel, not think tags to "
            "write inline in the content; use --format speculators (token-exact) or --format sharegpt"
        )
    if not profile.has_reasoning:
        return  # a plain model's rows are answers only: nothing goes inline
    user = [{"role": "user", "content": "q"}]
    kwargs = profile.template_kwargs(True)
    inline = {"role": "assistant", "content": f"{profile.think_open}r{profile.think_close}a"}
    structured = {"role": "assistant", "content": "a", "reasoning_content": "r"}
    try:
        same = tokenizer.render_text(
            user + [inline], add_generation_prompt=False, template_kwargs=kwargs
        ) == tokenizer.render_text(user + [structured], add_generation_prompt=False, template_kwargs=kwargs)
    except Exception as exc:
        raise ExportError(f"--format kimi-inline: the chat template failed on a probe conversation ({exc})") from None
    if not same:
        raise ExportError(
            f"--format kimi-inline refused: the run's chat template writes its own {profile.think_open} tags for an "
            f"assistant message, so reasoning inline in the content would render doubled "
            f"({profile.think_open}{profile.think_close}{profile.think_open}…); use --format specforge (with its "
            "template) or --format speculators (token-exact)"
        )
