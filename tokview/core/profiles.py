"""Model profiles: where each model family keeps its think delimiters (if any) and stop ids.

A profile is what lets tokview read structure straight off the ids: which id opens and closes
reasoning, which ids end a turn, and whether the chat template pre-fills the opener (Kimi-K2.5
does, so its output starts *inside* reasoning and never contains 163606).

Drafters are trained for plain chat models too (Llama, Qwen2.5, SmolLM…): the built-in `plain`
profile has no delimiters at all, and takes its stop ids from the tokenizer (`with_tokenizer_stops`).

A profile may also say how the family writes tool calls on ids (`ToolCallLayout`): Kimi's section and
call markers, Qwen3's hermes `<tool_call>` JSON `</tool_call>`, or GLM's `<tool_call>` name and
`<arg_key>`/`<arg_value>` pairs, so the calls are read off the ids (`core.tool_calls`) the way the think
delimiters are.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field, replace
from datetime import date, time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from tokview.core.glm_layout import GLM_ID
from tokview.core.kimi_layout import KIMI_ID, kimi_tokenizer_dir
from tokview.errors import TokviewError

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter


RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "conversation", "add_generation_prompt", "continue_final_message", "tokenize"}
)
"""What the render itself passes the chat template (the conversation, the header flags): set again as a template
kwarg, every request failed on its own with "got multiple values for keyword argument …". (`tools` and `documents`
are a template's own inputs a run may give this way: `tools` collides only on SGLang's chat endpoint.)"""
RESERVED_WHY = "tokview passes them itself (each row's messages, and the run's mode)"


def reserved_template_kwargs(kwargs: object) -> str:
    """The keys of `kwargs` a template kwarg may not set, as a phrase ("" when none)."""
    taken = sorted(k for k in kwargs if k in RESERVED_TEMPLATE_KWARGS) if isinstance(kwargs, dict) else []
    return ", ".join(taken)


class ProfileError(TokviewError):
    """A profile could not be found, parsed or detected."""

    title = "profile"


THINK, HARMONY, PLAIN = "think", "harmony", "plain"
FORMATS = (THINK, HARMONY, PLAIN)
"""How an output is structured: think tags (Kimi, Qwen3, DeepSeek, GLM), Harmony channels (gpt-oss,
`core.harmony`), or plain (prompt → answer → stop)."""
HISTORY_REASONING = ("after_last_user", "last_loop", "all", "none")
"""How the family's template renders reasoning of earlier assistant turns: kept after the last user message
(Qwen3, Kimi-K2.5, GLM), kept only while a tool loop is open (Harmony), kept everywhere (Kimi-K2.6 with
preserve_thinking), or never."""

KIMI_K2, HERMES, GLM47, QWEN3_CODER = "kimi_k2", "hermes", "glm47", "qwen3_coder"
TOOL_PARSERS = (KIMI_K2, HERMES, GLM47, QWEN3_CODER)
"""The tool-call layouts tokview reads, named after the servers' --tool-call-parser that reads them."""
TAGGED_PARSERS = (HERMES, GLM47, QWEN3_CODER)
"""Layouts whose calls are `<tool_call>` spans with no section marker and no argument marker."""


@dataclass(frozen=True)
class ToolCallLayout:
    """Where a model family's tool calls sit on the ids: the marker ids its server's tool parser cuts at.

    `kimi_k2`: `section_begin (call_begin CALL-ID argument_begin ARGUMENTS call_end)* section_end`,
    the call id text `functions.NAME:IDX`. `hermes` (Qwen3): `call_begin JSON call_end` per call,
    the JSON `{"name": …, "arguments": {…}}`, no section markers and no argument marker. `glm47` (GLM-4.5/4.6/4.7):
    `call_begin NAME (arg_key_begin KEY arg_key_end arg_value_begin VALUE arg_value_end)* call_end` per call, no
    section and no call id; GLM-4.5 writes a newline after the name and after each pair, GLM-4.7 none (vLLM's
    `glm47` parser reads both, its `glm45` parser needs the newline after the name)."""

    parser: str
    call_begin: str
    call_end: str
    call_begin_id: int
    call_end_id: int
    section_begin: str = ""
    section_end: str = ""
    section_begin_id: int | None = None
    section_end_id: int | None = None
    argument_begin: str = ""
    argument_begin_id: int | None = None
    arg_key_begin: str = ""
    arg_key_end: str = ""
    arg_value_begin: str = ""
    arg_value_end: str = ""
    arg_key_begin_id: int | None = None
    arg_key_end_id: int | None = None
    arg_value_begin_id: int | None = None
    arg_value_end_id: int | None = None

    def named_ids(self) -> list[tuple[str, int, str]]:
        """(key, id, text) of every marker this layout uses (what a tokenizer must have)."""
        named = [
            ("section_begin_id", self.section_begin_id, self.section_begin),
            ("section_end_id", self.section_end_id, self.section_end),
            ("call_begin_id", self.call_begin_id, self.call_begin),
            ("argument_begin_id", self.argument_begin_id, self.argument_begin),
            ("arg_key_begin_id", self.arg_key_begin_id, self.arg_key_begin),
            ("arg_key_end_id", self.arg_key_end_id, self.arg_key_end),
            ("arg_value_begin_id", self.arg_value_begin_id, self.arg_value_begin),
            ("arg_value_end_id", self.arg_value_end_id, self.arg_value_end),
            ("call_end_id", self.call_end_id, self.call_end),
        ]
        return [(key, i, text) for key, i, text in named if i is not None]

    @property
    def marker_ids(self) -> frozenset[int]:
        return frozenset(i for _, i, _ in self.named_ids())


