"""Audit a dataset another pipeline made: turn its rows back into captures and run every finding.

speculators rows carry ids: the prompt/output split is the first 1 in `loss_mask`. Conversation rows
(SpecForge, ShareGPT, messages; reasoning under `reasoning_content`, `reasoning` or `thinking`) carry
text: the prompt is rendered with the chat template, and the last assistant turn becomes
`<think>reasoning</think>content<stop>` (or `content<stop>`) as the profile and thinking setting
dictate. Content that itself opens with `<think>…</think>` and has no reasoning field is the Kimi-inline
shape: its think block is read as the reasoning, not as literal text. Text is encoded with special
tokens split off, so a literal "<think>" someone typed stays
literal ids and `literal_think_text` can see it; only the delimiters tokview itself adds are the
special ids.
"""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokview.batch.inputs import check_row, is_parquet, iter_rows, refuse_other_shapes
from tokview.batch.vocabulary_guard import tokenizer_name
from tokview.core import segments as seg
from tokview.core.analysis import analyze
from tokview.core.finding_rules import ERROR
from tokview.core.profiles import HARMONY, ModelProfile
from tokview.core.prompts import REASONING_KEYS, ROLE_FROM_SHAREGPT, PromptError, parse_row, prompt_id_for
from tokview.core.record import Capture, sample_id_for
from tokview.core.tokenizer import TokenizerAdapter, TokenizerError
from tokview.core.tool_calls import server_tool_calls
from tokview.errors import TokviewError, UserError, first_line
from tokview.export.rerender import with_tools
from tokview.store import SampleFilter, Store
from tokview.untrusted_text import has_lone_surrogate, printable_line, storable
from tokview.wording import first_of

INVALID_SHOWN = 5
"""Invalid rows the report names by line (all of them are in `--json`)."""


@dataclass
class AuditReport:
    run_id: str
    rows: int = 0
    imported: int = 0
    invalid: int = 0
    bad_rows: list[str] = field(default_factory=list)
    by_code: Counter[str] = field(default_factory=Counter)
    severity: dict[str, str] = field(default_factory=dict)
    review_reset: int = 0
    """Samples of an earlier audit of the dataset that were reviewed and whose ids changed: pending again."""
    masked_tails: int = 0
    """Rows whose ids go on, masked, after their last supervised id: left out of the samples (`masked_tail`)."""
    reasoning_dropped: list[int] = field(default_factory=list)
    """Lines of conversation rows whose last answer carries reasoning, audited with thinking off (`--no-thinking`):
    the thinking-off render has no place for it, so it is in none of the audited ids."""
    text_differs: list[int] = field(default_factory=list)
    """Lines of speculators rows whose `text` is not their `input_ids` decoded (`text_of_ids_differs`)."""
    invalid_rows: list[dict[str, Any]] = field(default_factory=list)
    """Each invalid sample's line, sample id and error codes: the report names the first `INVALID_SHOWN` (counts
    alone sent a user to find them; a row without an `id` is stored under a hash)."""
    read_with: str = ""
    """The tokenizer and profile the rows were read with: an audit without `--tokenizer` reads them with the Kimi
    layout, which holds every id of a Qwen3 dataset (said clean, but for warnings, before this was said)."""
    stale: int = 0
    """Samples an earlier audit of the dataset stored that this one did not (rows the file no longer has, or rows
    this tokview names otherwise: a turn tokview's own exports name): they stay beside the new ones."""

    def render(self) -> str:
        lines = [
            f"audit {printable_line(self.run_id)}: {self.rows} rows, {self.imported} imported as samples, "
            f"{self.invalid} invalid (error findings), {len(self.bad_rows)} unreadable"
        ]
        if self.read_with:
            lines.append(f"  read with {printable_line(self.read_with)}")
        if self.masked_tails:
            lines.append(
                f"  {self.masked_tails} rows mask ids after their last supervised id: left out (no answer holds them)"
            )
        if self.reasoning_dropped:
            lines.append(
                f"  {len(self.reasoning_dropped)} rows carry reasoning, audited with thinking off: no ids hold it "
                f"({_first_lines(self.reasoning_dropped)}); a thinking-off render drops it, so audit such a dataset "
                "with thinking on"
            )
        if self.text_differs:
            lines.append(
                f"  {len(self.text_differs)} rows hold a `text` that is not their input_ids decoded "
                f"({_first_lines(self.text_differs)}): a trainer that re-tokenizes `text` (SpecForge's is_preformatted) "
                "trains on other ids than audited"
            )
        if self.invalid_rows:
            shown = [f"line {r['line']} ({', '.join(r['codes'])})" for r in self.invalid_rows[:INVALID_SHOWN]]
            more = len(self.invalid_rows) - len(shown)
            lines.append(
                f"  invalid: {'; '.join(shown)}"
                + (f"; … and {more} more" if more else "")
                + " (`tokview show SAMPLE_ID` explains one; --json lists every one with its sample id)"
            )
        if self.review_reset:
            lines.append(f"  {self.review_reset} reviewed samples hold other ids now: pending again (review them anew)")
        if self.stale:
            lines.append(
                f"  note: {self.stale} samples of an earlier audit of this file were not audited again (rows it no "
                "longer has, or rows this tokview names otherwise): they stay in the run beside the new ones; "
                "--name NEW audits the file afresh"
            )
        for code, n in self.by_code.most_common():
            lines.append(f"  {n:>6}  {code} [{self.severity[code]}]")
        if self.by_code.get("unknown_token_id"):
            lines.append(
                "  note: ids the tokenizer does not have: is --tokenizer the dataset's model's? (the export's manifest "
                "names the tokenizer it used)"
            )
        elif self.imported and (
            len(self.text_differs) == self.imported
            or (self.by_code["no_stop_token"] == self.imported and not self.masked_tails)  # a mask may leave it out
        ):
            said = "holds a `text` that is not its ids decoded" if self.text_differs else "ends without a stop id"
            lines.append(
                f"  note: every row {said}: is --tokenizer the dataset's model's? (the export's manifest names the "
                "tokenizer it used)"
            )
        return "\n".join(lines)


