"""One exported row per sample, in the shape each trainer reads (pipelines.md §7); `registry` says which
builder each format uses.

The speculators row is token-exact: `input_ids` are the served prompt ids + output ids, nothing
re-derived. The text formats (SpecForge, ShareGPT, Kimi inline) take their reasoning and answer
text from the *ids'* segments (decode of the reasoning ids, decode of the answer ids), not from
the server's reasoning/content split, which a parser may have got wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tokview.core import segments as seg
from tokview.core.profiles import ModelProfile
from tokview.core.record import Capture
from tokview.export.side_fields import speculators_fields
from tokview.store.records import scrub_text

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


REASONING_KINDS = (seg.PREFILLED_OPENER, seg.OPENER, seg.REASONING, seg.CLOSER)


def texts_from_ids(capture: Capture, profile: ModelProfile, tokenizer: Any) -> Texts:
    """The text of the exported ids' reasoning and answer segments.

    Cut by `core.segments.segment` over `output_ids` (the ids the row trains on), the same cut
    `analyze` makes, so an export and the findings never disagree about where reasoning ends;
    only the segmentation is computed, not the whole analysis (alignment, findings) per row.
    """
    ids, n_prompt = capture.input_ids, len(capture.prompt_ids)
    output_segments = [s for s in seg.segment(capture.prompt_ids, capture.output_ids, profile) if s.start >= n_prompt]

    def text_of(kind: str) -> str:
        return tokenizer.decode([t for s in output_segments if s.kind == kind for t in ids[s.start : s.end]])

    opened = any(s.kind in REASONING_KINDS for s in output_segments)
    return Texts(text_of(seg.REASONING) if opened else None, text_of(seg.ANSWER))


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


def _typed(value: Any, kind: type) -> Any:
    """`value` as `kind`, or None when unset or not representable (a bool is never a number)."""
    if value is None or (isinstance(value, bool) != (kind is bool)):
        return None
    try:
        out = kind(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return out if not isinstance(out, float) or math.isfinite(out) else None


def sampling_params(settings: dict[str, Any]) -> dict[str, Any]:
    """The sampling settings under speculators' names, every key present and typed."""
    raw = {dst: settings.get(src) for src, dst in SAMPLING_KEYS}
    raw["thinking"] = settings.get("thinking")
    return {key: _typed(raw.get(key), kind) for key, kind in SAMPLING_TYPES}


def usage_of(usage: dict[str, Any] | None) -> dict[str, int | None]:
    usage = usage if isinstance(usage, dict) else {}
    return {key: _typed(usage.get(key), int) for key in USAGE_KEYS}


def row_ids(items: list[tuple[str, str | None, int | None, int | None]], *, gen0: bool = True) -> list[str]:
    """Row ids for (prompt_id, run_id, turn, gen_index) in export order.

    `_gen{N}` is the sample's own generation index (not a count of rows per prompt); a second
    sample with the same prompt, turn and index (another run) gets `@{run_id}` after it. Text
    formats (`gen0=False`) keep SpecForge's `{id}#turn{k}` and add `_gen{N}` only from N = 1.
    """
    seen: set[str] = set()
    out = []
    for prompt_id, run_id, turn, gen_index in items:
        base = prompt_id if turn is None else f"{prompt_id}#turn{turn}"
        rid = f"{base}_gen{gen_index or 0}" if gen0 or gen_index else base
        if rid in seen:
            rid = f"{rid}@{run_id}"
            n = 1
            first = rid
            while rid in seen:
                n += 1
                rid = f"{first}.{n}"
        seen.add(rid)
        out.append(rid)
    return out


def speculators_row(item: ExportItem, profile: ModelProfile, tokenizer: Any) -> dict[str, Any]:
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
            "is_tool_call": False,
            "usage": usage_of(c.usage),
            "endpoint": endpoint_url(c),
            "sampling_params": sampling_params(c.settings),
            "tokview_sample_id": item.sample_id,
        },
        **speculators_fields(c),  # optional per-position logprobs / top-K / target scores, when captured
    }


def _history(item: ExportItem) -> list[dict[str, Any]]:
    if not item.capture.messages:
        raise Refused("no_conversation")  # e.g. an imported speculators row: ids only, no messages
    return [{"role": m["role"], "content": m.get("content") or ""} for m in item.capture.messages]


def _row_id(item: ExportItem) -> dict[str, Any]:
    """SpecForge's exploded-row ids: `{id}#turn{k}` with source_id/assistant_turn_index when multi-turn."""
    head: dict[str, Any] = {"id": item.row_id}
    if item.turn is not None:
        head.update(source_id=item.prompt_id, assistant_turn_index=item.turn)
    return head


def specforge_row(item: ExportItem, profile: ModelProfile, tokenizer: Any) -> dict[str, Any]:
    texts = texts_from_ids(item.capture, profile, tokenizer)
    assistant: dict[str, Any] = {"role": "assistant", "content": texts.content}
    if texts.reasoning is not None:
        assistant["reasoning_content"] = texts.reasoning
    return {**_row_id(item), "conversations": _history(item) + [assistant], "status": "success"}


def sharegpt_row(item: ExportItem, profile: ModelProfile, tokenizer: Any) -> dict[str, Any]:
    texts = texts_from_ids(item.capture, profile, tokenizer)
    turns = [{"from": SHAREGPT_FROM.get(m["role"], m["role"]), "value": m["content"]} for m in _history(item)]
    last: dict[str, Any] = {"from": "gpt", "value": texts.content}
    if texts.reasoning is not None:
        last["reasoning_content"] = texts.reasoning
    return {**_row_id(item), "conversations": turns + [last]}


def kimi_inline_row(item: ExportItem, profile: ModelProfile, tokenizer: Any) -> dict[str, Any]:
    """TorchSpec's Kimi-K2.5 shape: reasoning inline as `<think>…</think>` in the assistant content."""
    texts = texts_from_ids(item.capture, profile, tokenizer)
    content = texts.content
    if texts.reasoning is not None:
        content = f"{profile.think_open}{texts.reasoning}{profile.think_close}{content}"
    return {**_row_id(item), "conversations": _history(item) + [{"role": "assistant", "content": content}]}
