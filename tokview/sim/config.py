"""Simulator settings and the named quirk/fault flags it can reproduce.

Real deployments differ in small ways that break capture code (a renamed reasoning field, a build
without id fields, a bug that leaks prompt ids into `output_ids`) and fail in a handful of ways
(5xx, 429, stalls, half-written bodies). Each one has a name here so tests, the demo and
`tokview sim --quirk NAME[=VALUE]` can switch it on exactly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokview.errors import TokviewError

if TYPE_CHECKING:
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter

KINDS = ("vllm", "sglang")
SERVER_TEXT = {"vllm": "a vLLM", "sglang": "an SGLang"}

MAX_OUTPUT_TOKENS = 1_000_000
"""The most `output_tokens` may force: each answer is built whole before the request's max_tokens or the context cuts
it (more than the context is fine: the answer is then truncated, as a model's would be)."""

# name -> one-line meaning (shown by `tokview sim --help`)
BEHAVIOUR_QUIRKS: dict[str, str] = {
    "vllm-pre-0.16": "vLLM puts reasoning in `reasoning_content` instead of `reasoning` (builds before 0.16)",
    "no-id-fields": "no token-id fields at all (vLLM before 0.10.2, SGLang chat before return_token_ids, "
    "old SGLang /generate without output_ids)",
    "prompt-prefix-bug": "SGLang /generate output_ids begin with the last prompt ids (sglang #17240); "
    "value = how many (default 5)",
    "parser-all-reasoning": "the reasoning parser puts the whole output in the reasoning field",
    "no-reasoning-parser": "the server runs no reasoning parser (started without --reasoning-parser): the reasoning "
    "stays in `content`, the reasoning field is null (vLLM: answers without tools)",
    "sglang-chat-ids": "SGLang chat id field name: response_token_ids (0.5.23, default) or token_ids",
    "incremental-streaming": "SGLang /generate streams delta text/output_ids (--incremental-streaming-output)",
    "latency": "extra seconds before every generation response",
    "tool-calls": "calls the model writes in one tool-call section when the prompt declares tools (default 1; "
    "each: one call to every declared tool)",
    "tool-rounds": "tool-calling turns per tool loop (since the last user turn) before the model answers in text "
    "(default 1: it answers once the prompt ends with its results; each: until every declared tool was called)",
    "section-in-reasoning": "the model opens its tool-call section inside its reasoning: no </think> before it "
    "(Kimi-K2.5, SGLang #18086, vLLM #34955; thinking off: a sentence of content before it)",
    "unclosed-section": "the model ends a tool-calling turn without <|tool_calls_section_end|> (the parsers still "
    "return the calls); GLM: without its last </tool_call> (vLLM's glm47 parser then drops that call); Qwen3: "
    "without its last </tool_call> (SGLang's qwen25 parser drops that call, vLLM's hermes parser returns it)",
    "call-ids-restart": "the model numbers its calls from 0 in every turn (the recorded chain model): vLLM returns "
    "that duplicate id, SGLang its own count of history calls, which then differs from the output ids",
    "uuid-call-ids": "tool_calls[].id is chatcmpl-tool-<uuid>, not the call id the model wrote (vLLM 0.11.2, #29596)",
    "parser-drops-call": "the tool parser returns every call of a section but the last one (none when it had one)",
    "no-tool-parser": "vLLM started without --enable-auto-tool-choice: a request with tools and tool_choice auto (or none "
    "given) is refused, HTTP 400 (SGLang without --tool-call-parser answers as parser-drops-call on one call does)",
    "stream-misses-ids": "a streamed tool call loses ids: vLLM sends no chunk for the section's ids that give "
    "no delta (markers and call id, #27482), SGLang's final sglext output_ids lack the section's marker ids",
}
# A Harmony (gpt-oss) model's failures (`tokview.sim.harmony`), one quirk per Harmony finding.
HARMONY_QUIRKS: dict[str, str] = {
    "harmony-no-channel": "gpt-oss: the final header has no <|channel|> (`<|start|>assistant<|message|>`: "
    "llama.cpp #27720, the missing final header under EAGLE-3 of TensorRT-LLM #16377)",
    "harmony-constrain-for-start": "gpt-oss: <|constrain|> where <|start|> is due after the analysis message "
    "(vLLM #23567, HarmonyError)",
    "harmony-no-final": "gpt-oss: the analysis ends <|return|> and no final message follows",
    "harmony-analysis-after-final": "gpt-oss: the model reasons again after a final message (final <|end|>, "
    "analysis, final <|return|>)",
    "harmony-recipient-on-analysis": "gpt-oss: a tool call on the analysis channel (`analysis to=functions.NAME`: "
    "llama.cpp #15181, vllm-mlx #562)",
    "harmony-json-garbage": "gpt-oss: text before a tool call's JSON arguments (vLLM #43338, EAGLE-3 + json_schema)",
    "harmony-final-ends-call": "gpt-oss: the final message ends <|call|>, not <|return|>",
    "server-date": "gpt-oss: the chat surface stamps prompts with this date (YYYY-MM-DD) whatever chat_template_kwargs "
    "say, as vLLM's openai-harmony rendering stamps the server's own date",
}
BEHAVIOUR_QUIRKS.update(HARMONY_QUIRKS)
TOOL_COUNT_QUIRKS = ("tool-calls", "tool-rounds")
# Counted faults: value N = the first N generation requests (in order, one fault each); a bare
# flag (True) = every generation request, for "fails forever" tests.
FAULTS: dict[str, str] = {
    "stall": "hang until the client disconnects (or the simulator stops)",
    "drop-connection": "close the socket in the middle of the response body",
    "http-500": "HTTP 500 with an error body",
    "http-503": "HTTP 503 with an error body",
    "http-429": "HTTP 429 with `Retry-After: 0`",
    "malformed-json": "HTTP 200 whose body (or first SSE chunk) is not valid JSON",
    "stream-error": 'a streamed response sends a few chunks, then an {"error": ...} chunk and [DONE]',
}
FAULT_ORDER = tuple(FAULTS)
QUIRKS: dict[str, str] = {**BEHAVIOUR_QUIRKS, **FAULTS}

# -- what each quirk takes and where it acts ---------------------------------------------------------------------------
# A served tokenizer's traits (`tokenizer_traits`): "harmony" (gpt-oss), "think" (think tags its reasoning parser splits
# at), the tool-call layout the simulated model writes (`core.profiles.TOOL_PARSERS`; none for a family without one),
# and "kimi_k2+think" for Kimi's calls with think tags.
ANY_TOKENIZER = None
NEVER: frozenset[str] = frozenset()
THINK_TAGS = frozenset({"think"})
HARMONY_TOKENIZER = frozenset({"harmony"})
KIMI_TOOLS = frozenset({"kimi_k2"})
KIMI_REASONING = frozenset({"kimi_k2+think"})
TOOL_LAYOUTS = frozenset({"kimi_k2", "hermes", "glm47", "qwen3_coder"})
"""The layouts whose calls the simulated model writes (`common.SimState.generate`; gpt-oss calls on its own)."""
TRAIT_TEXT = {
    "harmony": "Harmony",
    "think": "think tags",
    "kimi_k2": "kimi_k2 tool calls",
    "hermes": "hermes tool calls",
    "glm47": "glm47 tool calls",
    "qwen3_coder": "qwen3_coder tool calls",
}
TOKENIZERS_TEXT: dict[frozenset[str], str] = {
    HARMONY_TOKENIZER: "a gpt-oss tokenizer (Harmony)",
    THINK_TAGS: "a tokenizer with think tags (a reasoning parser to leave out)",
    KIMI_TOOLS: "a Kimi tokenizer (kimi_k2 tool calls)",
    KIMI_REASONING: "a Kimi tokenizer with think tags (a reasoning to open its tool-call section in)",
    TOOL_LAYOUTS: "a tokenizer whose tool calls the simulated model writes (kimi_k2, hermes, glm47 or qwen3_coder)",
    TOOL_LAYOUTS | HARMONY_TOKENIZER: "a tokenizer whose tool calls the simulated model writes (kimi_k2, hermes, "
    "glm47, qwen3_coder or gpt-oss's)",
}


@dataclass(frozen=True)
class QuirkReach:
    """What a quirk takes and where it acts, as the simulator's code reads it (`cfg.quirk(NAME)`).

    `value`: what `NAME=VALUE` gives it (None: a switch, NAME alone or NAME=on/off). `vllm`, `sglang`: the tokenizers
    it acts on when that server is simulated: ANY_TOKENIZER (None) every one, a set of traits a tokenizer with one of
    them (`tokenizer_traits`), NEVER not on that server at all. A quirk asked where it never acts is refused
    (`SimConfig`, `SimConfig.check_tokenizer`): the run would look like a test of a failure that never happened."""

    value: str | None
    vllm: frozenset[str] | None
    sglang: frozenset[str] | None

    def tokenizers(self, kind: str) -> frozenset[str] | None:
        return self.vllm if kind == "vllm" else self.sglang


QUIRK_REACH: dict[str, QuirkReach] = {
    "vllm-pre-0.16": QuirkReach(None, ANY_TOKENIZER, NEVER),  # vllm.py: the reasoning field's name
    "no-id-fields": QuirkReach(None, ANY_TOKENIZER, ANY_TOKENIZER),
    "prompt-prefix-bug": QuirkReach("a count", NEVER, ANY_TOKENIZER),  # sglang.py: /generate's output_ids
    "parser-all-reasoning": QuirkReach(None, ANY_TOKENIZER, ANY_TOKENIZER),  # a plain model: a parser that runs
    "no-reasoning-parser": QuirkReach(None, THINK_TAGS, THINK_TAGS),  # gpt-oss's channels are read whatever it says
    "sglang-chat-ids": QuirkReach("a field name", NEVER, ANY_TOKENIZER),  # sglang_chat.py
    "incremental-streaming": QuirkReach(None, NEVER, ANY_TOKENIZER),  # sglang.py: /generate's stream
    "latency": QuirkReach("seconds", ANY_TOKENIZER, ANY_TOKENIZER),
    "tool-calls": QuirkReach("a count or each", TOOL_LAYOUTS, TOOL_LAYOUTS),  # gpt-oss calls its first tool once
    "tool-rounds": QuirkReach("a count or each", TOOL_LAYOUTS, TOOL_LAYOUTS),
    "section-in-reasoning": QuirkReach(None, KIMI_REASONING, KIMI_REASONING),  # only Kimi's tool turn takes it
    "unclosed-section": QuirkReach(None, TOOL_LAYOUTS, TOOL_LAYOUTS),
    "call-ids-restart": QuirkReach(None, KIMI_TOOLS, KIMI_TOOLS),  # the other layouts write no call ids
    "uuid-call-ids": QuirkReach(None, KIMI_TOOLS, NEVER),  # vLLM's bug: SGLang's kimi_k2 parser rebuilds the id
    "parser-drops-call": QuirkReach(None, TOOL_LAYOUTS, TOOL_LAYOUTS),
    "no-tool-parser": QuirkReach(None, ANY_TOKENIZER, NEVER),  # vllm.py: refused before any generation
    # vLLM: no chunk for a call's ids that give no delta (gpt-oss's too); SGLang: Kimi's or the tagged layout's
    # marker ids left out of sglext (a gpt-oss output has neither)
    "stream-misses-ids": QuirkReach(None, TOOL_LAYOUTS | HARMONY_TOKENIZER, TOOL_LAYOUTS),
    **{
        name: QuirkReach(None, HARMONY_TOKENIZER, HARMONY_TOKENIZER) for name in HARMONY_QUIRKS if name != "server-date"
    },
    "server-date": QuirkReach("a date", HARMONY_TOKENIZER, HARMONY_TOKENIZER),  # harmony.server_kwargs
    **{name: QuirkReach("a count", ANY_TOKENIZER, ANY_TOKENIZER) for name in FAULTS},
}

DEFAULT_VERSIONS = {"vllm": "0.32.0", "sglang": "0.5.23"}
PRE_016_VERSION = "0.15.1"


class SimConfigError(TokviewError):
    """A simulator setting that cannot work (unknown kind, unknown quirk, bad value)."""

    title = "simulator settings"


@dataclass
class SimConfig:
    """Everything that decides how the simulator answers."""

    kind: str = "vllm"
    tokenizer_dir: Path | None = None
    """None: the Kimi-layout tokenizer (built and cached offline)."""
    think_special: bool = True
    """For the Kimi-layout tokenizer: whether `</think>` is a special token (text parsers can't see it)."""
    quirks: dict[str, Any] = field(default_factory=dict)
    latency_s: float = 0.0
    output_tokens: int | None = None
    """Force every natural output to this many ids (for benchmarks that want long outputs)."""
    seed: int = 0
    model_name: str = "tokview-sim"
    version: str | None = None
    port: int = 0
    """0: pick a free port."""
    host: str = "127.0.0.1"
    max_model_len: int = 32768
    spec_decode: str | None = None
    """Report speculative-decoding metrics like this build (`tokview.sim.spec.SPEC_DECODE_MODES`); None: none."""
    profile: str | None = None
    """Serve the tokenizer as this profile (a name or a .toml), not the one detected from it: Kimi-K2.6 is
    K2.5's layout with `preserve_thinking`, a GLM-4.7-style family a think-tag model with its own ids."""
    api_key: str | None = None
    """Require `Authorization: Bearer <key>` as the server started with `--api-key` does: SGLang on every path but
    /health and /metrics, vLLM on its /v1 paths; 401 `{"error": "Unauthorized"}` without it."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SimConfigError(f"unknown simulator kind {self.kind!r} (use vllm or sglang)")
        unknown = sorted(set(self.quirks) - set(QUIRKS))
        if unknown:
            raise SimConfigError(f"unknown quirk(s) {', '.join(unknown)} (known: {', '.join(QUIRKS)})")
        for name, value in self.quirks.items():
            reach = QUIRK_REACH[name]
            if reach.value is None and not isinstance(value, bool):  # no-id-fields=3 was taken as on
                raise SimConfigError(
                    f"quirk {name} is a switch and takes no value (--quirk {name}, or {name}=off), got {value!r}"
                )
            if _on(value) and reach.tokenizers(self.kind) == NEVER:
                other = _other(self.kind)
                raise SimConfigError(
                    f"--quirk {name} acts only on {SERVER_TEXT[other]} simulator (--kind {other}); "
                    f"this one is {SERVER_TEXT[self.kind].split()[1]}"
                )
        ids_name = self.quirks.get("sglang-chat-ids", "response_token_ids")
        if ids_name not in ("response_token_ids", "token_ids"):
            raise SimConfigError("sglang-chat-ids must be response_token_ids or token_ids")
        day = self.quirks.get("server-date")
        if day is not None and not _a_date(day):  # 2025-13-45 matched the pattern and was served as a date
            got = "no date" if isinstance(day, bool) else repr(day)
            raise SimConfigError(f"quirk server-date takes a date YYYY-MM-DD (server-date=2026-05-01), got {got}")
        for name in TOOL_COUNT_QUIRKS:
            value = self.quirks.get(name, 1)
            if value is True or value == "each":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SimConfigError(f"quirk {name} takes a count (a whole number >= 1, or each), got {value!r}")
        for name in FAULTS:
            value = self.quirks.get(name)
            if value is not None and not isinstance(value, bool) and (not isinstance(value, int) or value < 0):
                raise SimConfigError(f"quirk {name} takes a count (a whole number >= 0), got {value!r}")
        prefix = self.quirks.get("prompt-prefix-bug", True)
        if not isinstance(prefix, bool) and (not isinstance(prefix, int) or prefix < 0):  # off/false/0: off
            raise SimConfigError(f"quirk prompt-prefix-bug takes a count (a whole number >= 0), got {prefix!r}")
        latency = self.quirks.get("latency", 0)
        if (
            isinstance(latency, bool)
            or not isinstance(latency, (int, float))
            or not math.isfinite(latency)
            or latency < 0
            or not math.isfinite(self.latency_s)
            or self.latency_s < 0
        ):
            raise SimConfigError(f"latency takes seconds (a number >= 0), got {latency!r}")
        if isinstance(self.max_model_len, bool) or not isinstance(self.max_model_len, int) or self.max_model_len < 2:
            raise SimConfigError(f"max_model_len must be a whole number of at least 2, got {self.max_model_len!r}")
        if self.output_tokens is not None and not 3 <= self.output_tokens <= MAX_OUTPUT_TOKENS:
            raise SimConfigError(  # the forced output is built whole before max_tokens cuts it: 10^20 ate the memory
                f"output_tokens must be between 3 and {MAX_OUTPUT_TOKENS:,}, got {self.output_tokens}"
            )
        if self.tokenizer_dir is not None:
            self.tokenizer_dir = Path(self.tokenizer_dir)
        from tokview.sim.spec import SPEC_DECODE_MODES

        if self.spec_decode is not None and self.spec_decode not in SPEC_DECODE_MODES:
            raise SimConfigError(f"unknown --spec-decode {self.spec_decode!r} (known: {', '.join(SPEC_DECODE_MODES)})")
        if self.spec_decode is not None and not self.spec_decode.startswith(self.kind):
            raise SimConfigError(
                f"--spec-decode {self.spec_decode} is a {self.spec_decode.split('-')[0]} mode, "
                f"not for a {self.kind} simulator"
            )

    @property
    def server_version(self) -> str:
        if self.version:
            return self.version
        if self.kind == "vllm" and self.quirks.get("vllm-pre-0.16"):
            return PRE_016_VERSION
        return DEFAULT_VERSIONS[self.kind]

    @property
    def total_latency_s(self) -> float:
        return float(self.latency_s) + float(self.quirks.get("latency", 0.0) or 0.0)

    def quirk(self, name: str) -> Any:
        return self.quirks.get(name)

    def check_tokenizer(self, profile: ModelProfile, tokenizer: TokenizerAdapter) -> None:
        """Refuse a quirk that never acts on the tokenizer served (as `profile`): a `harmony-*` quirk on a Kimi
        tokenizer, a Kimi tool quirk on GLM's, a tool quirk on a family the simulated model writes no calls for."""
        traits = tokenizer_traits(profile, tokenizer)
        for name, value in self.quirks.items():
            wanted = QUIRK_REACH[name].tokenizers(self.kind)
            if not _on(value) or wanted is None or wanted & traits:
                continue
            where = TOKENIZERS_TEXT.get(wanted) or " or ".join(TRAIT_TEXT[t] for t in sorted(wanted))
            elsewhere = QUIRK_REACH[name].tokenizers(_other(self.kind))
            server = "" if elsewhere in (wanted, NEVER) else f" on {SERVER_TEXT[self.kind]} simulator"
            raise SimConfigError(
                f"--quirk {name} acts only on {where}{server}; "
                f"this simulator serves {profile.name}'s ({_traits_text(traits)})"
            )


def tokenizer_traits(profile: ModelProfile, tokenizer: TokenizerAdapter) -> frozenset[str]:
    """What of the served tokenizer decides where a quirk acts (`QUIRK_REACH`), as `common.SimState.generate` and the
    chat surfaces dispatch: "harmony" for gpt-oss (its own model and parser, nothing else), else "think" when the
    profile has think tags, and the tool calls the model writes: the profile's tagged layout (hermes, glm47,
    qwen3_coder), else Kimi's where the tokenizer has Kimi's ids (that path writes and reads them whatever the profile
    names: `--profile plain` on the Kimi-layout tokenizer still calls tools), with "kimi_k2+think" when it also has
    think tags (a reasoning to open the section in)."""
    from tokview.core.profiles import HARMONY, TAGGED_PARSERS
    from tokview.sim.tools import has_kimi_ids

    if profile.format == HARMONY:
        return HARMONY_TOKENIZER
    traits = {"think"} if profile.has_reasoning else set()
    layout = profile.tool_calls.parser if profile.tool_calls is not None else None
    if layout in TAGGED_PARSERS:
        traits.add(str(layout))
    elif has_kimi_ids(tokenizer):
        traits.add("kimi_k2")
        if profile.has_reasoning:
            traits.add("kimi_k2+think")
    return frozenset(traits)


def _traits_text(traits: frozenset[str]) -> str:
    """`think tags, kimi_k2 tool calls`, `no think tags, no tool calls`, `Harmony`."""
    if "harmony" in traits:
        return TRAIT_TEXT["harmony"]
    think = TRAIT_TEXT["think"] if "think" in traits else "no think tags"
    calls = next((TRAIT_TEXT[t] for t in TOOL_LAYOUTS if t in traits), "no tool calls")
    return f"{think}, {calls}"


def _on(value: object) -> bool:
    """Whether a quirk's value switches it on (off, false or 0 leave it off)."""
    if isinstance(value, bool):
        return value
    return not (isinstance(value, (int, float)) and value == 0)


def _other(kind: str) -> str:
    return next(k for k in KINDS if k != kind)


def _a_date(value: object) -> bool:
    """Whether `value` is a real calendar date written YYYY-MM-DD."""
    import datetime

    if not isinstance(value, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        return False
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def parse_quirk(spec: str) -> tuple[str, Any]:
    """`http-503=2` -> ("http-503", 2); `no-id-fields` -> ("no-id-fields", True)."""
    name, sep, raw = spec.partition("=")
    name = name.strip()
    if name not in QUIRKS:
        raise SimConfigError(f"unknown quirk {name!r} (known: {', '.join(QUIRKS)})")
    if not sep:
        return name, True
    raw = raw.strip()
    low = raw.lower()
    if low in ("true", "yes", "on"):
        return name, True
    if low in ("false", "no", "off"):
        return name, False
    for cast in (int, float):
        try:
            return name, cast(raw)
        except ValueError:
            pass
    return name, raw
