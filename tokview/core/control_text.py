"""`control_text_in_messages`: a message whose text spells a control token (`<|im_end|>`, `</think>`).

Why: both servers tokenize a rendered prompt with its added tokens read out of the text, so a tool result that
quotes a tokenizer's config, a web page about chat templates or a user pasting a transcript puts a real `<|im_end|>`
id in the middle of that message: the model saw the turn end there. The ids stay exact (they are what was served),
but the prompt's structure is no longer what the messages say, and a harness may want to escape such text. Nothing
else tells: the local render (`prompt_render_mismatch`) reads the text the same way.

A spelled token is a finding only where it became its id: where its message's text, read on the prompt's bytes,
has the control id at that very byte (`_Placer`). A template that dropped the text (an earlier turn's reasoning) or a
server that encoded it as text leaves no such id, and the template's own ids of that kind are never named.

The texts are found with a regular expression per first character of the tokenizer's added tokens (`<`, `[`), each
its tokens as a trie (`<|` then the rest): a pattern that opens with a literal is searched for in C at memchr speed
(150 kB of prose: 0.003 ms, where one pattern opening with `<` or `[` tried every position: 0.9 ms; 150 kB of HTML,
whose every `<` is a candidate: 0.3 ms). Only when one is found is the prompt read as bytes, once, and at most
`PLACED_MAX` spelled tokens looked for in it, each by one search in C.
"""

from __future__ import annotations

import re
import weakref
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
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
    if texts is None or not any(texts.find(text) for message in messages for _, text in _texts(message)):
        return None
    placer = _Placer(ctx.capture.prompt_ids, ctx.tokenizer.pieces_bytes(ctx.capture.prompt_ids), texts.ids)
    found: list[tuple[int, str, str, str, int]] = []  # (message, role, field, token, prompt position)
    looked = 0
    for k, message in enumerate(messages):
        placer.next_message()
        role = str(message.get("role")) if isinstance(message, dict) else "?"
        for field, text in _texts(message):
            matches = texts.find(text)
            placer.anchor(text)
            for match in matches[: max(0, PLACED_MAX - looked)]:
                looked += 1
                at = placer.place(text, match.start(), match.end())
                if at is not None:
                    found.append((k, role, field, match.group(), at))
            placer.passed(text)
        if looked >= PLACED_MAX:
            break
    if not found:  # no spelled text is where an id of it stands: the template dropped it, or the server kept it text
        return None
    said = "; ".join(
        f"message {k + 1} ({role}) {field} spells {token} (id {texts.ids[token]})"
        for k, role, field, token, _ in found[:SHOWN]
    )
    if len(found) > SHOWN:
        said += f" and {len(found) - SHOWN} more" + (" (of the first it looked at)" if looked >= PLACED_MAX else "")
    return Hit.at(
        f"{said}: the server's tokenizer read such text as the control id, so the model saw that message end, or a "
        "turn begin, where the text only quoted it. The ids are what was served; escape such text in the harness if "
        "the model should read it as text.",
        sorted({at for *_, at in found}),
    )


PLACED_MAX = 256
"""How many spelled tokens one finding looks for in the prompt (a log pasted whole may spell thousands)."""
CONTEXT = 16
"""Characters of a spelled token's own text either side of it that must be beside it in the prompt."""


class _Placer:
    """Where a spelled token became its id, read on the prompt's bytes (every id's piece, a control id's as its
    text): the spelled token with the text either side of it (`CONTEXT` characters each) is looked for in the
    region of its message, and it is a finding only where the prompt has the control id at exactly that byte.

    A template renders the messages in order, mostly as their text: each text is anchored where its first characters
    are found past the previous message's texts, so a token spelled at a text's end is never taken for the template's
    own id after an earlier message that ends alike ("Done." then "Done.<|im_end|>"). A server that kept the text as
    text has ordinary pieces at that byte, and a template that dropped the text (earlier reasoning) has no such bytes:
    neither is a finding. A text that is the token alone has nothing to place it by and is left out."""

    def __init__(self, prompt: Sequence[int], pieces: Sequence[bytes], ids: dict[str, int]) -> None:
        self.prompt, self.ids = prompt, ids
        self.starts = list(accumulate((len(b) for b in pieces), initial=0))
        self.data = b"".join(pieces)
        self.cursor = 0
        """Where the next message's texts are looked for: past the texts of the messages before it."""
        self._message = self._region = self._floor = self._reach = 0
        self._end = len(self.data)

    def next_message(self) -> None:
        self.cursor = max(self.cursor, self._reach)
        self._message = self._reach = self.cursor

    def anchor(self, text: str) -> None:
        """Where `text` begins in the prompt (found past the messages before it), else the message's region."""
        whole = text.strip().encode("utf-8", "surrogatepass")
        at = self.data.find(whole[:24], self._message) if whole else -1
        self._region = self._floor = at if at >= 0 else self._message
        # found whole, a spelled token is looked for inside it only (past it come the template's own ids: its turn
        # end, the next generation prompt); found by its head only (the template rewrote it), a little past it
        if at < 0:
            self._end = len(self.data)
        else:
            self._end = at + len(whole) + (CONTEXT if self.data.startswith(whole, at) else 256)

    def passed(self, text: str) -> None:
        """The next message's texts are looked for past this one's, where it was found whole."""
        whole = text.strip().encode("utf-8", "surrogatepass")
        if whole and self.data.startswith(whole, self._region):
            self._reach = max(self._reach, self._region + len(whole))

    def place(self, text: str, start: int, end: int) -> int | None:
        left, right = text[max(0, start - CONTEXT) : start], text[end : end + CONTEXT]
        if not (left.strip() or right.strip()):
            return None
        token = text[start:end]
        needle = (left + token + right).encode("utf-8", "surrogatepass")
        skip = len(left.encode("utf-8", "surrogatepass"))
        at = self.data.find(needle, max(self._floor, self._region - skip), self._end)  # its left may hold the last
        for _ in range(4):  # the same words written as text before it (a server that kept them as text) come first
            if at < 0:
                return None
            offset = at + skip
            p = bisect_right(self.starts, offset) - 1
            if self.starts[p] == offset and p < len(self.prompt) and self.prompt[p] == self.ids[token]:
                self._region = offset + 1
                return p
            at = self.data.find(needle, at + 1, self._end)
        return None
