"""Findings: what is wrong (or worth knowing) about one capture, with stable codes.

Every code is declared once, here, by the `@rule` on its check: the code, its default severity,
why it matters (the help the UI shows) and the check itself. The UI's help and badges, the
exports' invalid-reason counts and the severity overrides all read `RULES`, so adding a finding is
one decorated function (plus its tests).

Each check reads the ids first and the text fields second, and returns a `Hit` that names the id
positions it is about, so a person can jump straight to them. Positions are absolute indices into
prompt_ids + output_ids. A sample is valid when it has no error finding.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from itertools import compress, count
from operator import or_
from typing import TYPE_CHECKING

from tokview.core import segments as seg
from tokview.core import tool_calls as tc
from tokview.core.alignment import HIDDEN
from tokview.core.finding_context import Context, OutputPieces, Vocabulary, first_difference, vocabulary_of
from tokview.core.finding_rules import (  # the registry, re-exported for the modules that read findings here
    CHAT_ENDPOINTS,
    ERROR,
    INFO,
    RULES,
    WARN,
    Check,
    Finding,
    Hit,
    Rule,
    default_severity,
    rule,
    run_checks,
    why,
)
from tokview.core.json_value import JsonObject, as_pydantic_bool
from tokview.core.profiles import HARMONY, HERMES, KIMI_K2, QWEN3_CODER
from tokview.core.prompt_scan import first_spelling_cut
from tokview.core.record import Capture
from tokview.core.template_dates import served_date
from tokview.core.xml_tool_calls import arguments_agree

if TYPE_CHECKING:
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter

UNKNOWN_IDS_SHOWN = 12
"""How many unknown ids a detail spells out (a whole output of them would be a page)."""

__all__ = [
    "CHAT_ENDPOINTS",
    "ERROR",
    "FINDING_CODES",
    "INFO",
    "RULES",
    "WARN",
    "Check",
    "Finding",
    "Hit",
    "Rule",
    "default_severity",
    "id_text",
    "rule",
    "run_checks",
    "why",
]


# -- the checks, in the order they run -------------------------------------------------------------


@rule("empty_output", ERROR, "The server returned no output ids: nothing to train on, and usually a failed request.")
def empty_output(ctx: Context) -> Hit | None:
    if ctx.output:
        return None
    return Hit.missing(
        f"The server returned no output ids (finish_reason={ctx.capture.finish_reason}): nothing to train on."
    )


@rule(
    "unknown_token_id",
    ERROR,
    "An id the tokenizer does not have: it stands for nothing, and a trainer's embedding lookup fails or reads junk.",
)
def unknown_token_id(ctx: Context) -> Hit | None:
    positions = ctx.unknown_ids
    if ctx.tokenizer is None:
        return None
    vocabulary = vocabulary_of(ctx.tokenizer)
    alternatives = unknown_alternatives(vocabulary, ctx.capture.output_top_ids)
    if not positions and not alternatives:
        return None
    prompt, n, size = ctx.capture.prompt_ids, ctx.n_prompt, vocabulary.size
    parts = []
    if positions:
        shown = ", ".join(
            f"{prompt[p]} at prompt[{p}]" if p < n else f"{ctx.output[p - n]} at {ctx.where(p - n)}"
            for p in positions[:UNKNOWN_IDS_SHOWN]
        )
        more = f" and {len(positions) - UNKNOWN_IDS_SHOWN} more" if len(positions) > UNKNOWN_IDS_SHOWN else ""
        parts.append(f"{len(positions)} id(s) the tokenizer does not have: {shown}{more}")
    if alternatives:  # the top-K a distillation trainer indexes its logits by
        shown = ", ".join(ctx.where(k) for k in alternatives[:UNKNOWN_IDS_SHOWN])
        more = f" and {len(alternatives) - UNKNOWN_IDS_SHOWN} more" if len(alternatives) > UNKNOWN_IDS_SHOWN else ""
        parts.append(f"top-K alternatives holding an id the tokenizer does not have at {shown}{more}")
    return Hit.at(
        f"{'; '.join(parts)} (its ids are 0 … {size - 1}, {size:,} in all). The server's vocabulary is not this "
        "tokenizer's, or the ids were changed on the way.",
        sorted({*positions, *(n + k for k in alternatives)}),
    )


def unknown_alternatives(vocabulary: Vocabulary, top_ids: Sequence[Sequence[int] | None] | None) -> list[int]:
    """Output positions whose top-K alternative ids hold one `vocabulary` lacks (one C pass settles the usual none).
    An id in the model's padding rows (`Vocabulary.logits_size`) is a logit like any other: not lacking."""
    if not top_ids:
        return []
    flat = [t for row in top_ids if row for t in row]
    size = max(vocabulary.size, vocabulary.logits_size)
    if not flat or (min(flat) >= 0 and max(flat) < size):
        return []
    return [
        k
        for k, row in enumerate(top_ids)
        if row and any(not 0 <= row[p] < size for p in vocabulary.unknown_positions(row))
    ]


@rule(
    "dual_divergence",
    ERROR,
    "The raw and parsed requests generated different ids: the text fields do not describe the training ids.",
)
def dual_divergence(ctx: Context) -> Hit | None:
    c = ctx.capture
    if not ctx.paths_diverge:
        return None
    parsed = c.parsed_output_ids or []
    first = first_difference(parsed, c.output_ids)
    assert first is not None  # the paths diverge
    detail = (
        f"The parsed chat path generated other ids than the raw path ({len(parsed)} vs {len(c.output_ids)} ids, "
        f"first difference at output[{first}]): its text fields describe another generation, so the "
        f"reasoning/content comparisons use the parsed path's own ids. Use temperature 0 or a seed."
    )
    if first < len(c.output_ids):
        return Hit.at(detail, [ctx.n_prompt + first])
    return Hit.missing(detail)  # the raw path stopped where the parsed one goes on: its ids are missing


@rule(
    "think_open_in_prompt",
    INFO,
    "The template pre-filled the opener; the output starts inside reasoning. Expected for Kimi-K2.5.",
)
def think_open_in_prompt(ctx: Context) -> Hit | None:
    pos = ctx.prefilled_opener
    if pos is None:
        return None
    return Hit.at(
        f"The chat template pre-filled {ctx.profile.think_open} (id {ctx.profile.think_open_id}) at prompt "
        f"position {pos}: the output starts inside reasoning, and the model never generates this id. "
        f"Its absence from output_ids is expected, not a server bug.",
        [pos],
    )


@rule(
    "think_open_missing",
    ERROR,
    "Reasoning was asked for but no opener exists in prompt or output: segments cannot be told apart.",
)
def think_open_missing(ctx: Context) -> Hit | None:
    p = ctx.profile
    closers = ctx.out_closers
    if closers:
        if ctx.prefilled_opener is not None or (ctx.out_openers and ctx.out_openers[0] < closers[0]):
            return None
        return Hit.at(
            f"{p.think_close} (id {p.think_close_id}) at {ctx.where(closers[0])} closes reasoning that was never "
            f"opened: the prompt does not end with {p.think_open} (id {p.think_open_id}) and the output does not "
            f"emit it. The prompt was likely rendered without the thinking template.",
            [ctx.n_prompt + closers[0]],
        )
    if ctx.capture.thinking is True and p.prefills_opener and ctx.output and not ctx.reasoning_opened:
        why = (
            f"the template kwargs ({p.thinking_kwarg}) did not reach the template."
            if p.thinking_kwarg
            else f"the chat template did not pre-fill it, as {p.name}'s does (another template rendered the prompt)."
        )
        return Hit.missing(
            f"Thinking was on, but the prompt does not end with {p.think_open} (id {p.think_open_id}) and the "
            f"output never opens reasoning: {why}"
        )
    return None


