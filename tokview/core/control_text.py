"""`control_text_in_messages`: a message whose text spells a control token (`<|im_end|>`, `</think>`).

Why: both servers tokenize a rendered prompt with its added tokens read out of the text, so a tool result that
quotes a tokenizer's config, a web page about chat templates or a user pasting a transcript puts a real `<|im_end|>`
id in the middle of that message: the model saw the turn end there. The ids stay exact (they are what was served),
but the prompt's structure is no longer what the messages say, and a harness may want to escape such text. Nothing
else tells: the local render (`prompt_render_mismatch`) reads the text the same way.

A spelled token is a finding only where it became its id: a position of that id whose ids either side decode to
the text either side of it (`_Placer`). A template that dropped the text (an earlier turn's reasoning) or a server
that encoded it as text leaves no such position, and the template's own ids of that kind are never named.

The texts are found with a regular expression per first character of the tokenizer's added tokens (`<`, `[`), each
its tokens as a trie (`<|` then the rest): a pattern that opens with a literal is searched for in C at memchr speed
(150 kB of prose: 0.003 ms, where one pattern opening with `<` or `[` tried every position: 0.9 ms; 150 kB of HTML,
whose every `<` is a candidate: 0.3 ms). At most `PLACED_MAX` spelled tokens are placed, each from the 12 characters
either side of it and one pass over the prompt (a 70 kB pasted log of 1,600 spelled tokens: 13 ms).
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
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter

SHOWN = 5
"""How many spelled control tokens a finding names."""


@dataclass(frozen=True)
class ControlTexts:
    """The added tokens a text can spell, and the regular expressions that find them (by first character)."""

    patterns: tuple[tuple[str, re.Pattern[str]], ...]
    ids: dict[str, int]

    def find(self, text: str) -> list[re.Match[str]]:
        """Every spelled token of `text`, in text order."""
        found = [m for first, pattern in self.patterns if first in text for m in pattern.finditer(text)]
        return sorted(found, key=lambda m: m.start()) if len(self.patterns) > 1 else found


_found: weakref.WeakKeyDictionary[object, dict[frozenset[int], ControlTexts | None]] = weakref.WeakKeyDictionary()


def control_texts(tokenizer: TokenizerAdapter, profile: ModelProfile | None = None) -> ControlTexts | None:
    """The added tokens whose text, spelled in a message, would be read as structure, once per tokenizer and
    profile; None when there are none. Those are its special tokens, any `<|…|>` token, and the profile's think and
    tool-call markers (Qwen3's `<think>` and `<tool_call>` are added tokens marked not special). An added token that
    is ordinary markup (Gemma's `<table>`, `<h1>`) is how that tokenizer reads HTML, not a misread."""
    markers = frozenset(_marker_ids(profile))
    per_profile = _found.setdefault(tokenizer, {})
    if markers in per_profile:
        return per_profile[markers]
    _, added = tokenizer.described_tokens()
    ids = {
        text: i
        for i, (text, special) in added.items()
        if len(text) >= 3
        and text.strip() == text
        and not text.isalnum()
        and (special or i in markers or (text.startswith("<|") and text.endswith("|>")))
    }
    by_first: dict[str, list[str]] = {}
    for text in sorted(ids):
        by_first.setdefault(text[0], []).append(text)
    patterns = tuple((first, re.compile(_trie(words))) for first, words in by_first.items())
    found = ControlTexts(patterns, ids) if ids else None
    per_profile[markers] = found
    return found


def _marker_ids(profile: ModelProfile | None) -> list[int]:
    if profile is None:
        return []
    ids = [profile.think_open_id, profile.think_close_id]
    if profile.tool_calls is not None:
        ids += [i for _, i, _ in profile.tool_calls.named_ids()]
    return [i for i in ids if i is not None]


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
    texts = control_texts(ctx.tokenizer, ctx.profile)
    if texts is None:
        return None
    spelled: list[Spelled] = []
    for k, message in enumerate(messages):
        for where, text in _texts(message):
            for match in texts.find(text):
                role = str(message.get("role")) if isinstance(message, dict) else "?"
                start, end = match.span()
                spelled.append(
                    Spelled(k, role, where, match.group(), text[max(0, start - 12) : start], text[end : end + 12])
                )
                if len(spelled) >= PLACED_MAX:
                    break
    if not spelled:
        return None
    placed = _Placer(ctx, texts)
    found = [(s, p) for s in spelled if (p := placed.at(s)) is not None]
    if not found:  # no spelled text is where an id of it stands: the template dropped it, or the server escaped it
        return None
    said = "; ".join(
        f"message {s.message + 1} ({s.role}) {s.field} spells {s.token} (id {texts.ids[s.token]})"
        for s, _ in found[:SHOWN]
    )
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    return Hit.at(
        f"{said}{more}: the server's tokenizer read such text as the control id, so the model saw that message "
        "end, or a turn begin, where the text only quoted it. The ids are what was served; escape such text in the "
        "harness if the model should read it as text.",
        sorted({p for _, p in found}),
    )


PLACED_MAX = 64
"""How many spelled tokens a finding looks for in the prompt (a log pasted whole may spell thousands)."""


@dataclass(frozen=True)
class Spelled:
    """One control token a message's text spells, with the text either side of it (up to 12 characters)."""

    message: int
    role: str
    field: str
    token: str
    before: str
    after: str


class _Placer:
    """Where in the prompt each spelled token became its id: a position of that id whose ids on either side decode
    to the text either side of the spelled token. None where none does: the template dropped the text (Qwen3 and
    GLM drop earlier turns' reasoning), or the server encoded it as text (no id stands for it): nothing was misread,
    and the template's own ids of that kind are no finding. Each position is taken once, in message order."""

    WINDOW = 12

    def __init__(self, ctx: Context, texts: ControlTexts) -> None:
        self.prompt = ctx.capture.prompt_ids
        wanted = set(texts.ids.values())
        self.where: dict[int, list[int]] = {}
        for p, t in enumerate(self.prompt):  # one pass, whatever the number of spelled tokens
            if t in wanted:
                self.where.setdefault(t, []).append(p)
        self.ids = texts.ids
        self.decode = ctx.tokenizer.decode if ctx.tokenizer is not None else None
        self.taken: set[int] = set()
        self._sides: dict[int, tuple[str, str]] = {}

    def _side(self, p: int) -> tuple[str, str]:
        known = self._sides.get(p)
        if known is None and self.decode is not None:
            w = self.WINDOW
            known = self._sides[p] = (
                self.decode(self.prompt[max(0, p - w) : p], skip_special_tokens=False),
                self.decode(self.prompt[p + 1 : p + 1 + w], skip_special_tokens=False),
            )
        return known or ("", "")

    def at(self, s: Spelled) -> int | None:
        if not (s.before.strip() or s.after.strip()):  # nothing either side to tell its place by
            return None
        for p in self.where.get(self.ids[s.token], ()):
            if p in self.taken:
                continue
            before, after = self._side(p)
            if _agrees(before, s.before, tail=True) and _agrees(after, s.after, tail=False):
                self.taken.add(p)
                return p
        return None


def _agrees(decoded: str, text: str, *, tail: bool) -> bool:
    """Whether ids decoded beside a position read as the text beside the spelled token, as far as both reach (the
    ends that touch the token): `tail` compares the ends of both, else their starts. Empty text agrees with
    anything (the token opened or closed its text; the other side decides)."""
    k = min(len(decoded), len(text))
    if not text:
        return True
    if k < min(3, len(text)):
        return False
    return decoded[-k:] == text[-k:] if tail else decoded[:k] == text[:k]
