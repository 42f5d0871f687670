"""Re-render an exported row the way each trainer would, and compare with the ids the server served.

A text export is only as exact as the path a trainer reads it through. These functions follow the
trainers' own rules (read from their code, not imported: tokview never depends on a trainer):

- speculators `prepare_data.py --render-endpoint` (`_render_boundary_rows`): one row for *every*
  assistant turn j after the first message: render `conv[:j]` with the generation prompt and
  `conv[:j+1]` without; the full render is the row, the mask is 1 from the end of the generation
  prompt (or, where the two diverge, from their common prefix). A turn whose context alone fills
  `--seq-length` is skipped. Turns are normalised as it does: `from`/`value` accepted, `thinking` or
  `reasoning_content` (when non-empty) carried as both, `tool_calls` and `tool_call_id` kept (a tool's
  `name` is not); the row's `tools` (a list or its JSON text) go to the render, and vLLM's render loads each
  call's `arguments` text as JSON before the template sees it (invalid: `{}`). So a multi-turn row also trains on its
  history's assistant turns, which this run did not serve (`history_supervised`).
- SpecForge `build_eagle3_dataset` (`GeneralParser` / `ThinkingParser.parse`): a system prompt from
  the template when the row has none, the conversation rendered without the generation prompt
  (`enable_thinking=True` when the template says so, plus every extra column of the row as a
  template kwarg), encoded whole; the mask is 1 over `assistant_header(.*?)(end_of_turn|$)` with
  positions found by encoding each string prefix; `ignore_token` strings masked back to 0. Messages
  are sanitised as `_sanitize_message` does: only role/content/tool_calls kept (`ThinkingParser` also
  reasoning_content, name, tool_call_id), each call cut to id/type/function{name, arguments}, the
  arguments text loaded as JSON (invalid: `{}`); the row's `tools` (JSON text or list) rendered as `tools`.
- SpecForge `is_preformatted=True` on a speculators row's `text`: the same mask rule over the text.

`compare` then says whether the trainer trains on the served ids with the served mask.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

EXACT = "exact"
EXACT_PLUS_SUFFIX = "exact_plus_unsupervised_suffix"
IDS_DIFFER = "ids_differ"
MASK_DIFFER = "mask_differ"
HISTORY_SUPERVISED = "history_supervised"
FAILED = "render_failed"
OUTCOMES = (EXACT, EXACT_PLUS_SUFFIX, IDS_DIFFER, MASK_DIFFER, HISTORY_SUPERVISED, FAILED)
"""`exact_plus_unsupervised_suffix`: the served ids and mask, then template text after the last
end-of-turn (Qwen3's "\\n") with mask 0: trains on exactly the served tokens. `history_supervised`:
the row itself is exact, but the trainer also makes rows that supervise earlier assistant turns (the
prompts file's history, never served by this run)."""

SPECULATORS_SEQ_LENGTH = 8192
"""speculators `prepare_data.py --seq-length` default (c05b95b): a turn whose context fills it is skipped."""

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
SPECFORGE_STANDARD_KEYS = {"role", "content", "tool_calls"}
SPECFORGE_THINKING_KEYS = SPECFORGE_STANDARD_KEYS | {"reasoning_content", "name", "tool_call_id"}
SPECFORGE_ROW_KEYS_NOT_KWARGS = ("conversations", "id", "tools")


@dataclass(frozen=True)
class Rendered:
    ids: list[int]
    mask: list[int]


def compare(served: Rendered, got: Rendered | None) -> str:
    if got is None:
        return FAILED
    n = len(served.ids)
    if got.ids == served.ids:
        return EXACT if got.mask == served.mask else MASK_DIFFER
    if got.ids[:n] == served.ids and not any(got.mask[n:]):
        return EXACT_PLUS_SUFFIX if got.mask[:n] == served.mask else MASK_DIFFER
    return IDS_DIFFER


def is_exact(outcome: str) -> bool:
    return outcome in (EXACT, EXACT_PLUS_SUFFIX)


# -- speculators prepare_data.py --render-endpoint ---------------------------------------------------------


def row_tools(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A row's `tools` as both trainers read it: a list, or JSON text loaded (unreadable or empty: none)."""
    tools = row.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            return None
    return tools if isinstance(tools, list) and tools else None


def _loaded_arguments(arguments: object) -> object:
    """A call's arguments as the trainers hand them to the template: JSON text loaded, `{}` when invalid."""
    if not isinstance(arguments, str):
        return arguments if arguments is not None else {}
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return {}


def sanitized_calls(calls: object) -> object:
    """SpecForge `_sanitize_message` on `tool_calls` (vLLM's render does the same to the arguments): a list of
    calls cleaned (JSON text loaded first; unreadable text gives None), anything else as it was."""
    if isinstance(calls, str):
        try:
            calls = json.loads(calls)
        except json.JSONDecodeError:
            return None
    if not isinstance(calls, list):
        return calls
    out = []
    for call in calls:
        if not isinstance(call, dict):
            continue
        clean: dict[str, Any] = {"id": call.get("id", ""), "type": call.get("type", "function")}
        function = call.get("function", {})
        if isinstance(function, dict):
            clean["function"] = {
                "name": function.get("name", ""),
                "arguments": _loaded_arguments(function.get("arguments", {})),
            }
        out.append(clean)
    return out


def with_tools(kwargs: dict[str, Any] | None, tools: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return {**(kwargs or {}), "tools": tools} if tools else kwargs


def speculators_turns(conversation: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """speculators' `_normalize_conversation`: role/content, reasoning as `thinking` + `reasoning_content`,
    `tool_calls` (arguments loaded as vLLM's render loads them) and `tool_call_id` kept."""
    out = []
    for turn in conversation:
        role = turn.get("from", turn.get("role", ""))
        role = {"human": "user", "gpt": "assistant"}.get(role, role)
        if role not in ("user", "assistant", "system", "tool"):
            role = "assistant"
        norm = {"role": role, "content": turn.get("value") or turn.get("content") or ""}
        if turn.get("tool_calls"):
            norm["tool_calls"] = sanitized_calls(turn["tool_calls"])
        if turn.get("tool_call_id"):
            norm["tool_call_id"] = turn["tool_call_id"]
        thinking = turn.get("thinking") or turn.get("reasoning_content")
        if thinking:
            norm["thinking"] = norm["reasoning_content"] = thinking
        out.append(norm)
    return out


def render_boundaries(
    conversation: Sequence[dict[str, Any]],
    tokenizer: TokenizerAdapter,
    template_kwargs: dict[str, Any] | None,
    seq_length: int = SPECULATORS_SEQ_LENGTH,
) -> list[Rendered] | None:
    """The rows speculators' render path makes of one conversation, one per assistant turn, in order.

    None when it makes none for the last turn (a template that cannot render the conversation, renders
    that diverge inside the history: speculators then drops the whole conversation)."""
    conv = speculators_turns(conversation)
    turns = [j for j, t in enumerate(conv) if t["role"] == "assistant" and j > 0]
    if not turns:
        return None
    rows: list[Rendered] = []
    try:
        for j in turns:
            prompt = tokenizer.render(conv[:j], add_generation_prompt=True, template_kwargs=template_kwargs)
            if len(prompt) >= seq_length:
                if j == turns[-1]:
                    return None
                continue  # speculators skips this turn only: a later one may fit again
            row = _boundary_row(conv, j, prompt, tokenizer, template_kwargs)
            if row is None:
                return None  # speculators raises BoundaryUnstableError and drops the conversation
            rows.append(row)
    except Exception:  # a template that cannot render the conversation: the trainer skips it
        return None
    return rows


def _boundary_row(
    conv: list[dict[str, Any]],
    j: int,
    prompt: list[int],
    tokenizer: TokenizerAdapter,
    template_kwargs: dict[str, Any] | None,
) -> Rendered | None:
    full = tokenizer.render(conv[: j + 1], add_generation_prompt=False, template_kwargs=template_kwargs)
    if full[: len(prompt)] == prompt:
        boundary = len(prompt)
    else:
        boundary = 0
        for a, b in zip(prompt, full):
            if a != b:
                break
            boundary += 1
        history = tokenizer.render(conv[:j], add_generation_prompt=False, template_kwargs=template_kwargs)
        if full[: len(history)] != history or boundary < len(history):
            return None
    return Rendered(full, [0] * boundary + [1] * (len(full) - boundary))


def compare_render_rows(served: Rendered, rows: list[Rendered] | None) -> str:
    """The render path's outcome: its last row against the served ids, and no other row supervised."""
    if not rows:
        return FAILED
    outcome = compare(served, rows[-1])
    if is_exact(outcome) and any(any(r.mask) for r in rows[:-1]):
        return HISTORY_SUPERVISED
    return outcome


# -- SpecForge build_eagle3_dataset ----------------------------------------------------------------------


def specforge_messages(conversation: Sequence[dict[str, Any]], template: dict[str, Any]) -> list[dict[str, Any]]:
    """SpecForge's `GeneralParser.parse` message handling (normalise, system prompt, alternation, sanitise)."""
    keys = SPECFORGE_THINKING_KEYS if template.get("parser_type") == "thinking" else SPECFORGE_STANDARD_KEYS
    conv = []
    for m in conversation:
        role = m.get("role", m.get("from", ""))
        role = SHAREGPT_ROLES.get(role, role)
        norm = {k: v for k, v in m.items() if k not in ("from", "value")}
        norm.update(role=role, content=m.get("content") or m.get("value") or "")
        if "tool_calls" in norm:
            norm["tool_calls"] = sanitized_calls(norm["tool_calls"])
            if norm["tool_calls"] is None:
                del norm["tool_calls"]
        conv.append(norm)
    messages: list[dict[str, Any]] = []
    if conv and conv[0]["role"] == "system":
        messages.append({"role": "system", "content": conv[0]["content"]})
        conv = conv[1:]
    elif template.get("system_prompt"):
        messages.append({"role": "system", "content": template["system_prompt"]})
    while conv and conv[0]["role"] != "user":
        conv = conv[1:]
    for j, m in enumerate(conv):
        if j and m["role"] == "assistant" and conv[j - 1]["role"] not in ("user", "tool"):
            break
        if j and m["role"] == "tool" and conv[j - 1]["role"] not in ("assistant", "tool"):
            break
        messages.append({k: v for k, v in m.items() if k in keys})
    return messages


def specforge_text(row: dict[str, Any], template: dict[str, Any], tokenizer: TokenizerAdapter) -> str:
    """The string SpecForge renders a conversation row to (extra columns become template kwargs)."""
    kwargs = {k: v for k, v in row.items() if k not in SPECFORGE_ROW_KEYS_NOT_KWARGS}
    if template.get("parser_type") == "thinking" and template.get("enable_thinking"):
        kwargs["enable_thinking"] = True
    messages = specforge_messages(row["conversations"], template)
    return tokenizer.render_text(
        messages, add_generation_prompt=False, template_kwargs=with_tools(kwargs, row_tools(row))
    )


def specforge_mask(
    text: str, template: dict[str, Any], tokenizer: TokenizerAdapter, *, train_only_last_turn: bool = True
) -> Rendered:
    """SpecForge's encoding and regex loss mask over a rendered (or preformatted) string."""
    ids = tokenizer.encode(text)
    mask = [0] * len(ids)
    header, eot = template.get("assistant_header") or "", template.get("end_of_turn_token") or ""
    pattern = re.escape(header) + r"([\s\S]*?(?:" + re.escape(eot) + "|$))"
    matches = list(re.finditer(pattern, text, re.DOTALL))
    if train_only_last_turn and matches:
        matches = matches[-1:]
    for m in matches:
        start = min(len(tokenizer.encode(text[: m.start(1)])), len(ids))
        end = min(len(tokenizer.encode(text[: m.end(1)])), len(ids))
        mask[start:end] = [1] * max(0, end - start)
    for token in template.get("ignore_token") or []:
        at = text.find(token)
        while at != -1:
            start = min(len(tokenizer.encode(text[:at])), len(ids))
            end = min(len(tokenizer.encode(text[: at + len(token)])), len(ids))
            mask[start:end] = [0] * max(0, end - start)
            at = text.find(token, at + len(token))
    return Rendered(ids, mask)


def specforge_parse(row: dict[str, Any], template: dict[str, Any], tokenizer: TokenizerAdapter) -> Rendered | None:
    """What `build_eagle3_dataset` (train_only_last_turn: true) trains on for one conversation row."""
    try:
        text = specforge_text(row, template, tokenizer)
    except Exception:
        return None
    return specforge_mask(text, template, tokenizer)