@rule("think_close_missing", ERROR, "Reasoning never closed: the answer is missing or glued into the reasoning.")
def think_close_missing(ctx: Context) -> Hit | None:
    if not ctx.output or not ctx.open_at_end:
        return None
    if not ctx.out_closers and _section_in_reasoning(ctx) is not None:
        return None  # the tool calls ended the reasoning (both servers read it so): tool_section_in_reasoning
    cause = " (the generation hit the length limit)" if ctx.cut_by_length else ""
    if ctx.out_closers:
        reopened = ctx.out_openers[-1]  # open at the end after a closer: an output opener came last
        return Hit.at(
            f"Reasoning was reopened with {ctx.profile.think_open} at {ctx.where(reopened)} after "
            f"it had closed, and never closed again{cause}.",
            [ctx.n_prompt + reopened],
        )
    return Hit.missing(
        f"Reasoning was opened but {ctx.profile.think_close} (id {ctx.profile.think_close_id}) never appears in "
        f"{len(ctx.output)} output ids{cause}: the whole output is reasoning, and parsers will mislabel it."
    )


@rule("think_close_repeated", ERROR, "More than one closer: the model looped or the ids were concatenated wrongly.")
def think_close_repeated(ctx: Context) -> Hit | None:
    closers = ctx.out_closers
    if len(closers) < 2:
        return None
    where = ", ".join(f"output[{i}]" for i in closers)
    return Hit.at(
        f"{ctx.profile.think_close} (id {ctx.profile.think_close_id}) appears {len(closers)} times, at {where}; "
        f"a sample has exactly one.",
        [ctx.n_prompt + i for i in closers],
    )


@rule(
    "think_open_in_output_after_prefill",
    WARN,
    "The model emitted an opener although the template had already opened reasoning.",
)
def think_open_in_output_after_prefill(ctx: Context) -> Hit | None:
    opens = ctx.out_openers
    if ctx.prefilled_opener is None or not opens:
        return None
    return Hit.at(
        f"The template already pre-filled {ctx.profile.think_open}, yet the output emits it again (id "
        f"{ctx.profile.think_open_id}) at {ctx.where(opens[0])}: the reasoning is opened twice.",
        [ctx.n_prompt + i for i in opens],
    )


@rule(
    "reasoning_with_thinking_off",
    ERROR,
    "Thinking was off, yet the output reasons: the template kwarg never reached the template.",
)
def reasoning_with_thinking_off(ctx: Context) -> Hit | None:
    """A reasoning model run with thinking off is a plain chat model: its output must hold no reasoning."""
    if ctx.capture.thinking is not False or not ctx.profile.has_reasoning:
        return None
    runs = ctx.output_runs(seg.OPENER, seg.REASONING, seg.CLOSER)
    if not runs:
        return None
    delims = [p for s in runs if s.kind != seg.REASONING for p in range(s.start, s.end)]
    if delims:
        what = f"{ctx.name(ctx.output[delims[0] - ctx.n_prompt])} at {ctx.where(delims[0] - ctx.n_prompt)}"
    else:
        what = f"{sum(len(s) for s in runs)} reasoning ids from {ctx.where(runs[0].start - ctx.n_prompt)}"
    why = (
        "The template kwarg did not reach the template, or the model ignores it."
        if ctx.profile.thinking_kwarg
        else f"Profile {ctx.profile.name} names no template kwarg to turn thinking off: the model reasons all the same."
    )
    return Hit.at(
        f"Thinking was off ({ctx.profile.thinking_kwarg or 'no template kwarg'}), yet the output holds "
        f"reasoning: {what}. {why}",
        delims or [runs[0].start],
    )


@rule("empty_reasoning", WARN, "Reasoning was on but the model reasoned for zero tokens.")
def empty_reasoning(ctx: Context) -> Hit | None:
    if not ctx.reasoning_opened or not ctx.out_closers:
        return None
    first = ctx.out_closers[0]
    ids = ctx.ids_of(ctx.output, ctx.output_runs(seg.REASONING), before=first)
    if not ctx.blank(ids):
        return None
    return Hit.at(
        f"The reasoning before {ctx.profile.think_close} at {ctx.where(first)} is empty "
        f"({len(ids)} whitespace ids): the model skipped thinking.",
        [ctx.n_prompt + first],
    )


@rule("empty_answer", ERROR, "No answer after the closer: a drafter would learn to stop right after reasoning.")
def empty_answer(ctx: Context) -> Hit | None:
    if ctx.profile.format == HARMONY:
        return None  # a Harmony answer is its final channel: harmony_no_final
    if not ctx.output or ctx.open_at_end:
        return None  # no answer was due yet: think_close_missing says why
    ids = ctx.ids_of(ctx.output, ctx.output_runs(seg.ANSWER))
    if not ctx.blank(ids) or (ctx.calls is not None and ctx.calls.calls):
        return None  # an answer, or tool calls: a turn that calls tools has answered
    after = " after the reasoning" if ctx.reasoning_opened else ""
    # markers of a section that holds no call: no template renders one, and the turn neither answers nor calls
    section = "; its tool-call section holds no call" if ctx.calls is not None else ""
    stops = [p for s in ctx.output_runs(seg.STOP) for p in range(s.start, s.end)]
    # Where the answer should have been: the stop that ended the turn, else the output's last id.
    return Hit.at(
        f"No answer{after} ({len(ids)} answer ids, all blank){section}.", stops or [ctx.n_prompt + len(ctx.output) - 1]
    )


@rule("truncated", ERROR, "Cut by max tokens (finish_reason length): the sample never ends as a real turn does.")
def truncated(ctx: Context) -> Hit | None:
    if not ctx.cut_by_length:
        return None
    limit = ctx.capture.settings.get("max_new_tokens")
    detail = (
        f"finish_reason=length after {len(ctx.output)} output ids"
        + (f" (max_new_tokens={limit})" if limit else "")
        + ": a cut-off generation must not be trained on."
    )
    if not ctx.output:
        return Hit.missing(detail)  # nothing was generated before the cut
    return Hit.at(detail, [ctx.n_prompt + len(ctx.output) - 1])


COMPLETE_FINISH_REASONS = frozenset({"stop", "tool_calls", "function_call", "eos"})
"""Finish reasons of a turn the model ended itself (an end id, a stop string, its tool calls). `length` is
`truncated`'s; anything else (`abort`, `error`, `content_filter`, …) is `generation_aborted`'s."""