def encode_literal(tokenizer: TokenizerAdapter, text: str) -> list[int]:
    """Ids for text as typed: "<think>" in the text becomes ordinary ids, never the special id."""
    return tokenizer.encode_literal(text)


def split_inline(content: str, profile: ModelProfile) -> tuple[str, str] | None:
    """(reasoning, answer) of content that opens with the think opener and closes it: reasoning inline,
    as TorchSpec's Kimi-K2.5 rows (and tokview's kimi-inline export) write it; or of content that closes reasoning
    it never opened, once (pitfall P1: a server without a reasoning parser, its template pre-filling the opener,
    answers `reasoning</think>answer`; DeepSeek-R1 distills are written so), which Qwen3's template itself splits
    so when it renders it. Read as text, its closer was an error (`think_close_repeated`, `literal_think_text`) on
    a row a trainer reads as reasoning and answer. A row that also has a reasoning field keeps any "<think>" in its
    content literal (someone typed it). Content that opens reasoning and never closes it is reasoning that never
    ended (cut at its max tokens, or the model stopped inside it): the kimi-inline export writes no closer there, and
    `from_conversation` adds none."""
    opener, closer = profile.think_open, profile.think_close
    if not profile.has_reasoning:
        return None
    if opener and content.startswith(opener) and closer not in content:
        return content[len(opener) :], ""
    if closer not in content:
        return None
    if content.startswith(opener):
        reasoning, _, answer = content[len(opener) :].partition(closer)
        return reasoning, answer
    if opener in content or content.count(closer) != 1:
        return None
    reasoning, _, answer = content.partition(closer)
    return reasoning, answer


MAX_TOKEN_ID = 2**31 - 1
"""The store keeps ids as 32-bit integers; no tokenizer has more ids than that."""


