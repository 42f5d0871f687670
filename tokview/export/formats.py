"""One exported row per sample, in the shape each trainer reads (pipelines.md §7); `registry` says which
builder each format uses.

The speculators row is token-exact: `input_ids` are the served prompt ids + output ids, nothing
re-derived. The text formats (SpecForge, ShareGPT, Kimi inline) take their reasoning and answer
text from the *ids'* segments (decode of the reasoning ids, decode of the answer ids), not from
the server's reasoning/content split, which a parser may have got wrong.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, overload

from tokview.core import segments as seg
from tokview.core.finding_context import cut_by_length
from tokview.core.harmony import calls_of, function_name, parse_harmony, text_bodies
from tokview.core.profiles import HARMONY, ModelProfile
from tokview.core.record import Capture
from tokview.core.served_messages import messages_as_served
from tokview.core.served_tools import tools_as_served
from tokview.core.sglang_prefill import last_assistant
from tokview.core.tokenizer import TokenizerAdapter
from tokview.core.tool_calls import call_count, parse_tool_calls
from tokview.core.xml_tool_calls import history_arguments
from tokview.export.side_fields import speculators_fields
from tokview.secrets import scrub_text

ENDPOINT_PATHS = {
    "sglang-generate": "/generate",
    "sglang-chat": "/v1/chat/completions",
    "vllm-chat": "/v1/chat/completions",
    "vllm-completions": "/v1/completions",
}
DUAL_RAW_PATHS = {"sglang": "/generate", "vllm": "/v1/completions"}
"""A dual capture's ids come from the raw path, which is /generate on SGLang and /v1/completions on vLLM."""
SHAREGPT_FROM = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}
SAMPLING_KEYS = (("temperature", "temperature"), ("top_p", "top_p"), ("max_new_tokens", "max_tokens"), ("seed", "seed"))
MAX_TOKENS_AS_SENT = ("max_completion_tokens", "max_tokens")
"""The OpenAI names of the token budget a proxied request's settings keep, read when no `max_new_tokens` is set, in
the order vLLM and SGLang read them (`max_completion_tokens or max_tokens`)."""


class Refused(Exception):
    """This sample cannot be written in this format; `reason` is counted in the manifest."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class ExportItem:
    """What a row builder gets: the stored sample and where it sits among its prompt's exports."""

    sample_id: str
    prompt_id: str
    capture: Capture
    turn: int | None
    gen_index: int | None
    row_id: str = ""
    """The exported row's id: `{prompt_id}[#turn{t}]_gen{gen_index}`, unique within the export (see `row_ids`)."""


@dataclass(frozen=True)
class Texts:
    """Reasoning and answer text decoded from the ids' own segments."""

    reasoning: str | None
    """None when the output never entered reasoning (thinking off)."""
    content: str
    closed: bool = True
    """False when the reasoning never ended (cut at its max tokens inside it, or stopped there): no closer is written."""


REASONING_KINDS = (seg.PREFILLED_OPENER, seg.OPENER, seg.REASONING, seg.CLOSER)


def texts_from_ids(capture: Capture, profile: ModelProfile, tokenizer: TokenizerAdapter) -> Texts:
    """The text of the exported ids' reasoning and answer segments.

    Cut by `core.segments.segment` over `output_ids` (the ids the row trains on), the same cut
    `analyze` makes, so an export and the findings never disagree about where reasoning ends;
    only the segmentation is computed, not the whole analysis (alignment, findings) per row.
    """
    if profile.format == HARMONY:
        return _harmony_texts(capture, tokenizer)
    ids, n_prompt = capture.input_ids, len(capture.prompt_ids)
    # tool_calls=True: the calls' ids get their own kinds, so they are neither answer nor reasoning text
    output_segments = [
        s for s in seg.segment(capture.prompt_ids, capture.output_ids, profile, tool_calls=True) if s.start >= n_prompt
    ]

    def text_of(kind: str) -> str:
        return tokenizer.decode([t for s in output_segments if s.kind == kind for t in ids[s.start : s.end]])

    opened = any(s.kind in REASONING_KINDS for s in output_segments)
    closed = not opened or any(s.kind == seg.CLOSER for s in output_segments)
    return Texts(text_of(seg.REASONING) if opened else None, text_of(seg.ANSWER), closed)


