"""gpt-oss's Harmony format, read on the ids: messages, their channels, headers and end tokens.

A Harmony completion is a run of messages, not think tags. The generation prompt ends
`<|start|>assistant`, so the output begins inside the first message's header:
`<|channel|>analysis<|message|>…<|end|>`, then `<|start|>assistant<|channel|>final<|message|>…<|return|>`,
or a call `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`. The channel
names are ordinary text ids (o200k: `analysis` 35644, `commentary` 12606 815, `final` 17196), matched here
as ids so the segments need no tokenizer; the recipient and constraint are decoded when one is given.

`parse_harmony` splits the output into `HarmonyMessage`s; `harmony_kinds` gives every id a segment kind
(a header id, an id of an analysis / commentary / final body, a message's end token); the `@rule` checks
below find the known failures (malformed headers, no final, analysis after final, a recipient on the
analysis channel, invalid call JSON, the wrong end token, a parser split other than the channels).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tokview.core import segments as seg
from tokview.core.findings import CHAT_ENDPOINTS, ERROR, WARN, Hit, rule
from tokview.core.profiles import HARMONY, ModelProfile

if TYPE_CHECKING:
    from tokview.core.finding_context import Context
    from tokview.core.tokenizer import TokenizerAdapter

RETURN, CONSTRAIN, CHANNEL, START, END, MESSAGE, CALL = 200002, 200003, 200005, 200006, 200007, 200008, 200012
END_IDS = frozenset((RETURN, END, CALL))
END_NAMES = {RETURN: "<|return|>", END: "<|end|>", CALL: "<|call|>"}
CHANNEL_IDS = {"analysis": (35644,), "commentary": (12606, 815), "final": (17196,)}
"""o200k_harmony's ids of each channel name (the header text right after `<|channel|>`)."""
_TO_IDS = (316, 28)  # " to" "=": where a recipient follows the channel name


@dataclass
class HarmonyMessage:
    """One message of the output. Positions are output-relative; `body` is [start, end)."""

    start: int
    """The first id of the header (the output's first id, or the id after `<|start|>`)."""
    header_end: int
    """Where the header stops: the position of `<|message|>`, or of what cut it short."""
    body: tuple[int, int]
    end_pos: int | None
    """The position of the end token (`<|end|>`, `<|return|>`, `<|call|>`); None: the output stopped first."""
    channel: str | None = None
    has_message: bool = True
    problems: list[tuple[str, int]] = field(default_factory=list)
    """(what is wrong with the header, output position): a missing channel, a misplaced token, no `<|message|>`."""
    recipient_ids: tuple[int, ...] = ()
    constraint_ids: tuple[int, ...] = ()
    recipient: str | None = None
    constraint: str | None = None
    end_id: int | None = None


def _channel_of(ids: Sequence[int]) -> str | None:
    for name, want in CHANNEL_IDS.items():
        if tuple(ids[: len(want)]) == want and (len(ids) == len(want) or ids[len(want)] in (_TO_IDS[0], 220)):
            return name
    return None


def _header(output: Sequence[int], at: int) -> tuple[int, HarmonyMessage]:
    """Read one header starting at `at`; returns the position after `<|message|>` (or where it stopped)."""
    msg = HarmonyMessage(start=at, header_end=at, body=(at, at), end_pos=None)
    i, n = at, len(output)
    while i < n and output[i] not in (CHANNEL, MESSAGE, START) and output[i] not in END_IDS:
        if output[i] == CONSTRAIN:
            msg.problems.append(("<|constrain|> before the channel", i))
        i += 1
    if i < n and output[i] == CHANNEL:
        j = i + 1
        while j < n and output[j] not in (CONSTRAIN, MESSAGE, START, CHANNEL) and output[j] not in END_IDS:
            j += 1
        text = list(output[i + 1 : j])
        msg.channel = _channel_of(text)
        if msg.channel is None:
            msg.problems.append(("a channel name Harmony does not have", i))
        rest = text[len(CHANNEL_IDS[msg.channel]) :] if msg.channel else []
        if rest[:2] == list(_TO_IDS):
            msg.recipient_ids = tuple(t for t in rest[2:] if t != 220)
        if j < n and output[j] == CONSTRAIN:
            k = j + 1
            while k < n and output[k] not in (MESSAGE, START, CHANNEL, CONSTRAIN) and output[k] not in END_IDS:
                k += 1
            msg.constraint_ids = tuple(output[j + 1 : k])
            j = k
        i = j
    else:
        msg.problems.append(("no <|channel|> in the header", min(i, n - 1)))
    msg.header_end = i
    if i < n and output[i] == MESSAGE:
        return i + 1, msg
    msg.has_message = False
    msg.problems.append(("no <|message|> after the header", min(i, n - 1)))
    return i, msg