@rule(
    "generation_aborted",
    ERROR,
    "The server ended the generation early (finish_reason abort, error, …): the output is not a whole turn.",
)
def generation_aborted(ctx: Context) -> Hit | None:
    """vLLM answers an engine abort with HTTP 200 and `finish_reason: "abort"` (then `[DONE]`), SGLang's OpenAI
    endpoints likewise: nothing else marks the sample as cut, and it was trained on as a real turn.

    No finish reason at all, and no stop id at the end: the answer's end was lost (a stream whose last events a
    gateway dropped, then `[DONE]`), and only `no_stop_token`'s warning said so. An import names no reason; a
    profile without stop ids cannot tell."""
    reason = ctx.capture.finish_reason
    if reason is None:
        if not end_lost(ctx.capture, ctx.profile.stop_ids):
            return None
        detail = (
            f"no finish_reason after {len(ctx.output)} output ids, and no stop id at their end: the answer's end was "
            "lost (a stream cut before its last events), or the server stopped early; a cut-off generation must not "
            "be trained on."
        )
    elif not isinstance(reason, str) or reason in COMPLETE_FINISH_REASONS or reason == "length":
        return None
    else:
        detail = (
            f"finish_reason={reason} after {len(ctx.output)} output ids: the server stopped the generation before "
            "the model ended its turn; a cut-off generation must not be trained on."
        )
    if not ctx.output:
        return Hit.missing(detail)
    return Hit.at(detail, [ctx.n_prompt + len(ctx.output) - 1])


def end_lost(capture: Capture, stop_ids: Sequence[int]) -> bool:
    """No finish reason and no stop id at the end of the output: the answer's end was lost (`generation_aborted`;
    a chain stops there too). An import names no reason; without stop ids nothing can tell."""
    if capture.finish_reason is not None or capture.endpoint == "imported" or not stop_ids:
        return False
    return not capture.output_ids or capture.output_ids[-1] not in stop_ids


def request_stop(ctx: Context) -> str | int | None:
    """The stop the request's own `stop` strings or `stop_token_ids` made (vLLM's `stop_reason`, SGLang's
    `matched_stop`): a string (only a stop string is matched as one), or an id the request listed in its
    `stop_token_ids` that is none of the model's stop ids; None when the model ended its turn. An id alone says
    nothing: both servers name the generation config's end ids there too, which a profile read from a folder
    without that config may not list."""
    c = ctx.capture
    matched = c.matched_stop
    if c.finish_reason != "stop" or matched is None or isinstance(matched, bool):
        return None
    if isinstance(matched, str):
        return matched
    asked = c.settings.get("stop_token_ids") if isinstance(c.settings, dict) else None
    if (
        isinstance(matched, int)
        and isinstance(asked, list)
        and matched in asked
        and matched not in ctx.profile.stop_ids
    ):
        return matched
    return None


@rule(
    "stopped_by_request",
    ERROR,
    "The request's own stop string or stop id ended the generation: the output is cut, not a whole turn.",
)
def stopped_by_request(ctx: Context) -> Hit | None:
    """`finish_reason: "stop"` says only that a stop was met: a client's `stop` strings (an agent harness's
    observation marker, a few-shot separator) or `stop_token_ids` cut the model mid-answer, and the server still
    says "stop". The ids then run through the stop (the text is cut before it), and such a row trained as a whole
    turn teaches the drafter an end of turn that the model never wrote."""
    matched = request_stop(ctx)
    if matched is None:
        return None
    what = f"stop string {matched!r}" if isinstance(matched, str) else f"stop id {ctx.name(matched)}"
    detail = (
        f"The request's {what} ended the generation after {len(ctx.output)} output ids (finish_reason=stop): the "
        "model did not end its turn there; a cut-off generation must not be trained on."
    )
    if not ctx.output:
        return Hit.missing(detail)
    return Hit.at(detail, [ctx.n_prompt + len(ctx.output) - 1])


@rule("no_stop_token", WARN, "The output does not end with the profile's stop id; the trainer sees no end of turn.")
def no_stop_token(ctx: Context) -> Hit | None:
    reason = ctx.capture.finish_reason
    if reason == "length" or (isinstance(reason, str) and reason not in COMPLETE_FINISH_REASONS):
        return None  # `truncated` or `generation_aborted` says why
    if reason is None and ctx.capture.endpoint != "imported":
        return None  # `generation_aborted` says why
    if request_stop(ctx) is not None:
        return None  # `stopped_by_request` says why
    if not ctx.output or not ctx.profile.stop_ids:
        return None  # no stop was due, nothing was generated, or the profile names no stop ids
    if ctx.output[-1] in ctx.profile.stop_ids:
        return None
    stops = ", ".join(str(i) for i in ctx.profile.stop_ids)
    return Hit.at(
        f"The output ends with {ctx.name(ctx.output[-1])}, not a stop id ({stops}): the drafter never learns to "
        f"end the turn.",
        [ctx.n_prompt + len(ctx.output) - 1],
    )


@rule(
    "output_past_stop",
    ERROR,
    "The output goes on after a stop id: a server ends the turn there, so the ids after it are not this answer's.",
)
def output_past_stop(ctx: Context) -> Hit | None:
    """A server stops at the first stop id the model generates: ids after one were not generated as this answer.
    What makes them: a dataset's loss mask that supervises the prompt or the next turn as well (`tokview audit` of
    another pipeline's rows: the whole row masked 1 read as one answer holding the user turn and its `<|im_end|>`),
    a second stop supervised after the first, a request with `ignore_eos`, or a profile whose stop ids the server
    did not stop at. Trained on, the drafter learns to go on past the end of a turn. Whitespace alone after the
    stop is the template's glue (SpecForge's ChatML end of turn is `<|im_end|>\n`, supervised whole): only
    `no_stop_token` speaks of it."""
    out, stops = ctx.output, ctx.profile.stop_ids
    held = ctx.held_output_ids
    if len(out) < 2 or not stops or (held is not None and held.isdisjoint(stops)):
        return None
    firsts = []
    for stop in stops:  # list.index: a C-level scan per stop id, not a Python step per output id
        try:
            firsts.append(out.index(stop, 0, len(out) - 1))
        except ValueError:
            pass
    if not firsts:
        return None
    at = min(firsts)
    after = out[at + 1 :]
    if ctx.tokenizer is not None and set(after).isdisjoint(stops) and not ctx.tokenizer.decode(after).strip():
        return None  # the template's newline after its end of turn (SpecForge's ChatML `<|im_end|>\n`): no answer
    echoed = output_prefix_overlap(ctx)
    if echoed is not None and at < len(echoed.positions):
        return None  # the prompt's tail echoed (SGLang #17240), its stop included: that finding says what happened
    asked = " (the request asked for ignore_eos)" if ctx.capture.settings.get("ignore_eos") is True else ""
    return Hit.at(
        f"Output position {at} is the stop id {ctx.name(out[at])}, and {len(out) - at - 1} ids follow it{asked}: a "
        "server ends the turn at its stop id, so they are no part of this answer (a loss mask over the prompt or the "
        "next turn, or a stop the server did not make); the drafter would learn to go on past the end of a turn.",
        [ctx.n_prompt + at],
    )


