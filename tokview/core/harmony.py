"""gpt-oss's Harmony format, read on the ids: messages, their channels, headers and end tokens.

A Harmony completion is a run of messages, not think tags. The generation prompt ends
`<|start|>assistant`, so the output begins inside the first message's header:
`<|channel|>analysis<|message|>…<|end|>`, then `<|start|>assistant<|channel|>final<|message|>…<|return|>`,
or a call `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`. The channel
names are ordinary text ids (o200k: `analysis` 35644, `commentary` 12606 815, `final` 17196), matched here
as ids so the segments need no tokenizer; the recipient and constraint are decoded when one is given.

`parse_harmony` splits the output into `HarmonyMessage`s; `segments.harmony_kinds` gives every id a segment kind
(a header id, an id of an analysis / commentary / final body, a message's end token); the `@rule` checks
(`harmony_findings`) find the known failures (malformed headers, no final, analysis after final, a recipient on the
analysis channel, invalid call JSON, the wrong end token, a parser split other than the channels) and live
in `harmony_findings`, so the segments can read the messages without importing the findings registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
    to_spans: list[tuple[int, int]] = field(default_factory=list)
    """Where the header's text may name a recipient ([start, end) output positions: the role's text and what follows
    the channel name), for `_glued_recipient` to read with a tokenizer."""


def _channel_of(ids: Sequence[int]) -> str | None:
    """The channel a header's text after `<|channel|>` names: its first ids, whatever follows them (a recipient
    ` to=…`, a space, or the content type: gpt-oss's own template writes `commentary json` with no `<|constrain|>`)."""
    for name, want in CHANNEL_IDS.items():
        if tuple(ids[: len(want)]) == want:
            return name
    return None


def _recipient_in(header_text: Sequence[int]) -> tuple[int, ...]:
    """The recipient's ids in a header's text: what follows ` to=` (in the role text, as gpt-oss's template writes a
    call in history, or after the channel name), spaces dropped; () when the text names none."""
    text = list(header_text)
    for k in range(len(text) - 1):
        if (text[k], text[k + 1]) == _TO_IDS:
            return tuple(t for t in text[k + 2 :] if t != 220)
    return ()


def _glued_recipient(output: Sequence[int], spans: Sequence[tuple[int, int]], tokenizer: TokenizerAdapter) -> int:
    """Where a recipient whose first id holds its `=` starts (-1: none). o200k encodes `to=get_weather` as ` to`,
    `=get`, `_weather`, and gpt-oss writes a header as its tokenizer does, so a bare recipient (vLLM reads it as a
    function call, its heuristic fallback) never shows the ` to` `=` pair `_recipient_in` finds on ids alone."""
    for start, end in spans:
        for k in range(start, end - 1):
            if output[k] == _TO_IDS[0] and len(piece := tokenizer.decode([output[k + 1]])) > 1 and piece[0] == "=":
                return k + 1
    return -1