KIMI_TOOL_CALLS = ToolCallLayout(
    parser=KIMI_K2,
    call_begin="<|tool_call_begin|>",
    call_end="<|tool_call_end|>",
    call_begin_id=KIMI_ID["<|tool_call_begin|>"],
    call_end_id=KIMI_ID["<|tool_call_end|>"],
    section_begin="<|tool_calls_section_begin|>",
    section_end="<|tool_calls_section_end|>",
    section_begin_id=KIMI_ID["<|tool_calls_section_begin|>"],
    section_end_id=KIMI_ID["<|tool_calls_section_end|>"],
    argument_begin="<|tool_call_argument_begin|>",
    argument_begin_id=KIMI_ID["<|tool_call_argument_begin|>"],
)
QWEN3_TOOL_CALLS = ToolCallLayout(
    parser=HERMES, call_begin="<tool_call>", call_end="</tool_call>", call_begin_id=151657, call_end_id=151658
)
GLM_TOOL_CALLS = ToolCallLayout(
    parser=GLM47,
    call_begin="<tool_call>",
    call_end="</tool_call>",
    call_begin_id=GLM_ID["<tool_call>"],
    call_end_id=GLM_ID["</tool_call>"],
    arg_key_begin="<arg_key>",
    arg_key_end="</arg_key>",
    arg_value_begin="<arg_value>",
    arg_value_end="</arg_value>",
    arg_key_begin_id=GLM_ID["<arg_key>"],
    arg_key_end_id=GLM_ID["</arg_key>"],
    arg_value_begin_id=GLM_ID["<arg_value>"],
    arg_value_end_id=GLM_ID["</arg_value>"],
)
"""GLM-4.5/4.6/4.7 (zai-org's chat_template.jinja: `<tool_call>{{ tc.name }}` then per `arguments.items()`
`<arg_key>{{ k }}</arg_key><arg_value>{{ v if v is string else v | tojson(ensure_ascii=False) }}</arg_value>`, then
`</tool_call>`; vLLM's glm4_moe_tool_parser.py / glm47_moe_tool_parser.py cut at the same six texts). The ids are
`core.glm_layout`'s table (GLM-4.5's added vocabulary, 151352-151359)."""
QWEN3_CODER_TOOL_CALLS = replace(QWEN3_TOOL_CALLS, parser=QWEN3_CODER)
"""Qwen3-Coder and Qwen3.5/3.6: Qwen3's two marker ids around an XML body in plain text (their templates render
`<function=NAME>` then per argument `<parameter=K>`, the value on its own lines, `</parameter>`, then `</function>`;
vLLM's and SGLang's `qwen3_coder` parsers read it: `core.xml_tool_calls.xml_call`)."""
BUILTIN_TOOL_LAYOUTS = {
    KIMI_K2: KIMI_TOOL_CALLS,
    HERMES: QWEN3_TOOL_CALLS,
    GLM47: GLM_TOOL_CALLS,
    QWEN3_CODER: QWEN3_CODER_TOOL_CALLS,
}
_GLM_ARG_KEYS = ("arg_key_begin", "arg_key_end", "arg_value_begin", "arg_value_end")


def tool_layout_from_fields(fields: object, where: str) -> ToolCallLayout | None:
    """A layout from its name (`"kimi_k2"`, `"hermes"`, `"glm47"`: the built-in ids, `"none"`: no tool calls) or a
    table naming `parser` and the ids that differ from that parser's built-in layout.

    Raises ProfileError naming `where` for anything else."""
    if fields is None or fields == "none":
        return None
    if isinstance(fields, str):
        if fields not in BUILTIN_TOOL_LAYOUTS:
            raise ProfileError(f"{where}: tool_calls = {fields!r} (known: {', '.join(TOOL_PARSERS)}, none)")
        return BUILTIN_TOOL_LAYOUTS[fields]
    if not isinstance(fields, dict):
        raise ProfileError(f"{where}: tool_calls must be a parser name or a table, not {type(fields).__name__}")
    data = dict(fields)
    parser = data.get("parser")
    if parser not in BUILTIN_TOOL_LAYOUTS:
        raise ProfileError(f"{where}: tool_calls.parser must be one of {', '.join(TOOL_PARSERS)} ({parser!r})")
    allowed = set(ToolCallLayout.__dataclass_fields__)
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ProfileError(f"{where}: tool_calls has unknown keys {unknown}")
    for key, value in data.items():
        wants_int = key.endswith("_id")
        ok = (isinstance(value, int) and not isinstance(value, bool)) if wants_int else isinstance(value, str)
        if not ok and not (wants_int and value is None):
            raise ProfileError(f"{where}: tool_calls.{key} has the wrong type ({value!r})")
    layout = replace(BUILTIN_TOOL_LAYOUTS[parser], **data)
    if layout.parser == KIMI_K2 and None in (layout.section_begin_id, layout.section_end_id, layout.argument_begin_id):
        raise ProfileError(f"{where}: a kimi_k2 tool-call layout needs section and argument_begin ids")
    if layout.parser == GLM47 and any(getattr(layout, f"{key}_id") is None for key in _GLM_ARG_KEYS):
        raise ProfileError(f"{where}: a glm47 tool-call layout needs arg_key and arg_value begin and end ids")
    if layout.parser in TAGGED_PARSERS:
        layout = replace(layout, section_begin="", section_end="", argument_begin="")
        layout = replace(layout, section_begin_id=None, section_end_id=None, argument_begin_id=None)
    if layout.parser != GLM47:
        layout = replace(layout, arg_key_begin="", arg_key_end="", arg_value_begin="", arg_value_end="")
        layout = replace(
            layout, arg_key_begin_id=None, arg_key_end_id=None, arg_value_begin_id=None, arg_value_end_id=None
        )
    return layout