@rule(
    "output_prefix_overlap",
    ERROR,
    "Output ids begin with the prompt's tail (an SGLang bug): training would double them.",
)
def output_prefix_overlap(ctx: Context) -> Hit | None:
    prompt, out = ctx.capture.prompt_ids, ctx.output
    if not out or len(prompt) < 3:
        return None
    counted = (ctx.capture.usage or {}).get("completion_tokens")
    if counted == len(out) and not isinstance(counted, bool):
        return None  # the server generated every id: a model repeating its prompt's tail, not an echo
    earliest = max(0, len(prompt) - len(out))  # a tail longer than the output cannot begin it
    for j in seg.positions_of(prompt, out[0]):  # longest tail first
        k = len(prompt) - j
        if j < earliest or k < 3:
            continue
        if prompt[j:] == out[:k]:
            return Hit.at(
                f"output_ids begin with the last {k} prompt ids (prompt[{j}:]): the server echoed the prompt "
                f"into the output (SGLang #17240/#10896).",
                [ctx.n_prompt + i for i in range(k)],
            )
    return None


@rule(
    "completion_count_mismatch",
    ERROR,
    "The server's completion_tokens does not match the number of output ids.",
)
def completion_count_mismatch(ctx: Context) -> Hit | None:
    usage = ctx.capture.usage or {}
    problems = []
    ct, pt = usage.get("completion_tokens"), usage.get("prompt_tokens")
    if isinstance(ct, int) and ct != len(ctx.output):
        problems.append(f"usage.completion_tokens={ct} but output_ids has {len(ctx.output)}")
    if isinstance(pt, int) and pt != ctx.n_prompt:
        problems.append(f"usage.prompt_tokens={pt} but prompt_ids has {ctx.n_prompt}")
    if not problems:
        return None
    # A count disagrees with the ids: the ids the server counted are missing from (or extra to) what came back.
    return Hit.missing("; ".join(problems) + ": the ids are not the ones the server counted.")


@rule(
    "parser_hidden_ids",
    INFO,
    "Ids in the raw output that no text field shows (delimiters, stop): they stay in the training ids.",
)
def parser_hidden_ids(ctx: Context) -> Hit | None:
    if ctx.alignment is None:
        return None
    ids = ctx.capture.aligned_output_ids
    hidden = ctx.alignment.positions(HIDDEN)
    if not hidden:
        return None
    where = "parsed-path output" if ctx.paths_diverge else "output"
    listed = ", ".join(f"{ctx.name(ids[i])} at {where}[{i}]" for i in hidden[:12])
    more = f" and {len(hidden) - 12} more" if len(hidden) > 12 else ""
    detail = (
        f"{len(hidden)} id(s) are in the raw ids but in no returned text field: {listed}{more}. "
        f"They stay in the training ids."
    )
    if ctx.paths_diverge:
        # The hidden ids belong to the parsed path's generation: they are absent from the trained sequence.
        return Hit.missing(detail)
    return Hit.at(detail, [ctx.n_prompt + i for i in hidden])


def _reasoning_unreturned(ctx: Context) -> bool:
    c = ctx.capture
    if c.endpoint not in CHAT_ENDPOINTS or not c.has_text_fields or c.thinking is False or (c.reasoning or "").strip():
        return False  # only a response that returned text fields can have lost its reasoning field
    split = ctx.id_split
    if split is None or not split[0]:
        return False
    carried = (c.content or "") + (c.text or "")
    return split[0] not in carried


@rule(
    "reasoning_field_missing",
    ERROR,
    "The server reasoned but returned no reasoning field (e.g. reasoning_content vs reasoning).",
)
def reasoning_field_missing(ctx: Context) -> Hit | None:
    if not _reasoning_unreturned(ctx):
        return None
    return Hit.missing(
        "The ids hold reasoning, but no text field carries it (no `reasoning` or `reasoning_content` in the "
        "response): a client reading the wrong field name gets silently empty reasoning (vLLM ≥0.16 says "
        "`reasoning`, SGLang `reasoning_content`)."
    )


def _split_turned_off(value: object) -> bool:
    """Whether a request's `separate_reasoning` (SGLang's; true when absent) turned the reasoning split off: vLLM has
    no such field and ignores it."""
    return value is not None and as_pydantic_bool(value) is False


def _cut_text_agrees(ctx: Context, got: tuple[str, str], split: tuple[str, str]) -> bool:
    """Whether the text fields are the ids' split cut where a server cuts text and keeps the ids: at a request's
    stop string (`stopped_by_request` says it), or before a character whose bytes the output ended in the middle of
    (a cut-off output's last ids decode to U+FFFD; the server's detokenizer holds them back)."""
    stopped = isinstance(request_stop(ctx), str)
    if not stopped and not (split[0].endswith("\ufffd") or split[1].endswith("\ufffd")):
        return False
    whole = [s.rstrip("\ufffd").rstrip() for s in split]
    if stopped:  # the text ends where the stop string began: a prefix of the ids' text, in the last field written
        if whole[1] or got[1]:
            return got[0] == whole[0] and whole[1].startswith(got[1])
        return whole[0].startswith(got[0])
    return got == (whole[0], whole[1])


@rule("parser_split_mismatch", WARN, "The parser split reasoning/answer elsewhere than the delimiter ids do.")
def parser_split_mismatch(ctx: Context) -> Hit | None:
    c = ctx.capture
    if c.endpoint not in CHAT_ENDPOINTS or (c.reasoning is None and c.content is None) or _reasoning_unreturned(ctx):
        return None
    if c.server_kind == "sglang" and _split_turned_off(c.settings.get("separate_reasoning")):
        return None  # SGLang's `separate_reasoning: false`: the client asked for the whole answer in `content`
    if ctx.profile.format == HARMONY:
        return None  # the channels split a Harmony output: harmony_split_mismatch
    split = ctx.id_split
    if split is None:
        return None
    got = ((c.reasoning or "").strip(), (c.content or "").strip())
    if got == split or _cut_text_agrees(ctx, got, split):
        return None
    head = (
        f"The server split reasoning/content as {len(got[0])}/{len(got[1])} chars, the ids split them as "
        f"{len(split[0])}/{len(split[1])}"
    )
    if not ctx.profile.has_reasoning:
        # No delimiter ids: the ids put everything in the answer, so no id marks a split.
        return Hit.missing(
            head + ": the model has no think delimiters, so a reasoning parser on the server can only guess "
            "(start it without --reasoning-parser)."
        )
    detail = (
        head + f" at {ctx.profile.think_close}: the parser read the text differently from the ids (e.g. a "
        f"special {ctx.profile.think_close} invisible to a text parser)."
    )
    closers = [] if ctx.paths_diverge else ctx.out_closers
    if not closers:
        return Hit.missing(detail)  # no closer in the trained ids: the split the ids make is at their end
    return Hit.at(detail, [ctx.n_prompt + i for i in closers])


