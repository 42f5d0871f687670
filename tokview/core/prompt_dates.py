"""Prompts that differ only by the date the chat template stamps into them, and the finding that says so.

gpt-oss's template (and Llama 3's) writes today's date into the system message, so the same conversation
renders other ids on another day. tokview sends the date explicitly (`ModelProfile.date_kwarg`) and records
it; a server that stamps its own date instead (vLLM renders gpt-oss prompts through openai-harmony with the
server's `datetime.now()`) serves prompt ids that differ from the local render only there. That is no
tokenizer or template mismatch: `prompt_date_mismatch` names both dates, so the sample can be rendered again
with the server's date.

Registered by `harmony_findings` (which `findings` imports last), after `prompt_render_mismatch`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokview.core.finding_rules import WARN, Hit, rule
from tokview.core.template_dates import served_date

if TYPE_CHECKING:
    from tokview.core.finding_context import Context


@rule(
    "prompt_date_mismatch",
    WARN,
    "The served prompt differs from the local render only by the date the template stamps: render it with that date.",
)
def prompt_date_mismatch(ctx: Context) -> Hit | None:
    local = ctx.local_render
    if not isinstance(local, list) or ctx.tokenizer is None:
        return None
    first = ctx.render_difference
    if first is None:
        return None
    dates = served_date(ctx.tokenizer, local, ctx.capture.prompt_ids)
    if dates is None:
        return None
    key = ctx.profile.date_kwarg or "the template's date kwarg"
    return Hit.at(
        f"The server stamped the prompt with {dates[1]}, the local render (chat_template_kwargs {key} = "
        f"{dates[0]}) with {dates[0]}; nothing else differs. The stored ids are the server's: a rerun renders "
        f"them again with {key} = {dates[1]} (--chat-template-kwargs or the profile's default_kwargs).",
        [min(first, ctx.n_prompt - 1)],
    )
