"""Findings: what is wrong (or worth knowing) about one capture, with stable codes.

Each check reads the ids first and the text fields second, and explains itself with the ids and
positions it names, so a person can jump straight to them. Positions are absolute indices into
prompt_ids + output_ids. A sample is valid when it has no error finding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tokview.core import segments as seg
from tokview.core.alignment import HIDDEN, Alignment
from tokview.core.profiles import ModelProfile
from tokview.core.record import Capture

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

INFO, WARN, ERROR = "info", "warn", "error"
SEVERITIES = (INFO, WARN, ERROR)

DEFAULT_SEVERITY: dict[str, str] = {
    "empty_output": ERROR,
    "dual_divergence": ERROR,
    "think_open_in_prompt": INFO,
    "think_open_missing": ERROR,
    "think_close_missing": ERROR,
    "think_close_repeated": ERROR,
    "think_open_in_output_after_prefill": WARN,
    "reasoning_with_thinking_off": ERROR,
    "empty_reasoning": WARN,
    "empty_answer": ERROR,
    "truncated": ERROR,
    "no_stop_token": WARN,
    "output_prefix_overlap": ERROR,
    "completion_count_mismatch": ERROR,
    "parser_hidden_ids": INFO,
    "parser_split_mismatch": WARN,
    "reasoning_field_missing": ERROR,
    "literal_think_text": ERROR,
    "retokenize_drift": WARN,
    "prompt_render_mismatch": WARN,
    "over_max_length": WARN,
    "off_policy": WARN,
}
FINDING_CODES = tuple(DEFAULT_SEVERITY)
CHAT_ENDPOINTS = {"sglang-chat", "vllm-chat", "dual", "imported"}


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    detail: str
    positions: tuple[int, ...] = ()


@dataclass
class Context:
    """Everything the checks share, computed once per capture."""

    capture: Capture
    profile: ModelProfile
    tokenizer: TokenizerAdapter | None
    kinds: list[str]
    alignment: Alignment | None
    aligned_kinds: list[str] | None
    n_prompt: int = field(init=False)
    id_split: tuple[str, str] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.n_prompt = len(self.capture.prompt_ids)

    @property
    def output(self) -> list[int]:
        return self.capture.output_ids

    def out_kind(self, kind: str) -> list[int]:
        """Output-relative positions of one segment kind."""
        return [i - self.n_prompt for i, k in enumerate(self.kinds) if k == kind and i >= self.n_prompt]

    def name(self, token_id: int) -> str:
        if self.tokenizer is None:
            return str(token_id)
        return f"{token_id} {self.tokenizer.piece_text(token_id)!r}"

    def where(self, out_pos: int) -> str:
        return f"output[{out_pos}] (position {self.n_prompt + out_pos})"

    def text_of(self, ids: Sequence[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(ids, skip_special_tokens=True)


Check = Callable[[Context], "Finding | None"]
CHECKS: dict[str, Check] = {}


def check(code: str) -> Callable[[Callable[[Context], tuple[str, Sequence[int]] | None]], Check]:
    """Register a check that returns (detail, positions[, severity]) or None."""

    def wrap(fn: Callable[[Context], tuple | None]) -> Check:
        def run(ctx: Context) -> Finding | None:
            hit = fn(ctx)
            if hit is None:
                return None
            detail, positions, *severity = hit
            return Finding(code, severity[0] if severity else DEFAULT_SEVERITY[code], detail, tuple(positions))

        CHECKS[code] = run
        return run

    return wrap


def _positions_of(ids: Sequence[int], token_id: int | None) -> list[int]:
    return [i for i, t in enumerate(ids) if t == token_id] if token_id is not None else []


def _reasoning_opened(ctx: Context) -> bool:
    return seg.PREFILLED_OPENER in ctx.kinds or seg.OPENER in ctx.kinds


def _open_at_end(ctx: Context) -> bool:
    """True when the last think delimiter seen (prompt opener or output delimiter) opened reasoning."""
    for kind in reversed(ctx.kinds):
        if kind in (seg.OPENER, seg.PREFILLED_OPENER):
            return True
        if kind == seg.CLOSER:
            return False
    return False


@check("empty_output")
def _empty_output(ctx: Context):
    if ctx.output:
        return None
    return (f"The server returned no output ids (finish_reason={ctx.capture.finish_reason}): nothing to train on.", [])


@check("dual_divergence")
def _dual_divergence(ctx: Context):
    c = ctx.capture
    if not c.paths_diverge:
        return None
    parsed = c.parsed_output_ids or []
    first = next(
        (i for i, (a, b) in enumerate(zip(parsed, c.output_ids)) if a != b), min(len(parsed), len(c.output_ids))
    )
    return (
        f"The parsed chat path generated other ids than the raw path ({len(parsed)} vs {len(c.output_ids)} ids, "
        f"first difference at output[{first}]): its text fields describe another generation, so the "
        f"reasoning/content comparisons use the parsed path's own ids. Use temperature 0 or a seed.",
        [ctx.n_prompt + first] if first < len(c.output_ids) else [],
    )


@check("think_open_in_prompt")
def _think_open_in_prompt(ctx: Context):
    pos = seg.prefilled_opener_position(ctx.capture.prompt_ids, ctx.profile)
    if pos is None:
        return None
    return (
        f"The chat template pre-filled {ctx.profile.think_open} (id {ctx.profile.think_open_id}) at prompt "
        f"position {pos}: the output starts inside reasoning, and the model never generates this id. "
        f"Its absence from output_ids is expected, not a server bug.",
        [pos],
    )


@check("think_open_missing")
def _think_open_missing(ctx: Context):
    p = ctx.profile
    closers = _positions_of(ctx.output, p.think_close_id)
    prompt_opened = seg.PREFILLED_OPENER in ctx.kinds
    if closers:
        opened = prompt_opened or p.think_open_id in ctx.output[: closers[0]]
        if opened:
            return None
        return (
            f"{p.think_close} (id {p.think_close_id}) at {ctx.where(closers[0])} closes reasoning that was never "
            f"opened: the prompt does not end with {p.think_open} (id {p.think_open_id}) and the output does not "
            f"emit it. The prompt was likely rendered without the thinking template.",
            [ctx.n_prompt + closers[0]],
        )
    if ctx.capture.thinking is True and p.prefills_opener and ctx.output and not _reasoning_opened(ctx):
        return (
            f"Thinking was on, but the prompt does not end with {p.think_open} (id {p.think_open_id}) and the "
            f"output never opens reasoning: the template kwargs ({p.thinking_kwarg}) did not reach the template.",
            [],
        )
    return None


@check("think_close_missing")
def _think_close_missing(ctx: Context):
    if not ctx.output or not _open_at_end(ctx):
        return None
    why = " (the generation hit the length limit)" if ctx.capture.finish_reason == "length" else ""
    if seg.CLOSER in ctx.kinds[ctx.n_prompt :]:
        reopened = max(i for i, k in enumerate(ctx.kinds) if k == seg.OPENER)
        return (
            f"Reasoning was reopened with {ctx.profile.think_open} at {ctx.where(reopened - ctx.n_prompt)} after "
            f"it had closed, and never closed again{why}.",
            [reopened],
        )
    return (
        f"Reasoning was opened but {ctx.profile.think_close} (id {ctx.profile.think_close_id}) never appears in "
        f"{len(ctx.output)} output ids{why}: the whole output is reasoning, and parsers will mislabel it.",
        [],
    )


@check("think_close_repeated")
def _think_close_repeated(ctx: Context):
    closers = _positions_of(ctx.output, ctx.profile.think_close_id)
    if len(closers) < 2:
        return None
    where = ", ".join(f"output[{i}]" for i in closers)
    return (
        f"{ctx.profile.think_close} (id {ctx.profile.think_close_id}) appears {len(closers)} times, at {where}; "
        f"a sample has exactly one.",
        [ctx.n_prompt + i for i in closers],
    )


@check("think_open_in_output_after_prefill")
def _open_after_prefill(ctx: Context):
    if seg.PREFILLED_OPENER not in ctx.kinds:
        return None
    opens = _positions_of(ctx.output, ctx.profile.think_open_id)
    if not opens:
        return None
    return (
        f"The template already pre-filled {ctx.profile.think_open}, yet the output emits it again (id "
        f"{ctx.profile.think_open_id}) at {ctx.where(opens[0])}: the reasoning is opened twice.",
        [ctx.n_prompt + i for i in opens],
    )


@check("reasoning_with_thinking_off")
def _reasoning_with_thinking_off(ctx: Context):
    """A reasoning model run with thinking off is a plain chat model: its output must hold no reasoning."""
    if ctx.capture.thinking is not False or not ctx.profile.has_reasoning:
        return None
    out = [i for i, k in enumerate(ctx.kinds[ctx.n_prompt :]) if k in (seg.OPENER, seg.REASONING, seg.CLOSER)]
    if not out:
        return None
    delims = [i for i in out if ctx.output[i] in ctx.profile.delimiter_ids]
    what = (
        f"{ctx.name(ctx.output[delims[0]])} at {ctx.where(delims[0])}"
        if delims
        else f"{len(out)} reasoning ids from {ctx.where(out[0])}"
    )
    return (
        f"Thinking was off ({ctx.profile.thinking_kwarg or 'no template kwarg'}), yet the output holds "
        f"reasoning: {what}. The template kwarg did not reach the template, or the model ignores it.",
        [ctx.n_prompt + i for i in (delims or out[:1])],
    )


@check("empty_reasoning")
def _empty_reasoning(ctx: Context):
    closers = _positions_of(ctx.output, ctx.profile.think_close_id)
    if not _reasoning_opened(ctx) or not closers:
        return None
    first = closers[0]
    ids = [ctx.output[i] for i in ctx.out_kind(seg.REASONING) if i < first]
    text = ctx.text_of(ids)
    if ids and (text is None or text.strip()):
        return None
    return (
        f"The reasoning before {ctx.profile.think_close} at {ctx.where(first)} is empty "
        f"({len(ids)} whitespace ids): the model skipped thinking.",
        [ctx.n_prompt + first],
    )


@check("empty_answer")
def _empty_answer(ctx: Context):
    if not ctx.output or _open_at_end(ctx):
        return None  # no answer was due yet: think_close_missing says why
    ids = [ctx.output[i] for i in ctx.out_kind(seg.ANSWER)]
    text = ctx.text_of(ids)
    if ids and (text is None or text.strip()):
        return None
    after = " after the reasoning" if _reasoning_opened(ctx) else ""
    return (f"No answer{after} ({len(ids)} answer ids, all blank).", [ctx.n_prompt + i for i in ctx.out_kind(seg.STOP)])


@check("truncated")
def _truncated(ctx: Context):
    if ctx.capture.finish_reason != "length":
        return None
    limit = ctx.capture.settings.get("max_new_tokens")
    return (
        f"finish_reason=length after {len(ctx.output)} output ids"
        + (f" (max_new_tokens={limit})" if limit else "")
        + ": a cut-off generation must not be trained on.",
        [ctx.n_prompt + len(ctx.output) - 1] if ctx.output else [],
    )


@check("no_stop_token")
def _no_stop_token(ctx: Context):
    if ctx.capture.finish_reason == "length" or not ctx.output or not ctx.profile.stop_ids:
        return None  # no stop was due, nothing was generated, or the profile names no stop ids
    if ctx.output[-1] in ctx.profile.stop_ids:
        return None
    last = f"ends with {ctx.name(ctx.output[-1])}"
    stops = ", ".join(str(i) for i in ctx.profile.stop_ids)
    return (
        f"The output {last}, not a stop id ({stops}): the drafter never learns to end the turn.",
        [ctx.n_prompt + len(ctx.output) - 1] if ctx.output else [],
    )


@check("output_prefix_overlap")
def _output_prefix_overlap(ctx: Context):
    prompt, out = ctx.capture.prompt_ids, ctx.output
    if not out or len(prompt) < 3:
        return None
    for j in range(len(prompt)):
        k = len(prompt) - j
        if k < 3 or k > len(out):
            continue
        if prompt[j] == out[0] and prompt[j:] == out[:k]:
            return (
                f"output_ids begin with the last {k} prompt ids (prompt[{j}:]): the server echoed the prompt "
                f"into the output (SGLang #17240/#10896).",
                [ctx.n_prompt + i for i in range(k)],
            )
    return None


@check("completion_count_mismatch")
def _count_mismatch(ctx: Context):
    usage = ctx.capture.usage or {}
    problems = []
    ct, pt = usage.get("completion_tokens"), usage.get("prompt_tokens")
    if isinstance(ct, int) and ct != len(ctx.output):
        problems.append(f"usage.completion_tokens={ct} but output_ids has {len(ctx.output)}")
    if isinstance(pt, int) and pt != ctx.n_prompt:
        problems.append(f"usage.prompt_tokens={pt} but prompt_ids has {ctx.n_prompt}")
    if not problems:
        return None
    return ("; ".join(problems) + ": the ids are not the ones the server counted.", [])


@check("parser_hidden_ids")
def _parser_hidden(ctx: Context):
    if ctx.alignment is None:
        return None
    ids = ctx.capture.aligned_output_ids
    hidden = ctx.alignment.positions(HIDDEN)
    if not hidden:
        return None
    where = "parsed-path output" if ctx.capture.paths_diverge else "output"
    listed = ", ".join(f"{ctx.name(ids[i])} at {where}[{i}]" for i in hidden[:12])
    more = f" and {len(hidden) - 12} more" if len(hidden) > 12 else ""
    # Positions name ids of the trained sequence only when the text came from those very ids.
    positions = [] if ctx.capture.paths_diverge else [ctx.n_prompt + i for i in hidden]
    return (
        f"{len(hidden)} id(s) are in the raw ids but in no returned text field: {listed}{more}. "
        f"They stay in the training ids.",
        positions,
    )


def _id_split(ctx: Context) -> tuple[str, str] | None:
    """(reasoning text, answer text) as the ids split them; computed once per capture."""
    if ctx.tokenizer is None or ctx.aligned_kinds is None:
        return None
    if ctx.id_split is None:
        ctx.id_split = _decode_split(ctx)
    return ctx.id_split


def _decode_split(ctx: Context) -> tuple[str, str]:
    ids = ctx.capture.aligned_output_ids
    kinds = ctx.aligned_kinds[ctx.n_prompt :]
    reasoning = [t for t, k in zip(ids, kinds) if k == seg.REASONING]
    answer = [t for t, k in zip(ids, kinds) if k == seg.ANSWER]
    return (
        ctx.tokenizer.decode(reasoning, skip_special_tokens=True).strip(),
        ctx.tokenizer.decode(answer, skip_special_tokens=True).strip(),
    )


def _reasoning_unreturned(ctx: Context) -> bool:
    c = ctx.capture
    if c.endpoint not in CHAT_ENDPOINTS or not c.has_text_fields or c.thinking is False or (c.reasoning or "").strip():
        return False  # only a response that returned text fields can have lost its reasoning field
    split = _id_split(ctx)
    if split is None or not split[0]:
        return False
    carried = (c.content or "") + (c.text or "")
    return split[0] not in carried


@check("reasoning_field_missing")
def _reasoning_field_missing(ctx: Context):
    if not _reasoning_unreturned(ctx):
        return None
    return (
        "The ids hold reasoning, but no text field carries it (no `reasoning` or `reasoning_content` in the "
        "response): a client reading the wrong field name gets silently empty reasoning (vLLM ≥0.16 says "
        "`reasoning`, SGLang `reasoning_content`).",
        [],
    )


@check("parser_split_mismatch")
def _split_mismatch(ctx: Context):
    c = ctx.capture
    if c.endpoint not in CHAT_ENDPOINTS or (c.reasoning is None and c.content is None) or _reasoning_unreturned(ctx):
        return None
    split = _id_split(ctx)
    if split is None:
        return None
    got = ((c.reasoning or "").strip(), (c.content or "").strip())
    if got == split:
        return None
    head = (
        f"The server split reasoning/content as {len(got[0])}/{len(got[1])} chars, the ids split them as "
        f"{len(split[0])}/{len(split[1])}"
    )
    if not ctx.profile.has_reasoning:
        return (
            head + ": the model has no think delimiters, so a reasoning parser on the server can only guess "
            "(start it without --reasoning-parser).",
            [],
        )
    return (
        head + f" at {ctx.profile.think_close}: the parser read the text differently from the ids (e.g. a "
        f"special {ctx.profile.think_close} invisible to a text parser).",
        [],
    )


@check("literal_think_text")
def _literal_think(ctx: Context):
    if ctx.tokenizer is None:
        return None
    ids = ctx.capture.input_ids
    hidden = ctx.profile.delimiter_ids
    tok = ctx.tokenizer
    pieces = [b"\x00" if tid in hidden or tok.is_special(tid) else tok.piece_bytes(tid) for tid in ids]
    buf = b"".join(pieces)
    markers = [m.encode() for m in (ctx.profile.think_open, ctx.profile.think_close) if m and m.encode() in buf]
    if not markers:
        return None  # the common case: no need to map bytes back to ids
    owner = [pos for pos, piece in enumerate(pieces) for _ in range(len(piece))]
    hits: list[int] = []
    for needle in markers:
        start = 0
        while (found := buf.find(needle, start)) != -1:
            hits.extend(sorted(set(owner[found : found + len(needle)])))
            start = found + 1
    if not hits:
        return None
    where = ", ".join(str(p) for p in hits[:12])
    detail = (
        f"{ctx.profile.think_open}/{ctx.profile.think_close} spelled as ordinary text over several ids at "
        f"positions {where}, not as the special ids {ctx.profile.think_open_id}/{ctx.profile.think_close_id}"
    )
    if all(h < ctx.n_prompt for h in hits):
        # Only in the prompt: the user's own words, or a history re-rendered as text. Worth a look, not fatal.
        return detail + ": only in the prompt (a user's words, or history rendered as text).", hits, WARN
    return detail + ": the output was re-tokenized from text or written in by hand.", hits


@check("retokenize_drift")
def _retokenize_drift(ctx: Context):
    if ctx.tokenizer is None or not ctx.output:
        return None
    again = ctx.tokenizer.encode(ctx.tokenizer.decode(ctx.output))
    if again == ctx.output:
        return None
    first = next((i for i, (a, b) in enumerate(zip(again, ctx.output)) if a != b), min(len(again), len(ctx.output)))
    return (
        f"encode(decode(output_ids)) differs from output_ids from {ctx.where(first)} ({len(ctx.output)} → "
        f"{len(again)} ids): any pipeline that stores text instead of ids trains on other tokens.",
        [ctx.n_prompt + first],
    )


@check("prompt_render_mismatch")
def _render_mismatch(ctx: Context):
    c, tok = ctx.capture, ctx.tokenizer
    if tok is None or not c.messages or not tok.chat_template:
        return None
    kwargs = c.settings.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = ctx.profile.template_kwargs(c.thinking)
    try:
        local = tok.render(c.messages, add_generation_prompt=True, template_kwargs=kwargs)
    except Exception as exc:  # a broken template is itself a mismatch worth showing
        return (f"The local chat template failed to render this conversation: {exc}", [])
    if local == list(c.prompt_ids):
        return None
    first = next((i for i, (a, b) in enumerate(zip(local, c.prompt_ids)) if a != b), min(len(local), ctx.n_prompt))
    return (
        f"The local tokenizer renders {len(local)} prompt ids, the server used {ctx.n_prompt}; they differ from "
        f"position {first}: the local template or tokenizer is not the server's.",
        [min(first, ctx.n_prompt - 1)] if ctx.n_prompt else [],
    )


@check("over_max_length")
def _over_max_length(ctx: Context):
    limit = ctx.capture.settings.get("max_length") or ctx.profile.max_length
    if not limit and ctx.tokenizer is not None:
        limit = ctx.tokenizer.model_max_length
    total = ctx.n_prompt + len(ctx.output)
    if not limit or total <= limit:
        return None
    return (
        f"prompt + output is {total} ids, over the {limit}-id limit: trainers will truncate or drop it.",
        [limit] if limit < total else [],
    )


@check("off_policy")
def _off_policy(ctx: Context):
    """From `tokview score`: the target's mean NLL over the output, against the threshold it was scored with."""
    from tokview.core import logprobs as lp

    score, values = ctx.capture.target_score, ctx.capture.target_logprobs
    if not isinstance(score, dict) or not values:
        return None
    threshold = float(score.get("off_policy_nll", lp.DEFAULT_OFF_POLICY_NLL))
    low_prob = float(score.get("low_prob", lp.DEFAULT_LOW_PROB))
    nll = lp.mean_nll(values)
    if nll is None or nll <= threshold:
        return None
    cut = math.log(low_prob)
    unlikely = [ctx.n_prompt + p for p, v in enumerate(values) if v is not None and v < cut]
    return (
        f"the target {score.get('model') or ''} finds this output unlikely: mean NLL {nll:.2f} nats/token over "
        f"{len(values)} tokens (> {threshold:g}); {len(unlikely)} tokens below p={low_prob:g}. Off-policy data "
        f"trains a drafter the target then rejects.",
        unlikely[:100],
    )


def run_checks(ctx: Context, severities: dict[str, str] | None = None) -> list[Finding]:
    """Run every registered check; `severities` overrides the default of any code."""
    found = []
    for code, fn in CHECKS.items():
        finding = fn(ctx)
        if finding is not None and severities and code in severities:
            finding = Finding(finding.code, severities[code], finding.detail, finding.positions)
        if finding is not None:
            found.append(finding)
    return found