def tool_layout_fields(layout: ToolCallLayout | None) -> dict[str, Any] | None:
    return None if layout is None else dataclasses.asdict(layout)


def check_tool_layout_fits(profile: ModelProfile, tokenizer: TokenizerAdapter, given: str) -> None:
    """A tool-call layout whose ids this tokenizer lacks, or has as other tokens, is refused in one line (as the
    think delimiters are): reading Qwen3's 151657 as a call opener in another vocabulary would invent calls."""
    layout = profile.tool_calls
    if layout is None:
        return
    if layout.parser == HERMES and "<function=" in (tokenizer.chat_template or ""):
        raise ProfileError(
            f"profile {given} reads hermes JSON tool calls, but this tokenizer's template writes <function=…> "
            "XML ones (Qwen3-Coder, Qwen3.5): every call would read as nameless; use --profile qwen3-coder, or no "
            "--profile"
        )
    seen: dict[int, str] = {}
    taken = set(profile.stop_ids) | profile.delimiter_ids
    for key, token_id, text in layout.named_ids():
        if token_id < 0 or tokenizer.piece_text(token_id) == f"<id {token_id}>":
            raise ProfileError(f"profile {given}: tool_calls.{key} = {token_id} is not an id of this tokenizer")
        piece = tokenizer.piece_text(token_id)
        if piece.strip() != text.strip():
            raise ProfileError(
                f"profile {given}: tool_calls.{key} {token_id} is {piece!r} in this tokenizer, not {text!r}: "
                "the layout is another model's"
            )
        if token_id in seen:
            raise ProfileError(f"profile {given}: tool_calls.{key} and {seen[token_id]} are the same id ({token_id})")
        if token_id in taken:
            raise ProfileError(f"profile {given}: tool_calls.{key} {token_id} is also a stop id or think delimiter")
        seen[token_id] = f"tool_calls.{key}"


def fitting_tool_layout(tokenizer: TokenizerAdapter, preferred: ToolCallLayout | None = None) -> ToolCallLayout | None:
    """The built-in layout whose marker ids this tokenizer has under their names (`preferred` first); else one whose
    marker texts it has as tokens of their own at other ids, with those ids (Qwen3.5 has Qwen3's `<tool_call>` at
    248058, not 151657: no layout fitted, and its calls went unchecked); else None.

    A template that writes `<function=` (Qwen3-Coder's, Qwen3.5's: XML inside `<tool_call>`, the `qwen3_coder`
    parser) gets that layout in place of hermes: read as hermes JSON, every correct call was
    `tool_arguments_not_object` and `tool_calls_field_mismatch`."""
    candidates = [preferred, *BUILTIN_TOOL_LAYOUTS.values()]
    for layout in candidates:
        if layout is not None and all(tokenizer.token_to_id(text) == i for _, i, text in layout.named_ids()):
            return _xml_if_written(layout, tokenizer)
    for layout in (KIMI_TOOL_CALLS, GLM_TOOL_CALLS, QWEN3_TOOL_CALLS):  # the most markers first: GLM's hold hermes'
        found = {key: tokenizer.token_to_id(text) for key, _, text in layout.named_ids()}
        ids = {key: i for key, i in found.items() if i is not None}
        if len(ids) == len(found) and len(set(ids.values())) == len(ids):
            return _xml_if_written(replace(layout, **ids), tokenizer)  # type: ignore[arg-type]
    return None


def _xml_if_written(layout: ToolCallLayout, tokenizer: TokenizerAdapter) -> ToolCallLayout:
    """Qwen's `<tool_call>` markers around XML (`<function=` in the template) are the qwen3_coder layout."""
    if layout.parser == HERMES and "<function=" in (tokenizer.chat_template or ""):
        return replace(layout, parser=QWEN3_CODER)
    return layout