@rule(
    "literal_think_text",
    ERROR,
    "'<think>' appears as plain text pieces, not as the special id: the template or parser is wrong.",
)
def literal_think_text(ctx: Context) -> Hit | None:
    tok, out = ctx.tokenizer, ctx.pieces
    if tok is None or out is None:
        return None
    wanted = ctx.think_markers
    if not wanted or not _spelled_anywhere(ctx, out, wanted):
        return None  # the common case: no need to map bytes back to ids
    hidden = ctx.profile.delimiter_ids  # the delimiters and special ids spell no text: b"\0" stands for them
    pieces = [b"\x00" if t in hidden or tok.is_special(t) else tok.piece_bytes(t) for t in ctx.capture.prompt_ids]
    output = list(out.piece_bytes)
    for i in compress(count(), map(or_, out.special, map(hidden.__contains__, ctx.output))):  # few: in C
        output[i] = b"\x00"
    pieces += output
    buf = b"".join(pieces)
    markers = [m for m in wanted if m in buf]
    owner = [pos for pos, piece in enumerate(pieces) for _ in range(len(piece))]
    hits: list[int] = []
    for needle in markers:
        start = 0
        while (found := buf.find(needle, start)) != -1:
            hits.extend(sorted(set(owner[found : found + len(needle)])))
            start = found + 1
    where = ", ".join(str(p) for p in hits[:12])
    detail = (
        f"{ctx.profile.think_open}/{ctx.profile.think_close} spelled as ordinary text over several ids at "
        f"positions {where}, not as the special ids {ctx.profile.think_open_id}/{ctx.profile.think_close_id}"
    )
    if all(h < ctx.n_prompt for h in hits):
        # Only in the prompt: the user's own words, or a history re-rendered as text. Worth a look, not fatal.
        return Hit.at(detail + ": only in the prompt (a user's words, or history rendered as text).", hits, WARN)
    return Hit.at(detail + ": the output was re-tokenized from text or written in by hand.", hits)


def _spelled_anywhere(ctx: Context, out: OutputPieces, markers: tuple[bytes, ...]) -> bool:
    """True when a marker is in the bytes of some run of prompt + output ids between two ids that spell
    no text (special ids, the delimiters): what `literal_think_text` looks for, decided without
    building its per-id buffer. The cuts are few, so each run is one `join` and the scan stays in C.

    The prompt's runs that end inside it are the prompt scan's (`core.prompt_scan`: read once per prompt prefix);
    read here are the prompt's last run and the output's."""
    tok, scan = ctx.tokenizer, ctx.prompt_scan
    assert tok is not None and scan is not None
    if scan.spelled_at is not None:
        return True
    tail = scan.text_from
    offset = ctx.n_prompt - tail
    # the delimiters are the opener and closer, whose output positions the context already found
    cuts = {offset + i for i in (*out.special_at, *ctx.out_openers, *ctx.out_closers)}
    pieces = [*tok.pieces_bytes(ctx.capture.prompt_ids[tail:]), *out.piece_bytes]
    return first_spelling_cut(pieces, [*sorted(cuts), len(pieces)], markers) is not None


# -- tool calls on ids (the profile's layout: core/tool_calls.py) ------------------------------------


def _problems(ctx: Context, code: str) -> list[tc.Problem]:
    calls = ctx.calls
    return [] if calls is None else [p for p in calls.problems if p.code == code]


