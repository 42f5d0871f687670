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
whose every `<` is a candidate: 0.3 ms). Only when one is found is the prompt read as bytes, once, and each
message's texts looked for in it whole, by a search in C within a window past the texts found before it, at most
`PLACED_MAX` tokens placed and `SEARCHED_MAX` bytes searched (a 4,000-message, 200,000-id prompt: its whole analysis
~0.4 s, paid only by a sample that spells one).
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
    placer = _Placer(ctx.capture.prompt_ids, ctx.tokenizer.pieces_bytes(ctx.capture.prompt_ids), texts)
    found: list[tuple[int, str, str, str, int]] = []  # (message, role, field, token, prompt position)
    own = {ctx.profile.think_open_id, ctx.profile.think_close_id} - {None} if ctx.profile is not None else set()
    for k, message in enumerate(messages):
        role = str(message.get("role")) if isinstance(message, dict) else "?"
        placer.next_message()
        for field, text in _texts(message):
            placed = placer.place(text, PLACED_MAX - len(found))
            if role == "assistant":  # reasoning written inline in an answer (`<think>…</think>X`, as R1 harnesses send
                placed = [(t, at) for t, at in placed if texts.ids[t] not in own]  # it): the model's own structure
            found += [(k, role, field, token, at) for token, at in placed]
        if len(found) >= PLACED_MAX or placer.spent:
            break
    if not found:  # no spelled text is where an id of it stands: the template dropped it, or the server kept it text
        return None
    said = "; ".join(
        f"message {k + 1} ({role}) {field} spells {token} (id {texts.ids[token]})"
        for k, role, field, token, _ in found[:SHOWN]
    )
    if len(found) > SHOWN:
        said += f" and {len(found) - SHOWN} more" + (" (the first it placed)" if len(found) >= PLACED_MAX else "")
    return Hit.at(
        f"{said}: the server's tokenizer read such text as the control id, so the model saw that message end, or a "
        "turn begin, where the text only quoted it. The ids are what was served; escape such text in the harness if "
        "the model should read it as text.",
        sorted({at for *_, at in found}),
    )


PLACED_MAX = 256
"""How many spelled tokens one finding places (a log pasted whole may spell thousands)."""
MARKUP_MAX = 4 << 10
"""Bytes of template markup a text may lie past the texts before it (a turn's header, a call's wrapper, a tool result's
preamble: a few dozen; Kimi's tool-declaration turn sits before the first message, searched without a window)."""
SEARCHED_MAX = 64 << 20
"""Bytes of prompt one finding searches at most: a text the template dropped or rewrote is looked for to the end."""


class _Placer:
    """Where spelled tokens became their ids, read on the prompt's bytes (every id's piece, a control id's as its
    text). A template renders the messages in order, most texts as they are: each text is looked for whole, past the
    texts found before it, and a spelled token in a text found whole is a finding where the prompt has its control id
    at that very byte. So a text is never taken for another that ends or begins alike (an earlier "Done." and the
    template's turn end after it), nor for the template's own structure (a pasted transcript opening with
    `<|im_end|>\n<|im_start|>user`): the whole text, its distinctive words included, must be there. A text the
    template dropped (earlier reasoning) or rewrote (re-serialised arguments) is not found and names nothing; nor
    does a text the server kept as text (ordinary pieces at that byte), nor one that is the token alone (nothing to
    tell its place by)."""

    def __init__(self, prompt: Sequence[int], pieces: Sequence[bytes], texts: ControlTexts) -> None:
        self.prompt, self.texts = prompt, texts
        self.starts = list(accumulate((len(b) for b in pieces), initial=0))
        self.data = b"".join(pieces)
        self.cursor = 0
        """Where the texts of the next message are looked for: past the texts of the messages before it (a
        message's own are looked for from there, in any order: Kimi writes the reasoning before the content)."""
        self.reach = 0
        self.searched = 0
        self.unfound = 0
        """Bytes of the texts not found since the last text found: a template may have written them otherwise (GLM's
        arguments), so the next text may lie that much further on."""
        self.found_any = False

    def next_message(self) -> None:
        self.cursor = max(self.cursor, self.reach)

    @property
    def spent(self) -> bool:
        return self.searched > SEARCHED_MAX

    def _window_end(self, body: bytes) -> int:
        """How far a text is looked for: to the end until one text is found (tool declarations and a system prompt may
        come first, of any length); then past the cursor by the template's markup between messages, the texts not
        found since (written otherwise) and the text itself. A text the template dropped (an earlier turn's
        reasoning) then costs a window, not a scan to the prompt's end: 1,000 dropped turns used up the search
        budget before the last message, which was never looked at."""
        if not self.found_any:
            return len(self.data)
        return min(len(self.data), self.cursor + MARKUP_MAX + 2 * self.unfound + len(body))

    def place(self, text: str, limit: int) -> list[tuple[str, int]]:
        """(token, prompt position) of each token `text` spells that became its id, the first `limit` of them."""
        whole = text.strip()
        matches = self.texts.find(whole)
        if not whole:
            return []
        body = whole.encode("utf-8", "surrogatepass")
        if matches and not _words_beside(whole, matches):
            return []
        end = self._window_end(body)
        at = self.data.find(body, self.cursor, end)
        self.searched += (at + len(body) if at >= 0 else end) - self.cursor
        if at < 0:
            self.unfound += len(body)
            return []
        self.reach = max(self.reach, at + len(body))
        self.found_any, self.unfound = True, 0
        placed: list[tuple[str, int]] = []
        for match in matches:
            if len(placed) >= limit:
                break
            offset = at + len(whole[: match.start()].encode("utf-8", "surrogatepass"))
            p = bisect_right(self.starts, offset) - 1
            if self.starts[p] == offset and p < len(self.prompt) and self.prompt[p] == self.texts.ids[match.group()]:
                placed.append((match.group(), p))
        return placed


def _words_beside(text: str, matches: list[re.Match[str]]) -> bool:
    """Whether `text` holds anything but its spelled tokens and white space (the token alone tells no place)."""
    rest, at = [], 0
    for m in matches:
        rest.append(text[at : m.start()])
        at = m.end()
    rest.append(text[at:])
    return any(piece.strip() for piece in rest)
