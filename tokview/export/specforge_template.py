"""A SpecForge `ChatTemplate` derived from the chat template the run was served with.

SpecForge masks `assistant_header(.*?)(end_of_turn_token|$)` over the rendered conversation, and
its built-in Kimi entries do not match what a Kimi server serves (`kimi-k2-thinking` injects a
system prompt and starts the mask at the pre-filled `<think>`; `kimi-k2-instruct` drops the
reasoning). So the header is read off the served template itself: the generation prompt minus the
render of the conversation before it, i.e. exactly the text the server put before the first
generated id (the pre-filled `<think>` included when the template pre-fills it). `system_prompt`
stays null: the template then renders a row without a system turn the way the server did.

A Harmony (gpt-oss) run is refused with the reason (`HARMONY_REFUSAL`): SpecForge routes Harmony through its own
parser, not a ChatTemplate, and that parser reproduces neither the served prompt nor the served mask.

Fields are those of `specforge.data.template.ChatTemplate` (SpecForge a6b6b02, 2026-08):
assistant_header, user_header, system_prompt, end_of_turn_token, parser_type,
assistant_pattern_type, enable_thinking, ignore_token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokview.core.profiles import HARMONY, ModelProfile
from tokview.export.formats import Refused

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

USER, USER2, REASONING, ANSWER = "tokviewprobeuser", "tokviewprobenext", "tokviewproberea", "tokviewprobeans"
BUILTIN_WARNING = (
    "Do not train this file with SpecForge's built-in kimi-k2-thinking or kimi-k2-instruct templates: "
    "kimi-k2-thinking injects a system turn ('You are a helpful assistant.') into every row without one and starts "
    "the loss mask at the pre-filled <think>, which the model never generated; kimi-k2-instruct renders "
    "<think></think> and drops the reasoning."
)
"""The manifest ends it with what the export offers instead (see `manifest.builtin_template_warning`)."""
QWEN_BUILTIN_WARNING = (
    "Do not train this file with SpecForge's built-in qwen3-thinking, qwen3-instruct or qwen templates: "
    "qwen3-thinking injects a system turn ('You are a helpful assistant.') into every row without one and supervises "
    "the newline the template writes after <|im_end|>, which the model never generated; qwen3-instruct and qwen "
    "render <think>\n\n</think>\n\n and drop the reasoning."
)
"""Measured with SpecForge a6b6b02's own `build_eagle3_dataset` on Qwen3 exports: 0 of 34 rows exact with each."""
BUILTIN_WARNINGS = {"kimi": BUILTIN_WARNING, "qwen": QWEN_BUILTIN_WARNING}
"""Per model family (a profile name's start) whose SpecForge built-in templates were checked against served ids."""


def builtin_family(profile_names: list[str]) -> str:
    """The family of `BUILTIN_WARNINGS` the exported samples' profiles are of ('' for none, or for a mix)."""
    families = {next((f for f in BUILTIN_WARNINGS if name.startswith(f)), "") for name in profile_names}
    return families.pop() if len(families) == 1 else ""


HARMONY_REFUSAL = (
    "a Harmony (gpt-oss) turn is several channel messages, and SpecForge renders and masks it its own way: its "
    "HarmonyParser writes a fixed system message (Current date: 2025-06-28, Reasoning: low) and no tools section, "
    "ends every final message <|end|> where the model wrote <|return|>, and masks from the first <|start|>assistant "
    "after the last user message to the end, so inside a tool loop it also trains the history's calls and tool "
    "results"
)
"""Why the SpecForge template route is refused for a Harmony profile (SpecForge a6b6b02 `specforge/data/parse.py`
`HarmonyParser`): its text route can reproduce neither the served prompt nor the served mask."""


class TemplateRefused(ValueError):
    """No `ChatTemplate` can express the served layout; the message says why, in one line."""


def served_kwargs(settings: dict[str, Any], profile: ModelProfile) -> dict[str, Any]:
    kwargs = settings.get("chat_template_kwargs")
    return dict(kwargs) if isinstance(kwargs, dict) else profile.template_kwargs(settings.get("thinking"))