def _check_ids(ids: list[Any], mask: list[Any]) -> None:
    """A row's ids must be token ids and its mask 0/1 (or booleans: a Parquet `bool` column, as HF datasets often
    write a mask); the first bad value is named (the row is skipped)."""
    for pos, tid in enumerate(ids):
        if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid <= MAX_TOKEN_ID:
            raise PromptError(f"input_ids[{pos}] = {_as_json(tid)} is not a token id (an integer 0 … 2^31-1)")
    for pos, m in enumerate(mask):
        if not isinstance(m, (int, float)) or m not in (0, 1):  # True and False are ints equal to 1 and 0
            raise PromptError(f"loss_mask[{pos}] = {_as_json(m)} is not 0 or 1 (nor a boolean)")


def _as_json(value: Any) -> str:
    """A dataset's value as its JSON spells it (a string "1" quoted, not shown as the number 1), cut to 40."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):  # a Parquet value JSON has no spelling for
        text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _first_lines(numbers: list[int], shown: int = 5) -> str:
    """`line 3, 7, 9, …`: the first lines of a report's list."""
    return "line " + first_of([str(n) for n in numbers], shown)


def from_speculators(row: dict[str, Any]) -> tuple[str, int, list[tuple[int | None, Capture]]]:
    """(prompt id, generation index, [(turn, capture)]) of a pre-tokenized row: one capture, the prompt up to the
    loss mask's first 1, when it supervises one span of ids; one turn per span when it supervises several (an agent's
    trajectory: each answer's prompt is every id before it, the tool results and user turns between them masked).
    Read as one answer, a trajectory's masked turns were supervised on export, and its answers analysed as one. An
    answer is its span only: masked ids after the last one (`masked_tail`) were supervised on export when kept."""
    ids, mask = row["input_ids"], row["loss_mask"]
    if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
        raise PromptError("input_ids and loss_mask must be lists of the same length")
    _check_ids(ids, mask)
    spans = _supervised_spans(mask)
    metadata = row.get("metadata")
    meta: dict[str, Any] = metadata if isinstance(metadata, dict) else {}
    _check_metadata(meta)
    prompt_id = str(row.get("primary_id") or prompt_id_for(row))
    idx = meta.get("idx")
    index = idx if isinstance(idx, int) else 0
    ints = [int(i) for i in ids]
    raw = {k: v for k, v in row.items() if k not in ("input_ids", "loss_mask")}
    finish = _finish_reasons(row, meta)
    numbered = _turns_by_span(meta)
    if len(spans) <= 1:
        start, end = spans[0] if spans else (len(ids), len(ids))
        reason = finish.get((start, end), finish.get(None))
        turn = next((t for t in (meta.get("turn"), row.get("turn"), numbered.get((start, end))) if _is_turn(t)), None)
        return prompt_id, index, [(turn, _imported(ints[:start], ints[start:end], meta, raw, reason, last=True))]
    turns: list[tuple[int | None, Capture]] = []
    number = -1
    for k, (start, end) in enumerate(spans):
        last = k == len(spans) - 1
        reason = finish.get((start, end), finish.get(None) if last else None)
        # a span the metadata does not name (mask runs that touch merge into one): the turn after the one before
        number = numbered.get((start, end), number + 1)
        turns.append((number, _imported(ints[:start], ints[start:end], meta, raw, reason, last=last)))
    return prompt_id, index, turns


def _is_turn(value: object) -> bool:
    return type(value) is int and value >= 0


def _turns_by_span(meta: dict[str, Any]) -> dict[tuple[int, int], int]:
    """{(start, end): turn} of a trajectory row's answers (`metadata.turns`, each with its `turn` and `output_span`).
    A row split at a break starts at a later turn, and its spans numbered from 0 named other turns than the store's:
    the audited samples (and a row id looked up with `tokview show`) took `#turn0` for the conversation's turn 4."""
    turns = meta.get("turns")
    found: dict[tuple[int, int], int] = {}
    for turn in turns if isinstance(turns, list) else ():
        span = turn.get("output_span") if isinstance(turn, dict) else None
        if (
            isinstance(span, list)
            and len(span) == 2
            and all(type(i) is int for i in span)
            and _is_turn(turn.get("turn"))
        ):
            found[(span[0], span[1])] = turn["turn"]
    return found