def _harmony_texts(capture: Capture, tokenizer: TokenizerAdapter) -> Texts:
    """A Harmony output's analysis channel as the reasoning and its final channel (and a commentary preamble) as the
    answer (what vLLM's Harmony parser returns as `reasoning` / `content`: `core.harmony.text_bodies`), decoded from
    the ids; calls are neither. Read as think
    tags, a gpt-oss output has no answer at all: its rows were written with an empty assistant turn."""
    output = list(capture.output_ids)
    reasoning, content = text_bodies(parse_harmony(output, tokenizer))

    def text_of(bodies: list[tuple[int, int]]) -> str:  # each message's text per line, as vLLM joins them
        return "\n".join(t for t in (tokenizer.decode(output[start:end]) for start, end in bodies) if t)

    said = text_of(reasoning)
    return Texts(said if said else None, text_of(content))


def endpoint_url(capture: Capture) -> str:
    """The URL the exported ids were served from, without credentials.

    The stored request's own URL when there is one (in a dual capture: the raw path's); else the
    server URL plus the endpoint's path (a dual capture's raw path depends on the server kind).
    """
    request_url = (capture.raw_request or {}).get("url")
    if isinstance(request_url, str) and "://" in request_url:
        return scrub_text(request_url)
    if not capture.server_url:
        return capture.endpoint
    path = (
        DUAL_RAW_PATHS.get(capture.server_kind or "", "")
        if capture.endpoint == "dual"
        else ENDPOINT_PATHS.get(capture.endpoint, "")
    )
    return scrub_text(capture.server_url.rstrip("/")) + path


USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
SAMPLING_TYPES = (("temperature", float), ("top_p", float), ("max_tokens", int), ("seed", int), ("thinking", bool))
"""Every speculators row carries all of these keys, typed, null when unset: one schema across runs, so
`datasets.load_dataset("json")` can load a file that mixes runs with other settings."""


@overload
def _typed(value: object, kind: type[bool]) -> bool | None: ...


@overload
def _typed(value: object, kind: type[int]) -> int | None: ...


@overload
def _typed(value: object, kind: type[float]) -> float | None: ...