def _problem_hit(ctx: Context, code: str, advice: str) -> Hit | None:
    found = _problems(ctx, code)
    if not found:
        return None
    said = "; ".join(p.detail for p in found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    return Hit.at(f"{said}: {advice}", [ctx.n_prompt + q for p in found for q in p.positions])


@rule(
    "tool_section_unclosed",
    ERROR,
    "A tool-call section opened and never closed: the server's parser drops or mangles the calls.",
)
def tool_section_unclosed(ctx: Context) -> Hit | None:
    cause = " (the generation hit the length limit)" if ctx.cut_by_length else ""
    return _problem_hit(
        ctx, tc.SECTION_UNCLOSED, f"the turn ends inside its tool calls{cause}, a shape the template never renders."
    )


_UNCLOSED_PARSED = {
    HERMES: "SGLang's qwen25 parser drops it, vLLM's hermes parser returns it when its JSON is whole; either way",
    QWEN3_CODER: "vLLM's qwen3_coder parser returns what it holds, SGLang's drops it when a closed call came before;",
}
"""What the servers' parsers do with a call whose `</tool_call>` never came, by layout (the others: no parser returns
it whole)."""


@rule("tool_call_unclosed", ERROR, "A tool call began and never ended: its arguments are cut, the parser drops it.")
def tool_call_unclosed(ctx: Context) -> Hit | None:
    parsed = _UNCLOSED_PARSED.get(ctx.tool_calls.layout.parser) if ctx.tool_calls is not None else None
    if parsed is None:
        return _problem_hit(ctx, tc.CALL_UNCLOSED, "the call is cut; no parser returns it whole.")
    why = (
        f"the call has no `</tool_call>`: {parsed} a history renders the end the model never wrote, so the next "
        "prompt does not extend these ids."
    )
    return _problem_hit(ctx, tc.CALL_UNCLOSED, why)


@rule(
    "tool_call_out_of_order",
    ERROR,
    "Tool-call markers out of their order (a call inside a call, no argument marker, an end without a begin).",
)
def tool_call_out_of_order(ctx: Context) -> Hit | None:
    return _problem_hit(
        ctx, tc.OUT_OF_ORDER, "the calls do not follow the layout, so the parser's tool_calls cannot describe them."
    )


def _closed_calls(ctx: Context) -> list[tc.CallOnIds]:
    return [] if ctx.calls is None else [c for c in ctx.calls.calls if c.closed]


def _call_at(ctx: Context, call: tc.CallOnIds, span: tuple[int, int] | None = None) -> list[int]:
    """The absolute positions naming a call: its span's ids (`span`), else its begin marker."""
    if span is not None and span[0] < span[1]:
        return list(range(ctx.n_prompt + span[0], ctx.n_prompt + span[1]))
    return [ctx.n_prompt + call.span[0]]


@rule(
    "tool_arguments_not_object",
    WARN,
    "A call's arguments are not a JSON object: the tool cannot run it, and servers rewrite it ({}) or refuse it.",
)
def tool_arguments_not_object(ctx: Context) -> Hit | None:
    bad = [c for c in _closed_calls(ctx) if c.arguments_error is not None and c.arguments_span is not None]
    if not bad:
        return None
    said = "; ".join(f"the call at output[{c.span[0]}]: {c.arguments_error}" for c in bad[:4])
    if ctx.calls is not None and ctx.calls.layout.parser == QWEN3_CODER:
        return Hit.at(
            f"{said}. The harness never sees this call, and the model's next turn follows ids no history renders.",
            [p for c in bad for p in _call_at(ctx, c, c.arguments_span)],
        )
    return Hit.at(
        f"{said}. As history, vLLM renders such arguments as {{}} and SGLang answers 400: the next turn's prompt "
        f"cannot extend these ids.",
        [p for c in bad for p in _call_at(ctx, c, c.arguments_span)],
    )


@rule("tool_not_declared", WARN, "A call names a function the request's `tools` does not declare.")
def tool_not_declared(ctx: Context) -> Hit | None:
    declared = tc.declared_tools(ctx.capture.settings)
    if declared is None:
        return None  # the capture did not record the request's tools
    bad = [c for c in _closed_calls(ctx) if c.name is not None and c.name not in declared]
    if not bad:
        return None
    names = ", ".join(sorted(declared)) or "none"
    said = ", ".join(f"{c.name!r} at output[{c.span[0]}]" for c in bad[:6])
    return Hit.at(
        f"The calls name {said}, which the request's tools do not declare (declared: {names}): the model called a "
        f"function it was not offered.",
        [p for c in bad for p in _call_at(ctx, c, c.id_span or c.arguments_span)],
    )


@rule(
    "tool_call_id_form",
    WARN,
    "A Kimi call id is not `functions.NAME:IDX`: Kimi's parsers read the name from it, and may drop the call.",
)
def tool_call_id_form(ctx: Context) -> Hit | None:
    if ctx.calls is None or ctx.calls.layout.parser != KIMI_K2:
        return None
    bad = [c for c in _closed_calls(ctx) if c.call_id is not None and not tc.KIMI_CALL_ID.fullmatch(c.call_id)]
    if not bad:
        return None
    said = ", ".join(f"{c.call_id!r} at output[{c.span[0]}]" for c in bad[:6])
    return Hit.at(
        f"Call ids {said} are not in Kimi's functions.NAME:IDX form (what its template renders and its parsers read).",
        [p for c in bad for p in _call_at(ctx, c, c.id_span)],
    )


def _reasoning_open_at(ctx: Context, out_pos: int) -> bool:
    """Whether reasoning is open just before this output position (the last think delimiter before it opened)."""
    if not ctx.profile.has_reasoning:
        return False
    state = ctx.prefilled_opener is not None
    for pos, opens in sorted([(p, True) for p in ctx.out_openers] + [(p, False) for p in ctx.out_closers]):
        if pos >= out_pos:
            break
        state = opens
    return state


def _section_in_reasoning(ctx: Context) -> int | None:
    """The output position of the first tool marker when it comes while reasoning is still open."""
    first = ctx.calls.first_marker if ctx.calls is not None else None
    return first if first is not None and _reasoning_open_at(ctx, first) else None


@rule(
    "tool_section_in_reasoning",
    WARN,
    "The tool calls open before the reasoning closed (Kimi-K2.5 does this): the history re-render inserts the "
    "closer, so the next turn's prompt does not extend these ids.",
)
def tool_section_in_reasoning(ctx: Context) -> Hit | None:
    first = _section_in_reasoning(ctx)
    if first is None:
        return None
    p = ctx.profile
    return Hit.at(
        f"{ctx.name(ctx.output[first])} at {ctx.where(first)} opens the tool calls while reasoning is open (no "
        f"{p.think_close}, id {p.think_close_id}, before it). Both servers end the reasoning there; the chat "
        f"template renders {p.think_close} before the calls in the history, an id this output never produced.",
        [ctx.n_prompt + first],
    )


@rule(
    "text_after_tool_calls",
    WARN,
    "Text after the tool calls, before the stop: parsers drop it or file it elsewhere, templates never render it.",
)
def text_after_tool_calls(ctx: Context) -> Hit | None:
    calls = ctx.calls
    if calls is None:
        return None
    end = len(ctx.output) - (1 if ctx.output and ctx.output[-1] in ctx.profile.stop_ids else 0)
    after = ctx.output[calls.end : end]
    if calls.end >= end or ctx.blank(after):
        return None
    return Hit.at(
        f"{len(after)} id(s) after the tool calls, from {ctx.where(calls.end)}: the template renders nothing "
        f"after the calls, so a history re-render drops them.",
        list(range(ctx.n_prompt + calls.end, ctx.n_prompt + end)),
    )


def _calls_on_served_ids(ctx: Context) -> tc.ToolCallsOnIds | None:
    """The calls on the ids the text fields came from (the parsed path's in a diverged dual capture)."""
    return ctx.aligned_tool_calls if ctx.aligned_tool_calls is not None else ctx.tool_calls


def _server_call_differences(ctx: Context) -> tuple[list[str], list[int], list[str], list[int]]:
    """(differences, their positions, renumbered ids, their positions) between the server's tool_calls and
    the calls on the ids the text fields came from."""
    c = ctx.capture
    on_ids = _calls_on_served_ids(ctx)
    calls = [] if on_ids is None else list(on_ids.calls)
    server = c.tool_calls or []
    kimi = on_ids is not None and on_ids.layout.parser == KIMI_K2
    xml = on_ids is not None and on_ids.layout.parser == QWEN3_CODER  # compared by value: the servers convert apart
    diffs: list[str] = []
    renumbered: list[str] = []
    at: list[int] = []
    renumbered_at: list[int] = []
    n = ctx.n_prompt
    positions_ok = not ctx.paths_diverge  # a diverged dual capture's calls are on the parsed path's ids
    if len(server) != len(calls):
        diffs.append(f"the server returned {len(server)} call(s), the ids hold {len(calls)}")
        at += [n + calls[len(server)].span[0]] if len(calls) > len(server) and positions_ok else []
    for k, (mine, theirs) in enumerate(zip(calls, server)):
        where = [n + mine.span[0]] if positions_ok else []
        if mine.name != theirs.get("name"):
            diffs.append(f"call {k}: name {theirs.get('name')!r} vs {mine.name!r} on the ids")
            at += where
        agree = xml and arguments_agree(mine.parameters or (), theirs.get("arguments"))
        if mine.arguments is not None and mine.arguments != theirs.get("arguments") and not agree:
            diffs.append(f"call {k}: arguments {theirs.get('arguments')!r} vs {mine.arguments!r} on the ids")
            at += where
        if kimi and mine.call_id is not None and mine.call_id != theirs.get("id"):
            said = f"call {k}: id {theirs.get('id')!r} vs {mine.call_id!r} on the ids"
            if c.server_kind == "sglang" and _only_counter_differs(mine.call_id, theirs.get("id")):
                renumbered.append(said)
                renumbered_at += where
            else:
                diffs.append(said)
                at += where
    return diffs, at, renumbered, renumbered_at


def _only_counter_differs(mine: str, theirs: object) -> bool:
    a, b = tc.KIMI_CALL_ID.fullmatch(mine), tc.KIMI_CALL_ID.fullmatch(theirs) if isinstance(theirs, str) else None
    return a is not None and b is not None and a.group("name") == b.group("name")


def _server_parsed_calls(ctx: Context) -> bool:
    """A chat answer whose calls a tool parser could have returned: the ids hold calls, or it returned some."""
    c = ctx.capture
    if c.endpoint not in CHAT_ENDPOINTS or ctx.tokenizer is None or ctx.tool_calls is None:
        return False  # not a chat answer, or no layout to read calls on the ids by
    if c.endpoint == "imported" and c.tool_calls is None:
        return False  # a pre-tokenized row (`audit`): no server returned fields to compare the ids with
    return bool(c.tool_calls) or ctx.calls is not None


def _forced_plain_json(ctx: Context) -> bool:
    """tool_choice required or named, answered as plain JSON: a server whose grammar for forced calls is a JSON
    schema (not the model's own markers, as Kimi's is) builds tool_calls from that text, so its ids hold no markers
    by design. Told by the answer after the reasoning: JSON text holding none of the layout's marker ids, not a call
    that lost some of them (vLLM's stream keeps a call's end marker, whose `}` is the arguments' last character)."""
    choice = ctx.capture.settings.get("tool_choice")
    if not (choice == "required" or isinstance(choice, dict)) or ctx.tokenizer is None:
        return False
    out, close = ctx.output, ctx.profile.think_close_id
    if close is not None and close in out:
        out = out[len(out) - out[::-1].index(close) :]
    layout = ctx.profile.tool_calls
    if layout is not None and not layout.marker_ids.isdisjoint(out):
        return False
    try:
        json.loads(ctx.tokenizer.decode(out, skip_special_tokens=True))
    except Exception:  # not JSON (a call that lost its markers), or ids that did not decode: no reason to exempt it
        return False
    return True


def _calls_lost_from_ids(ctx: Context) -> int | None:
    """How many calls the server returned when the ids hold none at all: its parser read them off the ids it
    generated, so the ids that came back lost the calls' markers (SGLang's streamed `sglext.output_ids` without
    the section's markers, vLLM's stream without the chunks that gave no delta). Fewer calls on the ids than in the
    field (a parser that splits one call's JSON array into several) stays `tool_calls_field_mismatch`."""
    if not _server_parsed_calls(ctx) or not ctx.capture.tool_calls:
        return None
    on_ids = _calls_on_served_ids(ctx)
    if on_ids is not None and on_ids.calls:
        return None
    return None if _forced_plain_json(ctx) else len(ctx.capture.tool_calls)


@rule(
    "tool_calls_missing_from_ids",
    ERROR,
    "The server returned tool calls and the output ids hold none: ids were lost on the way, and a drafter trained "
    "on them learns calls without their markers.",
)
def tool_calls_missing_from_ids(ctx: Context) -> Hit | None:
    server = _calls_lost_from_ids(ctx)
    if server is None:
        return None
    return Hit.missing(
        f"the server returned {server} tool call(s), the output ids hold none: its parser read the calls off the "
        f"ids it generated, so the ids that came back are not those (a stream that dropped the section's marker "
        f"ids?); these ids would train the drafter on calls without their markers."
    )


@rule(
    "tool_calls_field_mismatch",
    WARN,
    "The server's tool_calls differ from the calls on the ids: a history built from the field re-renders other ids.",
)
def tool_calls_field_mismatch(ctx: Context) -> Hit | None:
    if not _server_parsed_calls(ctx) or _calls_lost_from_ids(ctx) is not None:
        return None  # lost calls are `tool_calls_missing_from_ids`, an error
    diffs, at, _, _ = _server_call_differences(ctx)
    if not diffs:
        return None
    if ctx.capture.tool_calls:
        why = ""
    elif ctx.capture.finish_reason == "length":  # a call the token limit cut: no parser returns one it saw no end of
        why = " (no tool_calls came back: the output was cut at its token limit, and a parser returns no call it saw no end of)"
    else:
        why = " (no tool_calls came back: the server ran no tool parser, or tool_choice was none)"
    detail = "; ".join(diffs[:4]) + why
    detail += ": a client that sends the field back as history gets a prompt that does not extend these ids."
    return Hit.at(detail, at) if at else Hit.missing(detail)


@rule(
    "tool_call_id_renumbered",
    INFO,
    "SGLang returned a call id with its own counter (calls in the history + index), not the id the model wrote.",
)
def tool_call_id_renumbered(ctx: Context) -> Hit | None:
    if not _server_parsed_calls(ctx):
        return None
    _, _, renumbered, at = _server_call_differences(ctx)
    if not renumbered:
        return None
    detail = "; ".join(renumbered[:4]) + (
        ": SGLang renumbers call ids by the calls in the history; sent back, its id renders other ids than "
        "these (vLLM echoes the model's)."
    )
    return Hit.at(detail, at) if at else Hit.missing(detail)


def id_text(tokenizer: TokenizerAdapter | None, token_id: int) -> str:
    """`id N 'piece'` (the piece only with a tokenizer that reads it): how a prefix break names the ids on its two
    sides, in a batch chain's finding and in the proxy's."""
    if tokenizer is None:
        return f"id {token_id}"
    try:
        return f"id {token_id} {tokenizer.piece_text(token_id)!r}"
    except Exception:  # a display nicety: never a reason to lose the finding
        return f"id {token_id}"


def _chain(ctx: Context) -> JsonObject | None:
    """The capture's place in a regenerated chain (`batch/chains.py` records it in the settings), if any."""
    chain = ctx.capture.settings.get("chain")
    return chain if isinstance(chain, dict) else None


@rule(
    "session_prefix_break",
    WARN,
    "A conversation's turn whose prompt ids do not extend the previous turn's prompt + output ids.",
)
def session_prefix_break(ctx: Context) -> Hit | None:
    """A batch chain's turn (`tokview proxy` adds the same finding for a proxied session's turn)."""
    chain = _chain(ctx)
    if chain is None or chain.get("extends") is not False:
        return None
    break_at = chain.get("break_at")
    at = int(break_at) if isinstance(break_at, (int, float, str)) and break_at else 0
    here = id_text(ctx.tokenizer, ctx.capture.prompt_ids[at]) if at < ctx.n_prompt else "the prompt ends"
    previous = chain.get("previous_id")
    there = f", where that turn has {id_text(ctx.tokenizer, previous)}" if isinstance(previous, int) else ""
    detail = (
        f"turn {chain.get('turn')} of chain {chain.get('conversation')} does not extend turn "
        f"{chain.get('parent')}'s prompt + output ids ({chain.get('previous_len')} ids): they first differ at "
        f"position {at} (here {here}{there}). {_rerender_causes(ctx, previous, chain, at)}: a drafter trained on this turn sees "
        "a prompt the model never continued."
    )
    if not ctx.n_prompt:
        return Hit.missing(detail)
    return Hit.at(detail, [min(at, ctx.n_prompt - 1)])


def _rerender_causes(ctx: Context, previous: object, chain: JsonObject, at: int) -> str:
    previous_len, prompt_len = chain.get("previous_len"), chain.get("previous_prompt_len")
    return rerender_causes(
        ctx.profile,
        ctx.tokenizer,
        previous,
        previous_len if isinstance(previous_len, int) else None,
        at,
        prompt_len if isinstance(prompt_len, int) else None,
    )


HISTORY_RERENDERS = (
    "(a block it pre-filled dropped once it is history, as Qwen3's empty think block with thinking off; a finished "
    "tool loop's reasoning dropped, as Kimi's)"
)
"""What a template re-renders of the history before a turn's answer (a batch chain's break and a proxied session's)."""


def rerender_causes(
    profile: ModelProfile,
    tokenizer: TokenizerAdapter | None,
    previous: object,
    previous_len: int | None,
    at: int,
    previous_prompt_len: int | None = None,
) -> str:
    """What a template's re-render of the history changes, for this model's format: the think-tag list named a
    `</think>` to a gpt-oss chain, whose break is a call's header written in another order, and to a GLM chain
    that broke where the model's stop id was rendered as another end of turn. `previous`: the id the earlier turn
    has at the break, `previous_len` its prompt + output length, `previous_prompt_len` its prompt's (a batch chain's
    and a proxied session's alike): a break inside that prompt is no re-render of the answer (Qwen3 with thinking
    off drops the empty think block it pre-filled, and every chained turn broke with the answer's causes named)."""
    if previous_prompt_len is not None and at < previous_prompt_len:
        return f"The template rendered the history before that turn's answer otherwise than in that turn's prompt {HISTORY_RERENDERS}"
    at_its_end = previous_len is not None and at == previous_len - 1  # the previous turn's last id: its stop
    if isinstance(previous, int) and previous in profile.stop_ids and at_its_end:
        return (
            f"The template ends that turn otherwise than the model did: it stopped with {id_text(tokenizer, previous)}"
            ", and the history renders another end of turn there"
        )
    if profile.format == HARMONY:
        return (
            "The template re-rendered the history (a call's header written in another order, an analysis message "
            "dropped, arguments re-serialised)"
        )
    return (
        "The template re-rendered the history (reasoning dropped outside the tool loop, a `</think>` the model never "
        "wrote, content or arguments re-serialised, call ids renumbered)"
    )


@rule(
    "chain_stopped",
    INFO,
    "A regenerated chain stopped after this turn: the file's tool results do not answer the calls it made.",
)
def chain_stopped(ctx: Context) -> Hit | None:
    chain = _chain(ctx)
    if chain is None or not chain.get("stopped"):
        return None
    return Hit.missing(
        f"the chain {chain.get('conversation')} stopped after this turn: {chain['stopped']}. This sample is exact; "
        "the turns after it were not generated (counted in the batch summary)."
    )


@rule(
    "retokenize_drift",
    WARN,
    "Re-encoding the decoded text gives other ids: never rebuild training ids from text.",
)
def retokenize_drift(ctx: Context) -> Hit | None:
    if ctx.tokenizer is None or not ctx.output:
        return None
    again = ctx.reencoded_output
    assert again is not None  # there is a tokenizer
    first = first_difference(again, ctx.output)
    if first is None:
        return None
    return Hit.at(
        f"encode(decode(output_ids)) differs from output_ids from {ctx.where(first)} ({len(ctx.output)} → "
        f"{len(again)} ids): any pipeline that stores text instead of ids trains on other tokens.",
        [ctx.n_prompt + min(first, len(ctx.output) - 1)],
    )


@rule(
    "prompt_render_mismatch",
    WARN,
    "The served prompt ids differ from rendering the messages locally with this tokenizer.",
)
def prompt_render_mismatch(ctx: Context) -> Hit | None:
    c, tok, local = ctx.capture, ctx.tokenizer, ctx.local_render
    if tok is None or local is None:
        return None
    if isinstance(local, Exception):  # a broken template is itself a mismatch worth showing
        return Hit.missing(f"The local chat template failed to render this conversation: {local}")
    first = ctx.render_difference
    if first is None or served_date(tok, local, c.prompt_ids) is not None:
        return None  # equal, or only the stamped date differs (`prompt_date_mismatch` says so)
    detail = (
        f"The local tokenizer renders {len(local)} prompt ids, the server used {ctx.n_prompt}; they differ from "
        f"position {first}: the local template or tokenizer is not the server's."
    )
    if not ctx.n_prompt:
        return Hit.missing(detail)  # the server's prompt holds no id to name
    return Hit.at(detail, [min(first, ctx.n_prompt - 1)])


SERVER_LIMIT_SETTING = "max_model_len"
"""The capture setting that records the context length the server reported when it was asked."""


@rule(
    "over_max_length",
    WARN,
    "Prompt + output is longer than the model's context (the server's max_model_len, else the tokenizer's).",
)
def over_max_length(ctx: Context) -> Hit | None:
    """Against the context the sample was generated in: the server's reported `max_model_len`, else the
    tokenizer's `model_max_length` (a tokenizer's default can be far below what the server runs with:
    Kimi-layout's 4096 against a 32,768 server). A trainer's own, shorter limit is counted by the export
    (its max_length counts and warnings), where the trainer is known."""
    limit, source = _context_limit(ctx)
    total = ctx.n_prompt + len(ctx.output)
    if not limit or total <= limit:
        return None
    return Hit.at(
        f"prompt + output is {total} ids, over the {limit}-id limit ({source}): more than the model's context "
        f"holds, and trainers will truncate or drop it.",
        [limit],
    )


def _context_limit(ctx: Context) -> tuple[int | None, str]:
    """(the limit, where it comes from, in words)."""
    reported = ctx.capture.settings.get(SERVER_LIMIT_SETTING)
    if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0:
        return reported, "the server's max_model_len"
    if ctx.tokenizer is not None and ctx.tokenizer.model_max_length:
        return ctx.tokenizer.model_max_length, "the tokenizer's model_max_length; the server reported no max_model_len"
    if ctx.profile.max_length:
        return ctx.profile.max_length, f"profile {ctx.profile.name}'s max_length; no server or tokenizer reported one"
    return None, ""


@rule(
    "off_policy",
    WARN,
    "The target (tokview score) finds this output unlikely: a drafter trained on it learns what the target rejects.",
)
def off_policy(ctx: Context) -> Hit | None:
    return _off_policy(ctx.capture, ctx.n_prompt)


def _off_policy(capture: Capture, n_prompt: int) -> Hit | None:
    """From `tokview score`: the target's mean NLL over the output, against the threshold it was scored with."""
    from tokview.core import logprobs as lp

    score, values = capture.target_score, capture.target_logprobs
    if not isinstance(score, dict) or not values:
        return None
    threshold = float(score.get("off_policy_nll", lp.DEFAULT_OFF_POLICY_NLL))
    low_prob = float(score.get("low_prob", lp.DEFAULT_LOW_PROB))
    nll = lp.mean_nll(values)
    if nll is None or nll <= threshold:
        return None
    cut = math.log(low_prob)
    unlikely = [n_prompt + p for p, v in enumerate(values) if v is not None and v < cut]
    detail = (
        f"the target {score.get('model') or ''} finds this output unlikely: mean NLL {nll:.2f} nats/token over "
        f"{len(values)} tokens (> {threshold:g}); {len(unlikely)} tokens below p={low_prob:g}. Off-policy data "
        f"trains a drafter the target then rejects."
    )
    if not unlikely:  # none below p, yet unlikely on the whole: name the least likely tokens
        least = sorted((v, p) for p, v in enumerate(values) if v is not None)[:100]  # ties: the earlier first
        unlikely = sorted(n_prompt + p for _, p in least)
    return Hit.at(detail, unlikely[:100])


def off_policy_finding(capture: Capture) -> Finding | None:
    """The `off_policy` finding of a capture `tokview score` just scored: the rule `analyze` applies, run
    without the rest of the analysis (it reads nothing but the target scores)."""
    hit = _off_policy(capture, len(capture.prompt_ids))
    return None if hit is None else RULES["off_policy"].finding(hit)


# Checks in modules of their own register here, last: control tokens spelled in the messages' text, and the Harmony
# (gpt-oss) checks beside the Harmony reader.
from tokview.core import control_text as _control_text  # noqa: E402, F401
from tokview.core import harmony_findings as _harmony_findings  # noqa: E402, F401

FINDING_CODES = tuple(RULES)