def _finish_reasons(row: dict[str, Any], meta: dict[str, Any]) -> dict[tuple[int, int] | None, str]:
    """Where a row says why its answers ended: {None: the row's} (speculators' `metadata.finish_reason`, else the
    Parquet export's `finish_reason` column) and {(start, end): a turn's} (a trajectory row's `metadata.turns`, each
    with its `output_span`). Read from every place tokview's own exports write it: a truncated answer whose reason
    was only in the other place was audited as whole."""
    found: dict[tuple[int, int] | None, str] = {}
    for reason in (meta.get("finish_reason"), row.get("finish_reason")):
        if isinstance(reason, str):
            found[None] = reason
            break
    turns = meta.get("turns")
    for turn in turns if isinstance(turns, list) else ():
        span = turn.get("output_span") if isinstance(turn, dict) else None
        reason = turn.get("finish_reason") if isinstance(turn, dict) else None
        if isinstance(span, list) and len(span) == 2 and all(type(i) is int for i in span) and isinstance(reason, str):
            found[(span[0], span[1])] = reason
    return found


def _check_metadata(meta: dict[str, Any]) -> None:
    """A row's metadata as the analysis reads it: `usage` and `sampling_params` objects, `finish_reason` text, each
    when there. Another value is a bad row, named (it crashed the audit halfway, the rows after it never read)."""
    for key, kind, name in (("usage", dict, "an object"), ("sampling_params", dict, "an object")):
        value = meta.get(key)
        if value is not None and not isinstance(value, kind):
            raise PromptError(f"metadata.{key} = {_as_json(value)} is not {name}")
    reason = meta.get("finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise PromptError(f"metadata.finish_reason = {_as_json(reason)} is not text")


def masked_tail(row: dict[str, Any]) -> int:
    """How many ids a speculators row masks after its last supervised one (a template's newline after the stop, or
    padding): they are no answer's ids, so the audit leaves them out (kept, export would supervise them)."""
    mask = row.get("loss_mask")
    if not isinstance(mask, list) or 1 not in mask:
        return 0
    return len(mask) - 1 - max(pos for pos, m in enumerate(mask) if m == 1)


def _supervised_spans(mask: list[Any]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s in a loss mask."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for pos, m in enumerate([*mask, 0]):
        if m == 1 and start is None:
            start = pos
        elif m != 1 and start is not None:
            spans.append((start, pos))
            start = None
    return spans


def _imported(
    prompt: list[int],
    output: list[int],
    meta: dict[str, Any],
    raw: dict[str, Any],
    finish_reason: str | None,
    *,
    last: bool,
) -> Capture:
    """One imported answer; the row's usage is its last answer's."""
    return Capture(
        prompt_ids=prompt,
        output_ids=output,
        finish_reason=finish_reason,
        usage=(meta.get("usage") or {}) if last else {},
        settings=dict(meta.get("sampling_params") or {}),
        endpoint="imported",
        raw_response=raw,
    )


def _last_raw_answer(row: dict[str, Any]) -> dict[str, Any]:
    """The row's last assistant turn as the file wrote it (which reasoning key it used). Found by its role, not by
    the parsed message's index: a Hermes tool turn of two `<tool_response>` blocks parses as two messages, a row's
    `system` as one more, and the index read past the end (the whole audit died) or another turn."""
    raw_turns = row.get("messages") if isinstance(row.get("messages"), list) else row.get("conversations")
    for turn in reversed(raw_turns if isinstance(raw_turns, list) else []):
        if not isinstance(turn, dict):
            continue
        role = ROLE_FROM_SHAREGPT.get(str(turn.get("from", "")).lower()) if "from" in turn else turn.get("role")
        if role == "assistant":
            return turn
    return {}


def from_conversation(
    row: dict[str, Any], tokenizer: TokenizerAdapter, profile: ModelProfile, thinking: bool
) -> tuple[str, int | None, Capture]:
    parsed = parse_row(row)
    messages = parsed.messages
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        raise PromptError("no assistant turn to audit")
    raw_last = _last_raw_answer(row)
    field_name = next((k for k in REASONING_KEYS if k in raw_last), None)
    reasoning = messages[last].get("reasoning_content") or ""
    content = messages[last].get("content") or ""
    for name, value in (("content", content), ("reasoning", reasoning)):
        if not isinstance(value, str):
            raise PromptError(f"the last assistant turn's {name} is a {type(value).__name__}, not text")
    truncated = row.get("truncated") is True or row.get("finish_reason") == "length"
    unclosed = False
    if field_name is None:
        inline = split_inline(content, profile)
        if inline is not None:  # the Kimi-inline shape (tokview's own kimi-inline export): structure, not text
            unclosed = profile.think_close not in content  # its reasoning never ended: no closer is made up
            reasoning, content = inline
            field_name = "inline"
    # the history's reasoning goes to the template, which keeps or drops it as the server's did (Qwen3 keeps it
    # inside the running tool loop) and as the trainers' render does: taken out here, a tool loop's later turns
    # were audited on prompt ids no server served
    history = messages[:last]
    opener, closer = profile.think_open_id, profile.think_close_id
    think = thinking if opener is not None and closer is not None else None  # a plain model's rows: answers only
    kwargs = with_tools(profile.template_kwargs(think), parsed.tools)  # declared as a server's template does
    prompt = tokenizer.render(history, template_kwargs=kwargs)
    harmony = _harmony_answer(tokenizer, messages[last], reasoning, content, truncated)
    if profile.format == HARMONY and harmony is not None:
        output = harmony
    elif messages[last].get("tool_calls"):
        output = _rendered_answer(tokenizer, profile, history, messages[last], prompt, kwargs, truncated)
    else:
        output = []
        if think and opener is not None and closer is not None:
            if not seg.prompt_opens_reasoning(prompt, profile):
                output.append(opener)
            output += encode_literal(tokenizer, reasoning)
            if not unclosed and not (truncated and not content):  # cut inside its reasoning: no closer was written
                output.append(closer)  # (as Harmony's)
        output += encode_literal(tokenizer, content)
        if not truncated:
            output.append(_stop_id(profile))
    turn = row.get("assistant_turn_index")
    prompt_id = str(row.get("source_id") or parsed.prompt_id)
    capture = Capture(
        prompt_ids=prompt,
        output_ids=output,
        finish_reason="length" if truncated else "stop",
        reasoning=reasoning if field_name else None,
        content=content,
        reasoning_field=None if field_name == "inline" else field_name,
        settings={
            "thinking": think,
            "chat_template_kwargs": kwargs,
            **({"tools": parsed.tools} if parsed.tools else {}),
        },
        messages=history,
        endpoint="imported",
        raw_response=row,
        tool_calls=server_tool_calls(messages[last].get("tool_calls")),  # the dataset's calls, held against the ids
    )
    return prompt_id, turn if isinstance(turn, int) else None, capture


def _harmony_answer(
    tokenizer: TokenizerAdapter, answer: dict[str, Any], reasoning: str, content: str, truncated: bool
) -> list[int] | None:
    """A gpt-oss answer's ids as the model writes them after its prompt's `<|start|>assistant`: the analysis message,
    then the final one ending `<|return|>`, or a call `<|channel|>commentary to=functions.NAME <|constrain|>json
    <|message|>ARGS<|call|>`. Built as think tags were, a row's answer lost every channel header (three false errors
    on a clean row); the template writes a history message, not what was generated (`<|end|>`, the recipient first).
    None for a turn of several calls (the template's reading is kept)."""
    calls = answer.get("tool_calls") or []
    if len(calls) > 1:
        return None
    out: list[int] = []
    if reasoning:
        out += tokenizer.encode("<|channel|>analysis<|message|>") + encode_literal(tokenizer, reasoning)
        if truncated and not calls and not content:  # cut inside its analysis: no final channel was written
            return out
        out += tokenizer.encode("<|end|><|start|>assistant")
    if calls:
        function = calls[0].get("function") if isinstance(calls[0], dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, (str, dict)):
            return None
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        out += tokenizer.encode("<|channel|>") + encode_literal(tokenizer, f"commentary to=functions.{name} ")
        out += tokenizer.encode("<|constrain|>") + encode_literal(tokenizer, "json")
        out += tokenizer.encode("<|message|>") + encode_literal(tokenizer, text)
        return out if truncated else out + tokenizer.encode("<|call|>")
    out += tokenizer.encode("<|channel|>final<|message|>") + encode_literal(tokenizer, content)
    return out if truncated else out + tokenizer.encode("<|return|>")


def _rendered_answer(
    tokenizer: TokenizerAdapter,
    profile: ModelProfile,
    history: list[dict[str, Any]],
    answer: dict[str, Any],
    prompt: list[int],
    kwargs: dict[str, Any] | None,
    truncated: bool,
) -> list[int]:
    """The ids of a last assistant turn that calls tools: how the template writes it after its prompt, up to its
    stop id (without it when truncated). Only the template knows the model's call syntax; its reasoning, content and
    calls read as text alone lost the calls and made the answer look empty."""
    whole = tokenizer.render([*history, answer], add_generation_prompt=False, template_kwargs=kwargs)
    if whole[: len(prompt)] != prompt:
        raise PromptError(
            "the last assistant turn calls tools, and the template renders it otherwise than after its prompt: its "
            "ids cannot be read off the template"
        )
    output = whole[len(prompt) :]
    stops = [k for k, t in enumerate(output) if t in profile.stop_ids]
    if stops:
        return output[: stops[-1] + (0 if truncated else 1)]
    after = None if truncated else _stop_before_result(tokenizer, profile, [*history, answer], whole, kwargs)
    return output if after is None else [*output, after]


def _stop_before_result(
    tokenizer: TokenizerAdapter,
    profile: ModelProfile,
    conversation: list[dict[str, Any]],
    whole: list[int],
    kwargs: dict[str, Any] | None,
) -> int | None:
    """The stop id a template writes between a call and its result, when it writes none after the call itself: GLM
    ends a call turn with the `<|observation|>` that opens the result, which the model generates to stop. Read off the
    template with a result after the call; without it the row's answer had no stop (a false `no_stop_token`)."""
    calls = conversation[-1].get("tool_calls") or []
    first = calls[0] if calls and isinstance(calls[0], dict) else {}
    result = {"role": "tool", "tool_call_id": first.get("id") or "call", "content": "ok"}
    try:
        longer = tokenizer.render([*conversation, result], add_generation_prompt=False, template_kwargs=kwargs)
    except TokenizerError:  # a template that refuses a result here (`raise_exception`): no stop to read
        return None
    if longer[: len(whole)] != whole or len(longer) == len(whole):
        return None
    return longer[len(whole)] if longer[len(whole)] in profile.stop_ids else None


def _stop_id(profile: ModelProfile) -> int:
    """The id an answer ends with: a profile without one (`stop_ids = []` in a profile file) cannot say."""
    if not profile.stop_ids:
        raise UserError(f"profile {profile.name} names no stop ids: an answer's end cannot be written")
    return profile.stop_ids[0]


def audit(
    store: Store,
    path: str | Path,
    *,
    tokenizer: TokenizerAdapter,
    profile: ModelProfile,
    name: str | None = None,
    thinking: bool = True,
) -> AuditReport:
    path = Path(path)
    if path.is_dir():
        raise UserError(f"dataset is a directory: {path}")
    if not readable_dataset(path):
        raise UserError(f"dataset not found: {path}")
    if name is None and not path.is_file():  # `<(zcat …)` is /dev/fd/63 every time: no name to tell audits apart
        raise UserError(f"{path} is a pipe or a device: name its audit with --name (the run is named after a file)")
    if not is_parquet(path):
        refuse_other_shapes(path)
    name = name or path.stem
    if has_lone_surrogate(name):  # a file named in another encoding: its run id could not be stored
        raise UserError(f"{printable_line(str(path))}: its file name is not UTF-8: name its audit with --name")
    report = AuditReport(run_id=f"audit-{name}", read_with=f"{tokenizer_name(None, tokenizer)}, profile {profile.name}")
    settings = {"source": "audit", "dataset": name, "thinking": thinking}
    earlier = store.run(report.run_id)
    reviewed = _earlier_audit(store, earlier, path, tokenizer) if earlier is not None else {}
    store.put_run(
        report.run_id,
        settings=settings,
        profile=profile.name,
        tokenizer_dir=str(tokenizer.source) if tokenizer.source else None,
        tokenizer_hash=tokenizer.fingerprint(),
        template_hash=tokenizer.template_hash(),
        source=_source(path),
    )  # read back from any folder
    seen: Counter[str] = Counter()
    _audit_rows(  # a line that is not UTF-8 is its own bad row (`core.prompts.iter_jsonl`)
        store,
        path,
        report=report,
        settings=settings,
        seen=seen,
        tokenizer=tokenizer,
        profile=profile,
        thinking=thinking,
        reviewed=reviewed,
    )
    if earlier is None and not report.imported:
        store.forget_empty_run(report.run_id)
    elif earlier is not None:
        report.stale = max(0, store.count_samples(SampleFilter(run_id=report.run_id)) - report.imported)
    return report


def _earlier_audit(
    store: Store, run: dict[str, Any], path: Path, tokenizer: TokenizerAdapter
) -> dict[str, tuple[list[int], list[int]]]:
    """The reviewed samples (id → prompt and output ids) of the earlier audit `run` (its `runs` row), to be audited
    again; UserError when it is an audit of another file or with another tokenizer (its sample ids are the rows' ids:
    the new rows would replace the stored ones, their reviews kept on ids nobody reviewed)."""
    run_id = run["run_id"]
    if run.get("source") and (not path.is_file() or storable(os.path.realpath(run["source"])) != _source(path)):
        raise UserError(
            f"run {run_id} already holds an audit of {run['source']}: name this one with --name (its rows would "
            "replace that file's samples)"
        )
    if run.get("tokenizer_hash") and run["tokenizer_hash"] != tokenizer.fingerprint():
        raise UserError(
            f"run {run_id} was audited with another tokenizer ({run.get('tokenizer_dir') or run['tokenizer_hash']}): "
            "name this audit with --name"
        )
    return store.reviewed_ids(run_id)


def _source(path: Path) -> str:
    """What a run records of its dataset: a file's real path (the same file however it is named), a pipe's name; a
    byte a name holds that is not UTF-8 as its escape (`storable`: the store holds text)."""
    return storable(os.path.realpath(path) if path.is_file() else str(path))


def readable_dataset(path: Path) -> bool:
    """A file, or a pipe or device read as one (`tokview audit <(zcat rows.jsonl.gz)`, /dev/stdin)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def _audit_rows(
    store: Store,
    path: Path,
    *,
    report: AuditReport,
    settings: dict[str, Any],
    seen: Counter[str],
    tokenizer: TokenizerAdapter,
    profile: ModelProfile,
    thinking: bool,
    reviewed: dict[str, tuple[list[int], list[int]]],
) -> None:
    from tokview.batch.prompt_size import max_prompt_bytes

    limit = max_prompt_bytes()  # a bad TOKVIEW_MAX_PROMPT_MB refuses the run once, not each row
    for n, row in iter_rows(path):
        report.rows += 1
        try:
            if isinstance(row, PromptError):
                raise row
            if not isinstance(row, dict):
                raise PromptError("expected a JSON object")
            if "input_ids" in row and "loss_mask" in row:
                prompt_id, index, turns = from_speculators(row)
                report.masked_tails += masked_tail(row) > 0
                if text_of_ids_differs(row, tokenizer):
                    report.text_differs.append(n)
            elif ("input_ids" in row) != ("loss_mask" in row) and not {"messages", "conversations", "prompt"} & set(
                row
            ):
                # a speculators row cut short, not a conversation: said so, not "no `messages` … field"
                have, lack = ("input_ids", "loss_mask") if "input_ids" in row else ("loss_mask", "input_ids")
                raise PromptError(f"`{have}` without `{lack}`: a speculators row needs both")
            else:  # what batch refuses in a prompts file (an object as content renders as nothing) is a bad row here
                check_row(row, f"line {n}")
                _check_size(row, limit)
                prompt_id, turn, capture = from_conversation(row, tokenizer, profile, thinking)
                index, turns = 0, [(turn, capture)]
                if capture.thinking is False and (capture.reasoning or "").strip():
                    report.reasoning_dropped.append(n)
                    capture.reasoning = None  # in no id: compared with the ids, it blamed a server's parser
        except (TokviewError, ValueError, KeyError, TypeError) as exc:
            text = str(exc)
            report.bad_rows.append(text if text.startswith("line ") else f"line {n}: {text}")
            continue
        for turn, capture in turns:
            if not _store_one(
                store, n, prompt_id, index, turn, capture, report, settings, seen, profile, tokenizer, reviewed
            ):
                break  # the row's other turns go with it: a bad row is one line


def text_of_ids_differs(row: dict[str, Any], tokenizer: TokenizerAdapter) -> bool:
    """A speculators row's `text` (when it has one) is not its `input_ids` decoded with the special ids kept, as
    every such row's text is written: the audit reads the ids, and a trainer reading the text (SpecForge's
    `is_preformatted` re-tokenizes it) would train on something the audit never saw."""
    text = row.get("text")
    if not isinstance(text, str):
        return False
    try:
        ids = [int(i) for i in row["input_ids"]]
        if tokenizer.decode(ids, skip_special_tokens=False) == text:
            return False
        # a decode may differ in spacing alone (a SentencePiece tokenizer's): what a trainer gets is the re-encode
        return tokenizer.encode(text) != ids and tokenizer.encode_prompt(text) != ids
    except (ValueError, TypeError, OverflowError):  # ids the tokenizer cannot decode: their findings say so
        return False


def _check_size(row: dict[str, Any], limit: int) -> None:
    """A conversation whose text is past `TOKVIEW_MAX_PROMPT_MB` (8 MiB) is a bad row, as `batch` fails such a prompt
    (`prompt_too_large`, counted alike: the UTF-8 bytes of every string of its turns): a 60 MB line took 12.8 GB of
    memory and two minutes to render, tokenize and analyse."""
    from tokview.batch.limits import text_bytes

    size = text_bytes([row.get(k) for k in ("messages", "conversations", "prompt", "system")])
    if size > limit:
        raise PromptError(
            f"its text holds {size / (1 << 20):.1f} MiB, past the {limit / (1 << 20):g} MiB a prompt may hold "
            "(TOKVIEW_MAX_PROMPT_MB)"
        )


def _store_one(
    store: Store,
    n: int,
    prompt_id: str,
    index: int,
    turn: int | None,
    capture: Capture,
    report: AuditReport,
    settings: dict[str, Any],
    seen: Counter[str],
    profile: ModelProfile,
    tokenizer: TokenizerAdapter,
    reviewed: dict[str, tuple[list[int], list[int]]],
) -> bool:
    """Analyse and store one imported answer of line `n`; False (a bad row noted) when the store cannot hold it."""
    base = sample_id_for(prompt_id, settings, index, turn)
    sample_id = f"{base}.{seen[base]}" if seen[base] else base  # a repeated row: keep both, apart
    seen[base] += 1
    try:
        analysis = analyze(capture, profile, tokenizer)
        store.put_sample(
            sample_id, prompt_id, report.run_id, capture, analysis, gen_index=index, turn=turn, profile=profile.name
        )
    except (
        OverflowError,
        ValueError,
        TypeError,
        TokviewError,
    ) as exc:  # a value the store cannot hold: this row only
        report.bad_rows.append(f"line {n}: cannot store this row ({first_line(exc, 200)})")
        return False
    before = reviewed.get(sample_id)
    if before is not None and before != (list(capture.prompt_ids), list(capture.output_ids)):
        store.record_verdict(  # its review was of other ids: to be reviewed again
            sample_id, "pending", reason="its ids changed when the dataset was audited again", who="tokview audit"
        )
        report.review_reset += 1
    report.imported += 1
    report.invalid += 0 if analysis.valid else 1
    if not analysis.valid:
        errors = sorted({f.code for f in analysis.findings if f.severity == ERROR})
        report.invalid_rows.append({"line": n, "sample_id": sample_id, "codes": errors})
    for f in analysis.findings:
        report.by_code[f.code] += 1
        report.severity[f.code] = f.severity
    return True
