"""`control_text_in_messages`: a message whose text spells a control token (`<|im_end|>`, `</think>`).

Why: both servers tokenize a rendered prompt with its added tokens read out of the text, so a tool result that
quotes a tokenizer's config, a web page about chat templates or a user pasting a transcript puts a real `<|im_end|>`
id in the middle of that message: the model saw the turn end there. The ids stay exact (they are what was served),
but the prompt's structure is no longer what the messages say, and a harness may want to escape such text. Nothing
else tells: the local render (`prompt_render_mismatch`) reads the text the same way.

The texts are found with a regular expression per first character of the tokenizer's added tokens (`<`, `[`), each
its tokens as a trie (`<|` then the rest): a pattern that opens with a literal is searched for in C at memchr speed
(150 kB of prose: 0.08 ms, where one pattern opening with `<` or `[` tried every position: 0.9 ms), and a page of
code or HTML, whose every `<` is a candidate, is still read in one pass (~1 ms for 150 kB).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokview.core.finding_rules import WARN, Hit, rule

if TYPE_CHECKING:
    from tokview.core.finding_context import Context
    from tokview.core.tokenizer import TokenizerAdapter

SHOWN = 5
"""How many spelled control tokens a finding names."""


@dataclass(frozen=True)
class ControlTexts:
    """The added tokens a text can spell, and the regular expressions that find them (by first character)."""

    patterns: tuple[tuple[str, re.Pattern[str]], ...]
    ids: dict[str, int]

    def find(self, text: str) -> Iterator[re.Match[str]]:
        for first, pattern in self.patterns:
            if first in text:
                yield from pattern.finditer(text)


_found: weakref.WeakKeyDictionary[object, ControlTexts | None] = weakref.WeakKeyDictionary()


def control_texts(tokenizer: TokenizerAdapter) -> ControlTexts | None:
    """The tokenizer's added tokens that text can spell (markup of 3 or more characters, not a plain word), once per
    tokenizer; None when it has none."""
    if tokenizer in _found:
        return _found[tokenizer]
    _, added = tokenizer.described_tokens()
    ids = {text: i for i, (text, _special) in added.items() if len(text) >= 3 and not text.isalnum() and text.strip()}
    by_first: dict[str, list[str]] = {}
    for text in sorted(ids):
        by_first.setdefault(text[0], []).append(text)
    patterns = tuple((first, re.compile(_trie(words))) for first, words in by_first.items())
    found = ControlTexts(patterns, ids) if ids else None
    _found[tokenizer] = found
    return found


def _trie(words: list[str]) -> str:
    """A regular expression matching any of `words`, longest first, as a trie: at each character only the words
    that go on from it are tried (an alternation of 256 words tried each at every `<` of a page of code)."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = True

    def emit(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + emit(sub) for ch, sub in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if "" in node:  # a word ends here, and longer ones go on: the longer one if it is there
            return f"(?:{body})?"
        return body

    return emit(root)


def _texts(message: object) -> Iterator[tuple[str, str]]:
    """(where, text) of every text a message sends: its content (or text parts), its reasoning and its calls'
    arguments."""
    if not isinstance(message, dict):
        return
    content = message.get("content")
    if isinstance(content, str):
        yield "content", content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield "content", part["text"]
    for key in ("reasoning_content", "reasoning"):
        if isinstance(message.get(key), str):
            yield key, message[key]
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            yield "tool call arguments", function["arguments"]


@rule(
    "control_text_in_messages",
    WARN,
    "A message's text spells a control token (<|im_end|>, </think>): the server reads it as that id, so the prompt's "
    "structure is not what the messages say.",
)
def control_text_in_messages(ctx: Context) -> Hit | None:
    messages = ctx.capture.messages
    if not messages or ctx.tokenizer is None:
        return None
    texts = control_texts(ctx.tokenizer)
    if texts is None:
        return None
    spelled: list[tuple[int, str, str, str, str]] = []  # (message, role, field, token text, the text before it)
    for k, message in enumerate(messages):
        for where, text in _texts(message):
            for match in texts.find(text):
                role = str(message.get("role")) if isinstance(message, dict) else "?"
                spelled.append((k, role, where, match.group(), text[: match.start()]))
    if not spelled:
        return None
    positions = sorted({p for *_, token, before in spelled for p in _placed(ctx, texts.ids[token], before)})
    if not positions:  # the prompt holds none of these ids (a server that escapes them): nothing was misread
        return None
    said = "; ".join(
        f"message {k + 1} ({role}) {where} spells {token} (id {texts.ids[token]})"
        for k, role, where, token, _ in spelled[:SHOWN]
    )
    more = f" and {len(spelled) - SHOWN} more" if len(spelled) > SHOWN else ""
    return Hit.at(
        f"{said}{more}: the server's tokenizer reads such text as the control id, so the model saw that message "
        "end, or a turn begin, where the text only quoted it. The ids are what was served; escape such text in the "
        "harness if the model should read it as text.",
        positions,
    )


def _placed(ctx: Context, token_id: int, before: str) -> list[int]:
    """The prompt positions of `token_id` that a spelled token stands at: those whose ids just before decode to the
    end of the text before it (every position of the id when none does, or when the token opens its text)."""
    prompt = ctx.capture.prompt_ids
    at = [p for p, t in enumerate(prompt) if t == token_id]
    tail = before[-12:]
    if not tail.strip() or ctx.tokenizer is None:
        return at
    decode = ctx.tokenizer.decode

    def follows(p: int) -> bool:  # the ids before it end as the text before it does (as far as both reach)
        said = decode(prompt[max(0, p - 12) : p], skip_special_tokens=False)
        k = min(len(said), len(tail))
        return k >= min(3, len(tail)) and said[-k:] == tail[-k:]

    placed = [p for p in at if follows(p)]
    return placed or at