class ProfileChanges(TypedDict, total=False):
    """The fields `ModelProfile.with_overrides` may change, with their types (the dataclass's, field for field)."""

    name: str
    think_open: str
    think_close: str
    think_open_id: int | None
    think_close_id: int | None
    stop_ids: tuple[int, ...]
    prefills_opener: bool
    thinking_kwarg: str | None
    reasoning_parser: str | None
    max_length: int | None
    tool_calls: ToolCallLayout | None
    format: str
    history_reasoning: str
    history_kwarg: str | None
    effort_kwarg: str | None
    date_kwarg: str | None
    default_kwargs: dict[str, Any]
    extra: dict[str, Any]


@dataclass(frozen=True)
class ModelProfile:
    """What one model family does with reasoning delimiters and stops."""

    name: str
    think_open: str
    think_close: str
    think_open_id: int | None
    think_close_id: int | None
    stop_ids: tuple[int, ...]
    prefills_opener: bool
    """True when the template's generation prompt (thinking on) ends with the opener."""
    thinking_kwarg: str | None = "thinking"
    """The chat_template_kwargs key that toggles thinking (`thinking` for Kimi, `enable_thinking` for Qwen3)."""
    reasoning_parser: str | None = None
    """The server's --reasoning-parser name for this family."""
    max_length: int | None = None
    """The model's context length as the profile knows it (detected: the tokenizer's model_max_length).
    `over_max_length` uses it only when neither the server's reported max_model_len nor the tokenizer's
    limit is known; a trainer's limit is the export's (`--seq-length`, `data.max_length`)."""
    tool_calls: ToolCallLayout | None = None
    """How the family writes tool calls on ids (None: tokview reads no tool calls for it)."""
    format: str = THINK
    """THINK, HARMONY or PLAIN (`FORMATS`): what reads the output's structure off the ids."""
    history_reasoning: str = "after_last_user"
    """How the template treats history reasoning (`HISTORY_REASONING`)."""
    history_kwarg: str | None = None
    """The chat_template_kwargs key that keeps all history reasoning (`preserve_thinking` for Kimi-K2.6,
    `clear_thinking` (false) for GLM-4.7)."""
    effort_kwarg: str | None = None
    """The chat_template_kwargs key for reasoning effort (`reasoning_effort` for gpt-oss)."""
    date_kwarg: str | None = None
    """The chat_template_kwargs key of the date the template stamps into the prompt (`current_date` for gpt-oss):
    every request names it (today, unless pinned), so the capture records the date its prompt was rendered
    with and a rerun on another day renders the same ids from it. None: the template stamps no settable date."""
    default_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)
    """chat_template_kwargs every request sends (and records) unless the run says otherwise: gpt-oss's reasoning
    effort; a profile file can pin `current_date` here (`[default_kwargs]`)."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def has_reasoning(self) -> bool:
        """False for a plain chat model: no think delimiters, so every output id is answer or stop."""
        return self.think_open_id is not None and self.think_close_id is not None

    @property
    def delimiter_ids(self) -> frozenset[int]:
        return frozenset(i for i in (self.think_open_id, self.think_close_id) if i is not None)

    def template_kwargs(self, thinking: bool | None, today: str | None = None) -> dict[str, Any]:
        """The chat_template_kwargs to send (and to render locally) for this thinking setting: the profile's
        defaults, the thinking switch, and the date the template stamps (`today`, else the local date) unless a
        default pins it. Sent and recorded explicitly so a sample's prompt renders the same ids on another day."""
        kwargs = dict(self.default_kwargs)
        if thinking is not None and self.thinking_kwarg:
            kwargs[self.thinking_kwarg] = bool(thinking)
        if self.date_kwarg and not kwargs.get(self.date_kwarg):
            kwargs[self.date_kwarg] = today or date.today().isoformat()
        return kwargs

    def with_overrides(self, **changes: Unpack[ProfileChanges]) -> ModelProfile:
        return replace(self, **changes)


