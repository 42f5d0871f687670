"""The Harmony findings: gpt-oss's known failures, found on the messages `harmony.parse_harmony` reads.

Apart from `harmony` so that the segments (which colour a Harmony output by its messages) never import the
findings registry; `findings` imports this module last, which registers the rules.
"""

from __future__ import annotations

import json
import weakref
from typing import TYPE_CHECKING

from tokview.core.finding_rules import CHAT_ENDPOINTS, ERROR, WARN, Hit, rule
from tokview.core.harmony import (
    CALL,
    END,
    END_NAMES,
    FUNCTIONS_ID,
    RETURN,
    HarmonyMessage,
    function_name,
    parse_harmony,
    text_bodies,
    to_function,
)
from tokview.core.profiles import HARMONY

if TYPE_CHECKING:
    from tokview.core.finding_context import Context

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


@rule("harmony_no_final", ERROR, "A Harmony turn with no final-channel message (or an empty one) and no tool call.")
def harmony_no_final(ctx: Context) -> Hit | None:
    messages = _messages(ctx)
    if messages is None or ctx.cut_by_length:
        return None
    finals = [m for m in messages if m.channel == "final"]
    if _ends_in_call(messages):
        return None
    if finals:
        if not all(ctx.blank(ctx.output[m.body[0] : m.body[1]]) for m in finals):
            return None
        return Hit.at(
            f"The final message at {ctx.where(finals[-1].start)} is empty: the turn never answers, and a drafter "
            f"would learn to stop right after the final header.",
            _abs(ctx, finals[-1].end_pos if finals[-1].end_pos is not None else finals[-1].start),
        )
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


@rule(
    "harmony_recipient_on_analysis",
    WARN,
    "A function call (to=functions.…) on the analysis channel: function calls go to commentary.",
)
def harmony_recipient_on_analysis(ctx: Context) -> Hit | None:
    # only `functions.…`: the system message says those calls go to commentary; a built-in tool's call
    # (`to=python`, `to=browser.search`) is made on the analysis channel, as the Harmony format has it
    bad = [m for m in _messages(ctx) or [] if m.channel == "analysis" and m.recipient_ids[:1] == (FUNCTIONS_ID,)]
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
    """Each call's arguments: not JSON is an error (the first one found), JSON that is no object a warning, said
    only when no call's arguments are broken (a warning returned first hid a later broken call)."""
    tok = ctx.tokenizer
    if tok is None:
        return None
    not_object: Hit | None = None
    calls = [m for m in _messages(ctx) or [] if m.recipient_ids and m.end_id == CALL and m.recipient != "python"]
    functions = 0
    for m in calls:  # (the python tool's arguments are its code, not JSON)
        k, functions = functions, functions + to_function(m)  # its place among the calls a server returns
        text = tok.decode(ctx.output[m.body[0] : m.body[1]])
        at = _abs(ctx, m.body[0] if m.body[1] > m.body[0] else m.header_end)
        try:
            value = json.loads(text)  # a UnicodeDecodeError cannot happen: the text is decoded already
        except RecursionError:  # JSON nested deeper than Python's json reads: not a call it can judge
            continue
        except json.JSONDecodeError as exc:
            said = f"The call to {m.recipient} at {ctx.where(m.start)} has arguments that are not JSON ({exc.msg} at "
            said += f"character {exc.pos}): {text[:80]!r}."
            returned = _returned_whole(ctx, m.recipient, k) if to_function(m) else None
            if returned is not None:  # the parser read a whole call: not off these ids (a stream that lost some)
                return Hit.at(
                    f"{said} Yet the server returned this call with arguments {returned[:60]!r}: its parser read other "
                    "ids than came back (a stream that lost ids on the way?); these ids would train the drafter on a "
                    "call the model never wrote.",
                    at,
                )
            return Hit.at(
                f"{said} A server returns them as this text (vLLM 0.32) or drops the call: a harness that sends the "
                "call back as history gets a prompt that does not extend these ids, or an error.",
                at,
            )
        if not isinstance(value, dict) and not_object is None:  # JSON, but no arguments a function takes
            not_object = Hit.at(
                f"The call to {m.recipient} at {ctx.where(m.start)} has arguments that are JSON but not an object "
                f"({type(value).__name__}: {text[:80]!r}): a function's arguments are an object, and the tool cannot "
                "run it.",
                at,
                severity=WARN,
            )
    return not_object


def _returned_whole(ctx: Context, recipient: str | None, k: int) -> str | None:
    """The arguments of the server's k-th returned call, when it calls this function with a JSON object: matched by
    position, as the calls come back in order (by name alone, a broken call was taken for a later one's)."""
    returned = ctx.capture.tool_calls or []
    if k >= len(returned):
        return None
    call, args = returned[k], returned[k].get("arguments")
    if call.get("name") != function_name(recipient) or not isinstance(args, str):
        return None
    try:
        return args if isinstance(json.loads(args), dict) else None
    except (json.JSONDecodeError, RecursionError):
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


def channel_texts(ctx: Context, messages: list[HarmonyMessage]) -> list[tuple[str, str]] | None:
    """(reasoning text, content text) decoded from the ids as a server's Harmony parser returns them
    (`harmony.text_bodies`), each message's text joined by a newline (vLLM) or by nothing (SGLang, the simulator):
    either is the server's reading of these ids. A call's arguments are neither (an analysis message to a function
    was counted as reasoning text)."""
    tok = ctx.tokenizer
    if tok is None:
        return None
    reasoning, content = text_bodies(messages)
    parts = [[t for t in (tok.decode(ctx.output[a:b]) for a, b in side) if t] for side in (reasoning, content)]
    return [(glue.join(parts[0]).strip(), glue.join(parts[1]).strip()) for glue in ("\n", "")]


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
    readings = channel_texts(ctx, messages)
    got = ((c.reasoning or "").strip(), (c.content or "").strip())
    if readings is None or got in readings:
        return None
    texts = readings[0]
    finals = [m for m in messages if m.channel == "final"]
    at = finals[0].start if finals else messages[0].start
    return Hit.at(
        f"The server split reasoning/content as {len(got[0])}/{len(got[1])} chars, the channels as "
        f"{len(texts[0])}/{len(texts[1])}: the parser read the channels differently from the ids (a header it "
        f"did not recognise, a final it put into reasoning).",
        _abs(ctx, at),
    )


# A date-stamping template's prompt that differs only by its date (gpt-oss's above all): registered here, after
# prompt_render_mismatch, since `findings` imports this module last.
from tokview.core import prompt_dates as _prompt_dates  # noqa: E402, F401