def _typed(value: object, kind: type[float]) -> float | None:
    """`value` as `kind`, or None when unset or not representable (a bool is never a number; JSON's lists and
    objects are not numbers either)."""
    if value is None or (isinstance(value, bool) != (kind is bool)) or not isinstance(value, (int, float, str)):
        return None
    try:
        out = kind(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if not isinstance(out, float) or math.isfinite(out) else None


def sampling_params(settings: dict[str, Any]) -> dict[str, Any]:
    """The sampling settings under speculators' names, every key present and typed."""
    raw = {dst: settings.get(src) for src, dst in SAMPLING_KEYS}
    for name in MAX_TOKENS_AS_SENT:  # a proxied request keeps the name its client sent (batch: max_new_tokens)
        if raw["max_tokens"] is None:
            raw["max_tokens"] = settings.get(name)
    raw["thinking"] = settings.get("thinking")
    return {key: _typed(raw.get(key), kind) for key, kind in SAMPLING_TYPES}


def usage_of(usage: dict[str, Any] | None) -> dict[str, int | None]:
    """The usage keys, typed; `total_tokens` is prompt + completion where the stored usage has no total (a capture
    keeps the two counts the findings check, not the server's sum: every row's total was null)."""
    usage = usage if isinstance(usage, dict) else {}
    out = {key: _typed(usage.get(key), int) for key in USAGE_KEYS}
    prompt, completion = out["prompt_tokens"], out["completion_tokens"]
    if out["total_tokens"] is None and prompt is not None and completion is not None:
        out["total_tokens"] = prompt + completion
    return out


def row_ids(items: list[tuple[str, str | None, int | None, int | None, str]], *, gen0: bool = True) -> list[str]:
    """Row ids for (prompt_id, run_id, turn, gen_index, sample_id) in export order.

    `_gen{N}` is the sample's own generation index (not a count of rows per prompt); samples with the same prompt,
    turn and index from other runs get `@{run_id}` after it, all but the first run's by name (not the first in
    export order: a trajectory and a speculators export of one store gave one sample two ids). Text formats
    (`gen0=False`) keep SpecForge's `{id}#turn{k}` and add `_gen{N}` only from N = 1. Samples that share all of
    those within one run (a proxied session's branches: two next turns from one history) each get `@{sample_id}`:
    with `@{run_id}`, or none, `tokview show` found both and named neither.
    """

    def plain(prompt_id: str, turn: int | None, gen_index: int | None) -> str:
        base = prompt_id if turn is None else f"{prompt_id}#turn{turn}"
        return f"{base}_gen{gen_index or 0}" if gen0 or gen_index else base

    shared = Counter((plain(p, t, g), run) for p, run, t, g, _ in items)
    owner: dict[str, str] = {}  # the run whose sample gets the bare id: the first by name
    for base, run in shared:
        owner[base] = min(owner.get(base, run or ""), run or "")
    seen: set[str] = set()
    out = []
    for prompt_id, run_id, turn, gen_index, sample_id in items:
        base = plain(prompt_id, turn, gen_index)
        if shared[(base, run_id)] > 1:
            rid = f"{base}@{sample_id}"
        else:
            rid = base if (run_id or "") == owner[base] else f"{base}@{run_id}"
        n, first = 1, rid
        while rid in seen:  # a prompt id that itself ends `@run` (never a sample id: unique)
            n += 1
            rid = f"{first}.{n}"
        seen.add(rid)
        out.append(rid)
    return out


def speculators_row(item: ExportItem, profile: ModelProfile, tokenizer: TokenizerAdapter) -> dict[str, Any]:
    c = item.capture
    input_ids = list(c.prompt_ids) + list(c.output_ids)
    return {
        "id": item.row_id,
        "primary_id": item.prompt_id,
        "input_ids": input_ids,
        "loss_mask": seg.loss_mask(c.prompt_ids, c.output_ids),
        "text": tokenizer.decode(input_ids, skip_special_tokens=False),
        "metadata": {
            "idx": item.gen_index or 0,
            "turn": item.turn,
            "finish_reason": c.finish_reason,
            "is_tool_call": call_count(c.output_ids, profile) > 0,
            "usage": usage_of(c.usage),
            "endpoint": endpoint_url(c),
            "sampling_params": sampling_params(c.settings),
            "tokview_sample_id": item.sample_id,
        },
        **speculators_fields(c),  # optional per-position logprobs / top-K / target scores, when captured
    }


CHAT_ENDPOINTS = ("sglang-chat", "vllm-chat")


def conversation_of(capture: Capture) -> list[dict[str, Any]] | None:
    """The messages the prompt ids were rendered from: the capture's own, else (a request `tokview proxy`
    recorded with tools, whose messages it does not render locally) the stored chat request's."""
    if capture.messages:
        return capture.messages
    body = (capture.raw_request or {}).get("body") if capture.endpoint in CHAT_ENDPOINTS else None
    messages = body.get("messages") if isinstance(body, dict) else None
    return messages if isinstance(messages, list) and messages else None


def tools_of(capture: Capture) -> list[dict[str, Any]] | None:
    """The request's `tools` (settings record them for batch and proxy captures alike)."""
    tools = capture.settings.get("tools")
    return tools if isinstance(tools, list) and tools else None


def tools_column(capture: Capture) -> dict[str, Any]:
    """`{"tools": "<JSON text>"}` when the server's template rendered tools, else nothing.

    The tools as the server rendered them (`core.served_tools`: SGLang's with `"defer_loading": null`, none with
    `tool_choice: "none"`), not as the request sent them: with the request's, a trainer's re-render of an SGLang
    row differed from its served ids inside the tools block, on every row with tools. A JSON string, not a list:
    both trainers json.loads a string `tools` (SpecForge `build_eagle3_dataset`, speculators `_parse_conv_tools`),
    while a list goes through `datasets`' Arrow schema: versions that infer one struct for all rows (datasets 5.2
    keeps nested dicts as Json and does not) give every tool the other rows' keys as null, and the template would
    render `"description": null` where the server rendered none."""
    tools = tools_as_served(tools_of(capture), capture.server_kind, capture.settings.get("tool_choice"))
    return {"tools": json.dumps(tools, ensure_ascii=False)} if tools else {}


def _openai_call(call: object) -> dict[str, Any]:
    """A history tool call in the OpenAI shape both trainers and templates read (arguments as sent)."""
    fields: dict[str, Any] = call if isinstance(call, dict) else {}
    function = fields.get("function")
    function = function if isinstance(function, dict) else {}
    return {
        "id": fields.get("id") or "",
        "type": fields.get("type") or "function",
        "function": {"name": function.get("name") or "", "arguments": function.get("arguments", "")},
    }


def history_message(message: dict[str, Any], server_kind: str | None) -> dict[str, Any]:
    """One message of the conversation as the server rendered it: role and content, an assistant's tool
    calls and the reasoning the server kept (`reasoning_content`; vLLM also reads `reasoning`, SGLang
    ignores it, so it is carried only where the server used it), a tool result's call id and name."""
    out: dict[str, Any] = {"role": message.get("role"), "content": message.get("content") or ""}
    reasoning = message.get("reasoning_content")
    if reasoning is None and server_kind != "sglang":
        reasoning = message.get("reasoning")
    if isinstance(reasoning, str) and message.get("role") == "assistant":
        out["reasoning_content"] = reasoning
    if isinstance(message.get("tool_calls"), list) and message["tool_calls"]:
        out["tool_calls"] = [_openai_call(c) for c in message["tool_calls"]]
    for key in ("tool_call_id", "name"):
        if message.get("role") == "tool" and isinstance(message.get(key), str):
            out[key] = message[key]
    return out


def _history(item: ExportItem, tokenizer: TokenizerAdapter) -> list[dict[str, Any]]:
    """The history messages, their content as the server's template got it (`core.served_messages`: text parts
    joined, a null made "" or dropped): a trainer's template renders the text the server rendered, not the parts."""
    messages = conversation_of(item.capture)
    if not messages:
        raise Refused("no_conversation")  # e.g. an imported speculators row: ids only, no messages
    messages = messages_as_served(messages, item.capture.server_kind, tokenizer.chat_template)
    return [history_message(m, item.capture.server_kind) for m in messages if isinstance(m, dict)]


def served_calls(capture: Capture, profile: ModelProfile, tokenizer: TokenizerAdapter) -> list[dict[str, Any]]:
    """The calls the output ids hold, in the OpenAI shape, as the model wrote them: the call id text and the
    arguments text from the ids (the template renders them back verbatim), not the server's `tool_calls`
    (SGLang renumbers ids, a parser may drop a call). A layout without call ids (hermes) takes the
    server's id for the same call, else `call_{i}`."""
    server = capture.tool_calls or []
    if profile.format == HARMONY:
        return _harmony_calls(capture, tokenizer, server)
    if profile.tool_calls is None:
        return []
    parsed = parse_tool_calls(capture.output_ids, profile.tool_calls, tokenizer, capture.settings.get("tools"))
    out = []
    for i, call in enumerate(parsed.calls):
        if call.name is None:
            raise Refused("tool_call_unreadable")  # its name unread (malformed, or another layout's): nothing to render
        call_id = call.call_id or _server_call_id(server, i)
        arguments = call.arguments if call.arguments is not None else ""
        if call.parameters is not None:  # qwen3_coder: values that render back as written
            arguments = history_arguments(call.parameters, capture.settings.get("tools"), call.name)
        function = {"name": call.name, "arguments": arguments}
        out.append({"id": call_id, "type": "function", "function": function})
    return out


def _server_call_id(server: list[Any], i: int) -> str:
    """The id the server gave the i-th call, else `call_{i}` (for a layout whose ids hold none)."""
    given = server[i].get("id") if i < len(server) and isinstance(server[i], dict) else None
    return str(given) if given else f"call_{i}"


def _harmony_calls(capture: Capture, tokenizer: TokenizerAdapter, server: list[Any]) -> list[dict[str, Any]]:
    """A Harmony output's function calls (`harmony.calls_of`: to `functions.…`, ended by `<|call|>`): the name from
    the recipient, the arguments as the ids spell them; Harmony has no call ids, so the server's id for the same call."""
    output = list(capture.output_ids)
    out = []
    for i, call in enumerate(calls_of(parse_harmony(output, tokenizer))):
        function = {"name": function_name(call.recipient), "arguments": tokenizer.decode(output[slice(*call.body)])}
        out.append({"id": _server_call_id(server, i), "type": "function", "function": function})
    return out


def served_assistant(capture: Capture, profile: ModelProfile, tokenizer: TokenizerAdapter) -> dict[str, Any]:
    """The generated turn as an assistant message: answer and reasoning from the ids' segments, and its calls."""
    texts = texts_from_ids(capture, profile, tokenizer)
    calls = served_calls(capture, profile, tokenizer)
    # only whitespace beside the calls (Qwen3's "\n\n" after </think>) is the template's own: as content, a
    # template that writes a separator before the first call of a turn with content would write one more
    content = "" if calls and not texts.content.strip() else texts.content
    assistant: dict[str, Any] = {"role": "assistant", "content": content}
    if texts.reasoning is not None:
        assistant["reasoning_content"] = texts.reasoning
    if calls:
        assistant["tool_calls"] = calls
    return assistant


def _row_id(item: ExportItem) -> dict[str, Any]:
    """SpecForge's exploded-row ids: `{id}#turn{k}` with source_id/assistant_turn_index when multi-turn."""
    head: dict[str, Any] = {"id": item.row_id}
    if item.turn is not None:
        head.update(source_id=item.prompt_id, assistant_turn_index=item.turn)
    return head


def _served_history(item: ExportItem, tokenizer: TokenizerAdapter) -> tuple[list[dict[str, Any]], str]:
    """The history as its server rendered it, and the prefill the answer went on from ("" for none).

    A request that asked to go on from its last message (`continue_final_message`, which the proxy records) made
    its assistant's start a prefill: it and the answer are one assistant turn, as the prompt and output ids hold
    them; written as two, a trainer rendered a closed turn and a second assistant turn. Without the flag a history
    ending with the assistant is a closed turn and the answer a new one (vLLM renders it closed; SGLang sends it as
    the user's, and so is it written here: `core.sglang_prefill`)."""
    history = _history(item, tokenizer)
    if item.capture.settings.get("continue_final_message") is not True:
        if item.capture.server_kind == "sglang":
            history, _ = last_assistant(history, False)
        return history, ""
    last = history[-1] if history else {}
    if last.get("role") == "assistant" and isinstance(last.get("content"), str) and not last.get("tool_calls"):
        return history[:-1], last["content"]
    return history, ""


def _conversation(item: ExportItem, profile: ModelProfile, tokenizer: TokenizerAdapter) -> list[dict[str, Any]]:
    """The history and the served turn, a prefill and its answer as one (`_served_history`)."""
    history, prefill = _served_history(item, tokenizer)
    served = served_assistant(item.capture, profile, tokenizer)
    if prefill:
        served = {**served, "content": prefill + served["content"]}
    return [*history, served]


def _cut(item: ExportItem, profile: ModelProfile) -> dict[str, Any]:
    """`truncated: true` on a text row whose sample was cut at its max tokens (exported with `--select all`): its
    text holds no sign of the cut, and an audit of the export read such rows as whole turns (a closer and a stop
    made up after reasoning that never ended). `tokview audit` reads the key; a row that was not cut has none."""
    c = item.capture
    return {"truncated": True} if cut_by_length(c.finish_reason, c.output_ids, profile.stop_ids) else {}


def specforge_row(item: ExportItem, profile: ModelProfile, tokenizer: TokenizerAdapter) -> dict[str, Any]:
    conversation = _conversation(item, profile, tokenizer)
    row = {**_row_id(item), "conversations": conversation, **tools_column(item.capture), "status": "success"}
    return {**row, **_cut(item, profile)}


def to_sharegpt(message: dict[str, Any]) -> dict[str, Any]:
    """A message as ShareGPT writes it: `from`/`value`, its other keys (reasoning, calls, call id) as they are."""
    rest = {k: v for k, v in message.items() if k not in ("role", "content")}
    return {"from": SHAREGPT_FROM.get(message["role"], message["role"]), "value": message["content"], **rest}


def sharegpt_row(item: ExportItem, profile: ModelProfile, tokenizer: TokenizerAdapter) -> dict[str, Any]:
    conversation = _conversation(item, profile, tokenizer)
    row = {**_row_id(item), "conversations": [to_sharegpt(m) for m in conversation], **tools_column(item.capture)}
    return {**row, **_cut(item, profile)}


def kimi_inline_row(item: ExportItem, profile: ModelProfile, tokenizer: TokenizerAdapter) -> dict[str, Any]:
    """TorchSpec's Kimi-K2.5 shape: reasoning inline as `<think>…</think>` in the assistant content.

    A row with tools, tool calls or tool results is refused (`tool_calls_not_inline`): TorchSpec rejects
    the `tool` role, and the shape has no field for calls the template would render back; the specforge
    and speculators formats carry them."""
    history, prefill = _served_history(item, tokenizer)
    if (
        tools_of(item.capture)
        or served_calls(item.capture, profile, tokenizer)
        or any(m.get("tool_calls") or m["role"] == "tool" for m in history)
    ):
        raise Refused("tool_calls_not_inline")
    texts = texts_from_ids(item.capture, profile, tokenizer)
    content = texts.content
    if texts.reasoning is not None:
        # reasoning that never ended: no closer the model never wrote (`truncated: true` says a row was cut)
        closer = profile.think_close if texts.closed else ""
        content = f"{profile.think_open}{texts.reasoning}{closer}{content}"
    row = {**_row_id(item), "conversations": history + [{"role": "assistant", "content": prefill + content}]}
    return {**row, **_cut(item, profile)}