def _header(output: Sequence[int], at: int, role_at: int) -> tuple[int, HarmonyMessage]:
    """Read one header starting at `at` (its role text from `role_at`); returns the position after `<|message|>`
    (or where it stopped)."""
    msg = HarmonyMessage(start=at, header_end=at, body=(at, at), end_pos=None)
    i, n = at, len(output)
    while i < n and output[i] not in (CHANNEL, MESSAGE, START) and output[i] not in END_IDS:
        if output[i] == CONSTRAIN:
            msg.problems.append(("<|constrain|> before the channel", i))
        i += 1
    msg.recipient_ids = _recipient_in(output[role_at:i])  # `assistant to=functions.f<|channel|>…`: the role names it
    msg.to_spans.append((role_at, i))
    if i < n and output[i] == CHANNEL:
        j = i + 1
        while j < n and output[j] not in (CONSTRAIN, MESSAGE, START, CHANNEL) and output[j] not in END_IDS:
            j += 1
        text = list(output[i + 1 : j])
        msg.channel = _channel_of(text)
        if msg.channel is None:
            msg.problems.append(("a channel name Harmony does not have", i))
        rest = text[len(CHANNEL_IDS[msg.channel]) :] if msg.channel else []
        msg.recipient_ids = _recipient_in(rest) or msg.recipient_ids
        msg.to_spans.append((i + 1 + len(text) - len(rest), j))
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
        role_at = i
        if messages:  # after an end token: `<|start|>` must come next
            if out[i] != START:
                what = {CONSTRAIN: "<|constrain|>", CALL: "<|call|>"}.get(out[i], f"id {out[i]}")
                messages[-1].problems.append((f"{what} where <|start|> is expected after a message's end", i))
            else:
                i += 1
                role_at = i
                while i < n and out[i] not in (CHANNEL, MESSAGE, START) and out[i] not in END_IDS:
                    i += 1  # the role (`assistant`), ordinary text: `_header` reads a recipient there
        body_start, msg = _header(out, i, role_at)
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
        for msg in messages:  # the recipient ends at a space: `to=python code` names python, its content type code
            if not msg.recipient_ids and (at := _glued_recipient(out, msg.to_spans, tokenizer)) >= 0:
                span_end = next(end for start, end in msg.to_spans if start <= at < end)
                msg.recipient_ids = tuple(t for t in out[at:span_end] if t != 220)
            words = tokenizer.decode(list(msg.recipient_ids)).removeprefix("=").split() if msg.recipient_ids else []
            msg.recipient = words[0] if words else None
            msg.constraint = tokenizer.decode(list(msg.constraint_ids)).strip() if msg.constraint_ids else None
    return messages


FUNCTIONS_ID = 44580
"""o200k's `functions` (after ` to=`): the recipient of a function call, `functions.NAME`."""


def calls_of(messages: Sequence[HarmonyMessage]) -> list[HarmonyMessage]:
    """The messages that call a function: a recipient `functions.…` (in the role or after the channel), ended by
    `<|call|>`, as vLLM's openai tool parser takes them; a built-in tool's call (`python`, `browser.…`) is not one."""
    return [m for m in messages if m.recipient_ids[:1] == (FUNCTIONS_ID,) and m.end_id == CALL]


def function_name(recipient: str | None) -> str:
    """The tool's name as the OpenAI `tool_calls` give it: `functions.get_weather` → `get_weather`."""
    name = recipient or ""
    return name.removeprefix("functions.")


BUILTIN_TOOLS = ("python", "browser", "container")
"""gpt-oss's built-in tools: a recipient of theirs (`browser.search`) is no function call (vLLM's
`BUILTIN_TOOL_TO_MCP_SERVER_LABEL`)."""


def to_function(m: HarmonyMessage) -> bool:
    """Whether the message is a function call as vLLM 0.32's chat path reads its recipient (`is_function_recipient`):
    `functions.NAME`, and any other recipient but `assistant`, a built-in tool's, or a special token (its "heuristic
    fallback": `to=get_weather` is a call too)."""
    if m.recipient_ids[:1] == (FUNCTIONS_ID,):
        return True
    name = m.recipient
    if not name or name.startswith("<|") or name == "assistant":
        return False
    return name.split(".", 1)[0] not in BUILTIN_TOOLS


def text_bodies(messages: Sequence[HarmonyMessage]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(the bodies read as reasoning, the bodies read as content), in order, as vLLM's Harmony parser sorts the
    messages (`parser/harmony.py`, 0.32): a message to a function (`to_function`) is a call, never text; the
    analysis channel is reasoning; the final channel and a commentary with no recipient (a preamble before a call:
    "Let me look that up.") are content. vLLM joins each side's non-empty texts with a newline. The preamble was
    read as nothing: a text export dropped it, and a server's content holding it read as a parser's mistake. Empty
    bodies are left out here; a message whose text decodes empty is the caller's to drop."""
    reasoning: list[tuple[int, int]] = []
    content: list[tuple[int, int]] = []
    for m in messages:
        if to_function(m) or m.body[1] <= m.body[0]:
            continue
        if m.channel == "analysis":
            reasoning.append(m.body)
        elif m.channel == "final" or (m.channel == "commentary" and not m.recipient_ids):
            content.append(m.body)
    return reasoning, content