BUILTIN_PROFILES: dict[str, ModelProfile] = {
    "kimi-k2.5": ModelProfile(
        name="kimi-k2.5",
        think_open="<think>",
        think_close="</think>",
        think_open_id=KIMI_ID["<think>"],
        think_close_id=KIMI_ID["</think>"],
        stop_ids=(KIMI_ID["<|im_end|>"],),
        prefills_opener=True,
        thinking_kwarg="thinking",
        reasoning_parser="kimi_k2",
        tool_calls=KIMI_TOOL_CALLS,
    ),
    "kimi-k2-thinking": ModelProfile(
        name="kimi-k2-thinking",
        think_open="<think>",
        think_close="</think>",
        think_open_id=KIMI_ID["<think>"],
        think_close_id=KIMI_ID["</think>"],
        stop_ids=(KIMI_ID["<|im_end|>"],),
        prefills_opener=False,
        thinking_kwarg=None,
        reasoning_parser="kimi_k2",
        tool_calls=KIMI_TOOL_CALLS,
    ),
    "qwen3": ModelProfile(
        name="qwen3",
        think_open="<think>",
        think_close="</think>",
        think_open_id=151667,
        think_close_id=151668,
        stop_ids=(151645, 151643),
        prefills_opener=False,
        thinking_kwarg="enable_thinking",
        reasoning_parser="qwen3",
        tool_calls=QWEN3_TOOL_CALLS,
    ),
    "deepseek-r1": ModelProfile(
        name="deepseek-r1",
        think_open="<think>",
        think_close="</think>",
        think_open_id=128798,
        think_close_id=128799,
        stop_ids=(1,),
        prefills_opener=True,
        thinking_kwarg=None,
        reasoning_parser="deepseek_r1",
    ),
    # No reasoning: stop ids come from the tokenizer it is used with (`with_tokenizer_stops`).
    "plain": ModelProfile(
        name="plain",
        think_open="",
        think_close="",
        think_open_id=None,
        think_close_id=None,
        stop_ids=(),
        prefills_opener=False,
        thinking_kwarg=None,
        reasoning_parser=None,
        format=PLAIN,
        history_reasoning="none",
    ),
    # Harmony channels, not think tags: core.harmony reads the output (o200k_harmony ids).
    "gpt-oss": ModelProfile(
        name="gpt-oss",
        think_open="",
        think_close="",
        think_open_id=None,
        think_close_id=None,
        stop_ids=(200002, 200012, 199999),
        prefills_opener=False,
        thinking_kwarg=None,
        reasoning_parser="openai_gptoss",
        format=HARMONY,
        history_reasoning="last_loop",
        effort_kwarg="reasoning_effort",
        date_kwarg="current_date",
        default_kwargs={"reasoning_effort": "medium"},
    ),
    "glm-4.5": ModelProfile(
        name="glm-4.5",
        think_open="<think>",
        think_close="</think>",
        think_open_id=151350,
        think_close_id=151351,
        # `<|user|>` first: GLM has no end-of-turn id, its turn ends with the next role's header, which the model
        # generates to stop (`<|observation|>` before a tool's result) and the template renders after the turn, so a
        # chain's next prompt goes on from it; `<|endoftext|>` (what a simulated answer ended with, and what an audit
        # and SpecForge's template were given) broke every multi-turn chain at its stop
        stop_ids=(151336, 151338, 151329),
        prefills_opener=False,
        thinking_kwarg="enable_thinking",
        reasoning_parser="glm45",
        tool_calls=GLM_TOOL_CALLS,
    ),
}

# GLM-4.7: GLM-4.5's ids and stops; the generation prompt ends <think>, and reasoning is kept after the last user
# turn (everywhere with clear_thinking=false).
BUILTIN_PROFILES["glm-4.7"] = BUILTIN_PROFILES["glm-4.5"].with_overrides(
    name="glm-4.7", prefills_opener=True, history_kwarg="clear_thinking"
)
# Kimi-K2.6: K2.5's layout, plus preserve_thinking (all history reasoning kept).
BUILTIN_PROFILES["kimi-k2.6"] = BUILTIN_PROFILES["kimi-k2.5"].with_overrides(
    name="kimi-k2.6", history_kwarg="preserve_thinking"
)

_NO_REASONING: ProfileChanges = {
    "think_open": "",
    "think_close": "",
    "think_open_id": None,
    "think_close_id": None,
    "prefills_opener": False,
    "thinking_kwarg": None,
    "reasoning_parser": None,
}

_NEVER_THINKS: ProfileChanges = {**_NO_REASONING, "history_reasoning": "none"}
"""A think-tag profile made one of a model that does not reason."""

# Qwen3-Coder: Qwen3's ids and stops, no reasoning (its template never writes <think>), the XML calls; Qwen3-2507
# Instruct: the same with hermes calls. A folder with such a template is detected as one of them.
BUILTIN_PROFILES["qwen3-instruct"] = (
    BUILTIN_PROFILES["qwen3"].with_overrides(**_NEVER_THINKS).with_overrides(name="qwen3-instruct")
)
BUILTIN_PROFILES["qwen3-coder"] = BUILTIN_PROFILES["qwen3-instruct"].with_overrides(
    name="qwen3-coder", tool_calls=QWEN3_CODER_TOOL_CALLS
)

ALIASES = {
    "kimi": "kimi-k2.5",
    "kimi-k25": "kimi-k2.5",
    "qwen": "qwen3",
    "deepseek": "deepseek-r1",
    "r1": "deepseek-r1",
    "gpt-oss": "gpt-oss",
    "gptoss": "gpt-oss",
    "harmony": "gpt-oss",
    "glm": "glm-4.5",
    "kimi-k26": "kimi-k2.6",
    "none": "plain",
    "chat": "plain",
}


def get_profile(name: str) -> ModelProfile:
    """A built-in profile by name (or alias), or a profile from a TOML file path (`*.toml` or a path with `/`)."""
    if name.endswith(".toml") or "/" in name:
        return load_profile_toml(Path(name))
    key = ALIASES.get(name.lower(), name.lower())
    try:
        return BUILTIN_PROFILES[key]
    except KeyError:
        known = ", ".join(sorted(BUILTIN_PROFILES))
        raise ProfileError(f"unknown profile {name!r} (known: {known}, or a .toml file)") from None