def derive(
    tokenizer: TokenizerAdapter, profile: ModelProfile, kwargs: dict[str, Any], thinking: bool
) -> dict[str, Any]:
    """The ChatTemplate fields for samples served with these template kwargs, or TemplateRefused."""
    if profile.format == HARMONY:
        raise TemplateRefused(HARMONY_REFUSAL)
    if not tokenizer.chat_template:
        raise TemplateRefused("the tokenizer has no chat template to derive a SpecForge template from")
    stop = profile.stop_ids[0] if profile.stop_ids else None
    if stop is None:
        raise TemplateRefused(f"profile {profile.name} names no stop id to end an assistant turn with")
    eot = tokenizer.decode([stop])
    enable_thinking = bool(thinking) and profile.thinking_kwarg == "enable_thinking"
    user = [{"role": "user", "content": USER}]
    assistant = {"role": "assistant", "content": ANSWER, **({"reasoning_content": REASONING} if thinking else {})}
    trainer_kwargs = {"enable_thinking": True} if enable_thinking else {}
    try:
        before = tokenizer.render_text(user, add_generation_prompt=False, template_kwargs=kwargs)
        served = tokenizer.render_text(user, add_generation_prompt=True, template_kwargs=kwargs)
        full = tokenizer.render_text(user + [assistant], add_generation_prompt=False, template_kwargs=trainer_kwargs)
        follow = tokenizer.render_text(
            user + [assistant, {"role": "user", "content": USER2}],
            add_generation_prompt=False,
            template_kwargs=trainer_kwargs,
        )
    except Exception as exc:  # the template itself fails: nothing to derive
        raise TemplateRefused(f"the chat template failed on a probe conversation ({exc})") from None
    if not served.startswith(before):
        raise TemplateRefused("the served generation prompt is not the conversation's render plus an assistant header")
    header = served[len(before) :]
    if not header:
        raise TemplateRefused("the served generation prompt adds no assistant header to match the mask on")
    if not full.startswith(served):
        raise TemplateRefused(
            f"an assistant turn renders differently from the served generation prompt (served header {header!r}, "
            f"rendered {full[len(before) : len(before) + len(header) + 12]!r}…), so no assistant_header both starts "
            "the "
            "mask at the first generated id and matches the rendered turn"
        )
    end = full.find(ANSWER, len(served)) + len(ANSWER)
    if end < len(ANSWER) or not full.startswith(eot, end):
        raise TemplateRefused(f"an assistant turn does not end with the stop token {eot!r} right after its content")
    answer_at = follow.find(ANSWER)
    next_at = follow.find(eot, answer_at) + len(eot) if answer_at >= 0 else -1
    user_header = follow[next_at : follow.find(USER2)].lstrip("\n") if 0 < next_at <= follow.find(USER2) else None
    if thinking and REASONING not in full[len(served) :]:
        raise TemplateRefused("the template drops reasoning_content from the last assistant turn")
    return {
        "assistant_header": header,
        "user_header": user_header,
        "system_prompt": None,
        "end_of_turn_token": eot,
        "parser_type": "thinking",
        "assistant_pattern_type": "general",
        "enable_thinking": enable_thinking,
        "ignore_token": None,
    }


class TemplateChooser:
    """One ChatTemplate per export: the layout most exported samples were served with.

    A sample served with another generation prompt (thinking off beside thinking on) would be masked
    wrongly by that template, so it is refused (`other_served_layout`), never written silently.
    """

    def __init__(self, tokenizer: TokenizerAdapter) -> None:
        self.tokenizer = tokenizer
        self.by_layout: dict[str, dict[str, Any] | TemplateRefused] = {}
        self.counts: dict[str, int] = {}
        self.chosen: str | None = None
        self.template: dict[str, Any] | None = None
        self.refused: str | None = None

    def layout(self, settings: dict[str, Any], profile: ModelProfile) -> str:
        kwargs = served_kwargs(settings, profile)
        thinking = profile.has_reasoning and settings.get("thinking", True) is not False
        key = repr(sorted(kwargs.items())) + f"|{profile.name}|{thinking}"
        if key not in self.by_layout:
            try:
                self.by_layout[key] = derive(self.tokenizer, profile, kwargs, thinking)
            except TemplateRefused as exc:
                self.by_layout[key] = exc
        return key

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def choose(self) -> dict[str, Any]:
        """The template of the most common layout; TemplateRefused if that layout has none."""
        if not self.counts:
            raise TemplateRefused("no exported sample to derive a template from")
        self.chosen = max(sorted(self.counts), key=lambda k: self.counts[k])
        found = self.by_layout[self.chosen]
        if isinstance(found, TemplateRefused):
            raise found
        return found

    def check(self, key: str) -> None:
        if self.chosen is not None and key != self.chosen:
            found = self.by_layout[key]
            if isinstance(found, TemplateRefused) or found != self.by_layout[self.chosen]:
                raise Refused("other_served_layout")