def parse_harmony(output: Sequence[int], tokenizer: TokenizerAdapter | None = None) -> list[HarmonyMessage]:
    """The output's messages. The first header starts at output[0] (the prompt ended `<|start|>assistant`);
    every later message must start with `<|start|>` after the previous end token."""
    out = output if isinstance(output, list) else list(output)
    messages: list[HarmonyMessage] = []
    i, n = 0, len(out)
    while i < n:
        if messages:  # after an end token: `<|start|>` must come next
            if out[i] != START:
                what = {CONSTRAIN: "<|constrain|>", CALL: "<|call|>"}.get(out[i], f"id {out[i]}")
                messages[-1].problems.append((f"{what} where <|start|> is expected after a message's end", i))
            else:
                i += 1
                while i < n and out[i] not in (CHANNEL, MESSAGE, START) and out[i] not in END_IDS:
                    i += 1  # the role (`assistant`), ordinary text
        body_start, msg = _header(out, i)
        k = body_start
        while k < n and out[k] not in END_IDS and out[k] != START:
            k += 1
        msg.body = (body_start, k)
        if k < n and out[k] in END_IDS:
            msg.end_pos, msg.end_id = k, out[k]
            k += 1
        elif k < n:  # a <|start|> cut the message before any end token
            msg.problems.append(("no end token before <|start|>", k))
        messages.append(msg)
        i = k  # at an id past this message, or at the <|start|> the next turn of the loop reads
    if tokenizer is not None:
        for msg in messages:
            msg.recipient = tokenizer.decode(list(msg.recipient_ids)).strip() if msg.recipient_ids else None
            msg.constraint = tokenizer.decode(list(msg.constraint_ids)).strip() if msg.constraint_ids else None
    return messages


CHANNEL_KIND = {"analysis": seg.ANALYSIS, "commentary": seg.COMMENTARY, "final": seg.FINAL}


def harmony_kinds(prompt_ids: Sequence[int], output_ids: Sequence[int], profile: ModelProfile) -> list[str]:
    """The segment kind of every id: prompt, header ids, each channel's body, end tokens (the last one a
    stop when it is one of the profile's stop ids)."""
    kinds = [seg.PROMPT] * len(prompt_ids)
    out = output_ids if isinstance(output_ids, list) else list(output_ids)
    body = [seg.HARMONY_HEADER] * len(out)
    for msg in parse_harmony(out):
        kind = CHANNEL_KIND.get(msg.channel or "", seg.COMMENTARY)
        body[msg.body[0] : msg.body[1]] = [kind] * (msg.body[1] - msg.body[0])
        if msg.end_pos is not None:
            body[msg.end_pos] = seg.MESSAGE_END
    if out and out[-1] in profile.stop_ids and body[-1] == seg.MESSAGE_END:
        body[-1] = seg.STOP
    return kinds + body


# -- findings ------------------------------------------------------------------------------------

_parsed: weakref.WeakKeyDictionary[Context, list[HarmonyMessage]] = weakref.WeakKeyDictionary()


def _messages(ctx: Context) -> list[HarmonyMessage] | None:
    if ctx.profile.format != HARMONY or not ctx.output:
        return None
    found = _parsed.get(ctx)
    if found is None:
        found = _parsed[ctx] = parse_harmony(ctx.output, ctx.tokenizer)
    return found


def _abs(ctx: Context, *out_positions: int) -> list[int]:
    return [ctx.n_prompt + p for p in out_positions]


@rule(
    "harmony_malformed_header",
    ERROR,
    "A Harmony header without its channel or <|message|>, or <|constrain|>/<|call|> out of place: parsers fail.",
)
def harmony_malformed_header(ctx: Context) -> Hit | None:
    messages = _messages(ctx)
    problems = [(m, what, p) for m in messages or [] for what, p in m.problems]
    if not problems:
        return None
    listed = "; ".join(f"{what} at {ctx.where(p)}" for _, what, p in problems[:6])
    return Hit.at(
        f"{len(problems)} malformed Harmony header(s): {listed}. vLLM's and llama.cpp's Harmony parsers raise "
        f"or drop the message (HarmonyError).",
        sorted(set(_abs(ctx, *(p for _, _, p in problems)))),
    )


def _ends_in_call(messages: list[HarmonyMessage]) -> bool:
    return bool(messages) and messages[-1].end_id == CALL


@rule("harmony_no_final", ERROR, "A Harmony turn with no final-channel message and no tool call: no answer.")
def harmony_no_final(ctx: Context) -> Hit | None:
    messages = _messages(ctx)
    if messages is None or ctx.capture.finish_reason == "length":
        return None
    if any(m.channel == "final" for m in messages) or _ends_in_call(messages):
        return None
    channels = ", ".join(m.channel or "?" for m in messages)
    return Hit.missing(
        f"The output's {len(messages)} message(s) ({channels}) hold no final-channel message and end in no "
        f"tool call: the turn never answers (the missing final header seen under EAGLE-3)."
    )