def default_tokenizer_dir(profile: str | None, *, think_special: bool = True) -> Path:
    """The built-in Kimi-layout tokenizer a run without `--tokenizer` uses: K2.6's variant for the `kimi-k2.6`
    profile (its template reads `preserve_thinking`, so `--history-reasoning all` changes the prompt as on a real
    K2.6), K2-Thinking's for `kimi-k2-thinking` (its prompt does not pre-fill `<think>`), else K2.5's (a profile
    file too)."""
    name = ALIASES.get((profile or "").lower(), (profile or "").lower())
    model = name if name in ("kimi-k2.6", "kimi-k2-thinking") else "kimi-k2.5"
    return kimi_tokenizer_dir(think_special=think_special, model=model)


_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "think_open": str,
    "think_close": str,
    "think_open_id": (int, type(None)),
    "think_close_id": (int, type(None)),
    "prefills_opener": bool,
    "thinking_kwarg": (str, type(None)),
    "reasoning_parser": (str, type(None)),
    "max_length": (int, type(None)),
    "format": str,
    "history_reasoning": str,
    "history_kwarg": (str, type(None)),
    "effort_kwarg": (str, type(None)),
    "date_kwarg": (str, type(None)),
    "default_kwargs": dict,
}


def profile_fields(profile: ModelProfile) -> dict[str, Any]:
    """A profile as plain JSON values: what a run records, so its samples are read back with it."""
    fields = {
        name: list(value) if isinstance(value, tuple) else value
        for name, value in ((f, getattr(profile, f)) for f in ModelProfile.__dataclass_fields__ if f != "extra")
    }
    fields["tool_calls"] = tool_layout_fields(profile.tool_calls)
    return fields


def profile_from_fields(fields: object) -> ModelProfile | None:
    """The profile `profile_fields` recorded; None for anything that is not one (an older or damaged row)."""
    if not isinstance(fields, dict):
        return None
    try:
        data = {k: v for k, v in fields.items() if k in ModelProfile.__dataclass_fields__ and k != "extra"}
        data["stop_ids"] = tuple(int(i) for i in data.get("stop_ids") or ())
        if "tool_calls" in data:
            data["tool_calls"] = tool_layout_from_fields(data["tool_calls"], "recorded profile")
        else:  # recorded before profiles had tool-call layouts: a built-in's is its layout today
            builtin = BUILTIN_PROFILES.get(str(data.get("name")))
            data["tool_calls"] = builtin.tool_calls if builtin else None
        return ModelProfile(**data)
    except (TypeError, ValueError, ProfileError):
        return None


MAX_PROFILE_ID = 2**31 - 1
"""The highest id a profile may name: what a token id is anywhere tokview stores one (INTEGER)."""


def _as_text_dates(value: Any) -> Any:
    """A TOML value with its dates, times and date-times (at any depth) as ISO text: what JSON and a template take
    (a time in a table crashed every command that wrote the kwargs down)."""
    if isinstance(value, (date, time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _as_text_dates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_text_dates(v) for v in value]
    return value


def load_profile_toml(path: Path, _seen: tuple[Path, ...] = ()) -> ModelProfile:
    """Read a profile for a new model from a small TOML file.

    Either a complete profile, or `base = "qwen3"` (a built-in or another .toml) plus the keys that differ.
    `reasoning = false` says the model has no think delimiters (TOML has no null to say it per key): then
    only `name` is needed, and `stop_ids`, when left out, come from the tokenizer.
    """
    try:
        resolved = path.resolve()
    except (RuntimeError, OSError):  # Python 3.11 raises RuntimeError for a symlink loop
        raise ProfileError(f"profile file {path}: a symlink loop, or a path that cannot be resolved") from None
    if resolved in _seen:
        raise ProfileError(f"profile file {path}: `base` refers back to itself")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a BOM, as an editor on Windows writes
    except FileNotFoundError:
        raise ProfileError(f"profile file not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"profile file {path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ProfileError(f"profile file {path} nests its values too deep to read") from None
    except OSError as exc:
        raise ProfileError(f"cannot read profile file {path}: {exc.strerror or exc}") from None
    data = data.get("profile", data)
    if not isinstance(data, dict):
        raise ProfileError(f"profile file {path}: [profile] must be a table of keys, not {type(data).__name__}")
    base_name = data.pop("base", None)
    reasoning = data.pop("reasoning", None)
    if reasoning is not None and not isinstance(reasoning, bool):
        raise ProfileError(f"profile file {path}: reasoning must be true or false ({reasoning!r})")
    allowed = set(ModelProfile.__dataclass_fields__) - {"extra"}
    if "tool_calls" in data:
        data["tool_calls"] = tool_layout_from_fields(data["tool_calls"], f"profile file {path}")
    unknown = set(data) - allowed
    if unknown:
        raise ProfileError(f"profile file {path}: unknown keys {sorted(unknown)}")
    if reasoning is False:
        clash = sorted(k for k in data if k in _NO_REASONING and k != "prefills_opener" and data[k])
        if clash:
            raise ProfileError(f"profile file {path}: reasoning = false, yet it names think delimiters {clash}")
        data.update(_NO_REASONING)
    if "stop_ids" in data:
        stops = data["stop_ids"]
        if not isinstance(stops, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in stops):
            raise ProfileError(f"profile file {path}: stop_ids must be a list of integers")
        if not stops:
            raise ProfileError(f"profile file {path}: stop_ids is empty (leave it out to take the tokenizer's)")
        data["stop_ids"] = tuple(stops)
    for key in ("think_open_id", "think_close_id", "stop_ids"):  # past 2^31 a tokenizer's lookup overflows
        ids = data.get(key)
        for value in ids if isinstance(ids, tuple) else (ids,):
            if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= MAX_PROFILE_ID:
                raise ProfileError(f"profile file {path}: {key} {value} is not a token id (0 … 2^31-1)")
    for key, kinds in _FIELD_TYPES.items():
        value = data.get(key)
        if key in data and (not isinstance(value, kinds) or (isinstance(value, bool) and kinds is not bool)):
            raise ProfileError(f"profile file {path}: {key} has the wrong type ({value!r})")
    if "default_kwargs" in data:  # a TOML date (current_date = 2025-08-05, unquoted) is sent as the template's text
        data["default_kwargs"] = _as_text_dates(data["default_kwargs"])  # a table: its type was checked above
        if taken := reserved_template_kwargs(data["default_kwargs"]):
            raise ProfileError(f"profile file {path}: default_kwargs may not set {taken}: {RESERVED_WHY}")
    _check_choice(path, data, "format", FORMATS)
    _check_choice(path, data, "history_reasoning", HISTORY_REASONING)
    if data.get("format") == HARMONY:
        data.update(_NO_REASONING)  # Harmony has channels, no think delimiters
    if base_name:
        if not isinstance(base_name, str):
            raise ProfileError(f"profile file {path}: base must be a profile name or a .toml path")
        if base_name.endswith(".toml") or "/" in base_name:
            base = load_profile_toml((path.parent / base_name), _seen + (resolved,))
        else:
            base = get_profile(base_name)
        if "default_kwargs" in data:  # the keys a file names change the base's; the others stay
            data["default_kwargs"] = {**base.default_kwargs, **data["default_kwargs"]}
        merged = base.with_overrides(**data)
        if reasoning is True and not merged.has_reasoning:
            raise ProfileError(f"profile file {path}: reasoning = true needs think_open_id and think_close_id")
        return merged
    if reasoning is False:
        data.setdefault("stop_ids", ())
        if "name" not in data:
            raise ProfileError(f"profile file {path}: missing keys ['name']")
        return ModelProfile(**data)
    missing = {
        "name",
        "think_open",
        "think_close",
        "think_open_id",
        "think_close_id",
        "stop_ids",
        "prefills_opener",
    } - set(data)
    if missing:
        raise ProfileError(
            f'profile file {path}: missing keys {sorted(missing)} (or give base = "…", or '
            f"reasoning = false for a model without think delimiters)"
        )
    return ModelProfile(**data)


def _check_choice(path: Path, data: dict[str, Any], key: str, choices: tuple[str, ...]) -> None:
    if key in data and data[key] not in choices:
        raise ProfileError(f"profile file {path}: {key} = {data[key]!r} (known: {', '.join(choices)})")


_FAMILY_BY_OPEN_ID = {
    KIMI_ID["<think>"]: ("kimi-k2.5", "kimi-k2-thinking"),
    151667: ("qwen3", "qwen3"),
    128798: ("deepseek-r1", "deepseek-r1"),
    151350: ("glm-4.7", "glm-4.5"),  # GLM-4.7's generation prompt ends <think>, GLM-4.5's does not
}
_KEEPS_ALL_HISTORY = {"kimi-k2.5": ("preserve_thinking", "kimi-k2.6")}
"""A family whose next version's template reads a kwarg that keeps all history reasoning."""


def detect_profile(tokenizer: TokenizerAdapter) -> ModelProfile:
    """Work out the profile from a loaded tokenizer (a `TokenizerAdapter`).

    Finds the think tokens in the vocabulary and renders the chat template with
    `add_generation_prompt=True` to see whether it ends with the opener. A tokenizer without think
    tokens is a plain chat model: the `plain` profile, with the tokenizer's stop ids.
    """
    if _is_harmony(tokenizer):
        return BUILTIN_PROFILES["gpt-oss"].with_overrides(max_length=tokenizer.model_max_length)
    open_id = tokenizer.token_to_id("<think>")
    close_id = tokenizer.token_to_id("</think>")
    if open_id is None or close_id is None:
        # A plain chat model (or one whose delimiters have other names: then --profile says so).
        plain = BUILTIN_PROFILES["plain"].with_overrides(
            max_length=tokenizer.model_max_length, tool_calls=fitting_tool_layout(tokenizer)
        )
        return with_tokenizer_stops(plain, tokenizer)
    template = tokenizer.chat_template or ""
    kwarg = "enable_thinking" if "enable_thinking" in template else ("thinking" if "thinking" in template else None)
    prefills = False
    if template:
        kwargs = {kwarg: True} if kwarg else {}
        rendered = tokenizer.render(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, template_kwargs=kwargs
        )
        tail = [i for i in rendered[-4:] if tokenizer.piece_text(i).strip()]
        prefills = bool(tail) and tail[-1] == open_id
    stops = []
    for tok in ("<|im_end|>", "<|endoftext|>", "<｜end▁of▁sentence｜>"):
        tid = tokenizer.token_to_id(tok)
        if tid is not None:
            stops.append(tid)
    for tid in tokenizer_stop_ids(tokenizer):  # the eos, and generation_config.json's (what servers stop on)
        if tid not in stops and tid not in (open_id, close_id):
            stops.append(tid)
    with_prefill, without_prefill = _FAMILY_BY_OPEN_ID.get(open_id, ("custom", "custom"))
    name = with_prefill if prefills else without_prefill
    newer = _KEEPS_ALL_HISTORY.get(name)
    if newer and newer[0] in template:
        name = newer[1]
    base = BUILTIN_PROFILES.get(name)
    if base is not None:  # the family's own order first: an answer is written ending with the first (GLM: `<|user|>`)
        stops = [t for t in base.stop_ids if t in stops] + [t for t in stops if t not in base.stop_ids]
    layout = fitting_tool_layout(tokenizer, base.tool_calls if base else None)
    never_thinks = _never_thinks(template, kwarg, prefills)
    if name == "qwen3" and layout is not None and layout.parser == QWEN3_CODER:
        name = "qwen3-coder"  # not the built-in `qwen3`'s name: `--profile qwen3` reads hermes JSON calls
    elif name == "qwen3" and never_thinks:
        name = "qwen3-instruct"
    detected = ModelProfile(
        name=name,
        think_open="<think>",
        think_close="</think>",
        think_open_id=open_id,
        think_close_id=close_id,
        stop_ids=tuple(stops),
        prefills_opener=prefills,
        thinking_kwarg=kwarg,
        reasoning_parser=base.reasoning_parser if base else None,
        max_length=tokenizer.model_max_length,
        tool_calls=layout,
        history_reasoning=base.history_reasoning if base else "after_last_user",
        history_kwarg=base.history_kwarg if base else None,
        effort_kwarg=base.effort_kwarg if base else None,
    )
    if never_thinks:  # Qwen3-Coder, Qwen3-2507 Instruct: <think> in the vocabulary only
        return detected.with_overrides(**_NEVER_THINKS)
    return detected


def _never_thinks(template: str, kwarg: str | None, prefills: bool) -> bool:
    """A template that never writes a think delimiter and has no thinking switch is a model that does not reason:
    read with think delimiters, each plain answer was rebuilt with a `<think></think>` it never wrote (audit) and
    `doctor` doubted the profile."""
    return (
        bool(template) and kwarg is None and not prefills and "<think>" not in template and "</think>" not in template
    )


_HARMONY_IDS = {"<|start|>": 200006, "<|channel|>": 200005, "<|message|>": 200008, "<|return|>": 200002}


def _is_harmony(tokenizer: TokenizerAdapter) -> bool:
    """o200k_harmony: the Harmony markers at their ids, and a template (when there is one) that writes channels."""
    if any(tokenizer.token_to_id(text) != i for text, i in _HARMONY_IDS.items()):
        return False
    template = tokenizer.chat_template or ""
    return not template or "<|channel|>" in template


def tokenizer_stop_ids(tokenizer: TokenizerAdapter) -> tuple[int, ...]:
    """The ids a model ends its turn with: the tokenizer's eos, then generation_config.json's eos_token_id(s).

    generation_config.json is what servers stop on (vLLM and SGLang read it), and it often lists more
    than the tokenizer's eos (Llama 3: <|eot_id|> and <|end_of_text|>).
    """
    stops: list[int] = []
    if tokenizer.eos_token_id is not None:
        stops.append(int(tokenizer.eos_token_id))
    source = getattr(tokenizer, "source", None)
    config = Path(source) / "generation_config.json" if source else None
    if config is not None and config.is_file():
        try:
            eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            eos = None  # an unreadable generation config only loses its extra stop ids
        for tid in eos if isinstance(eos, list) else [eos]:
            if isinstance(tid, int) and not isinstance(tid, bool) and tid not in stops:
                stops.append(tid)
    return tuple(stops)


def with_tokenizer_stops(profile: ModelProfile, tokenizer: TokenizerAdapter | None) -> ModelProfile:
    """A plain profile that names no stop ids (`plain`, `reasoning = false` without stop_ids) gets the tokenizer's.

    A reasoning profile always names its own (an empty list there means: do not check stops).
    """
    if profile.stop_ids or profile.has_reasoning or tokenizer is None:
        return profile
    return profile.with_overrides(stop_ids=tokenizer_stop_ids(tokenizer))