@rule("harmony_analysis_after_final", WARN, "An analysis message after the final answer: the turn reasons on.")
def harmony_analysis_after_final(ctx: Context) -> Hit | None:
    messages = _messages(ctx) or []
    finals = [i for i, m in enumerate(messages) if m.channel == "final"]
    late = [m for m in messages[finals[0] + 1 :] if m.channel == "analysis"] if finals else []
    if not late:
        return None
    return Hit.at(
        f"{len(late)} analysis message(s) after the final message, the first at {ctx.where(late[0].start)}: "
        f"a chat parser puts them into reasoning, out of order with the answer.",
        _abs(ctx, *(m.start for m in late)),
    )


@rule("harmony_recipient_on_analysis", WARN, "A recipient (to=…) on the analysis channel: tool calls go to commentary.")
def harmony_recipient_on_analysis(ctx: Context) -> Hit | None:
    bad = [m for m in _messages(ctx) or [] if m.channel == "analysis" and m.recipient_ids]
    if not bad:
        return None
    name = bad[0].recipient or " ".join(map(str, bad[0].recipient_ids))
    return Hit.at(
        f"The analysis message at {ctx.where(bad[0].start)} names a recipient ({name}): calls belong on the "
        f"commentary channel; parsers either miss the call or leak it into reasoning.",
        _abs(ctx, *(m.start for m in bad)),
    )


@rule("harmony_tool_json_invalid", ERROR, "A Harmony tool call whose arguments are not valid JSON.")
def harmony_tool_json_invalid(ctx: Context) -> Hit | None:
    tok = ctx.tokenizer
    if tok is None:
        return None
    for m in _messages(ctx) or []:
        if not m.recipient_ids or m.end_id != CALL:
            continue
        text = tok.decode(ctx.output[m.body[0] : m.body[1]])
        try:
            json.loads(text)  # a UnicodeDecodeError cannot happen: the text is decoded already
        except json.JSONDecodeError as exc:
            return Hit.at(
                f"The call to {m.recipient} at {ctx.where(m.start)} has arguments that are not JSON ({exc.msg} at "
                f"character {exc.pos}): {text[:80]!r}. The server's tool parser drops or rejects it.",
                _abs(ctx, m.body[0] if m.body[1] > m.body[0] else m.header_end),
            )
    return None


def _due_end(m: HarmonyMessage, last: bool) -> int:
    if m.recipient_ids:
        return CALL
    if m.channel == "final" and last:
        return RETURN
    return END


@rule("harmony_wrong_end_token", ERROR, "A Harmony message ends with the wrong token (<|return|>, <|end|>, <|call|>).")
def harmony_wrong_end_token(ctx: Context) -> Hit | None:
    messages = _messages(ctx) or []
    wrong = []
    for k, m in enumerate(messages):
        if m.end_pos is None or m.end_id is None:
            continue
        due = _due_end(m, k == len(messages) - 1)
        if m.end_id != due:
            wrong.append((m, due))
    if not wrong:
        return None
    m, due = wrong[0]
    assert m.end_pos is not None and m.end_id is not None
    what = f"a call to {m.recipient}" if m.recipient_ids else f"the {m.channel or '?'} message"
    return Hit.at(
        f"{what} ends with {END_NAMES[m.end_id]} at {ctx.where(m.end_pos)}, not {END_NAMES[due]}"
        f"{' (and ' + str(len(wrong) - 1) + ' more)' if len(wrong) > 1 else ''}: the last final ends "
        f"<|return|>, a call <|call|>, every other message <|end|>.",
        _abs(ctx, *(w.end_pos for w, _ in wrong if w.end_pos is not None)),
    )


def channel_texts(ctx: Context, messages: list[HarmonyMessage]) -> tuple[str, str] | None:
    """(analysis text, final text) decoded from the ids, as vLLM's openai_gptoss parser returns them."""
    tok = ctx.tokenizer
    if tok is None:
        return None
    analysis = "".join(tok.decode(ctx.output[m.body[0] : m.body[1]]) for m in messages if m.channel == "analysis")
    final = "".join(tok.decode(ctx.output[m.body[0] : m.body[1]]) for m in messages if m.channel == "final")
    return analysis.strip(), final.strip()


@rule(
    "harmony_split_mismatch",
    WARN,
    "The server's reasoning/content differ from the analysis/final channels on the ids.",
)
def harmony_split_mismatch(ctx: Context) -> Hit | None:
    c = ctx.capture
    messages = _messages(ctx)
    if messages is None or c.endpoint not in CHAT_ENDPOINTS or (c.reasoning is None and c.content is None):
        return None
    if ctx.paths_diverge:
        return None  # the text fields describe another generation: dual_divergence says so
    texts = channel_texts(ctx, messages)
    got = ((c.reasoning or "").strip(), (c.content or "").strip())
    if texts is None or got == texts:
        return None
    finals = [m for m in messages if m.channel == "final"]
    at = finals[0].start if finals else messages[0].start
    return Hit.at(
        f"The server split reasoning/content as {len(got[0])}/{len(got[1])} chars, the channels as "
        f"{len(texts[0])}/{len(texts[1])}: the parser read the channels differently from the ids (a header it "
        f"did not recognise, a final it put into reasoning).",
        _abs(ctx, at),
    )
