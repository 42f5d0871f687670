"""Does a text read as another side's text of the same ids? Words, not characters: a server's text skips special
tokens that a decode may keep (or the other way round), and a decode may clean up spaces; another vocabulary's text
of the same ids holds next to none of the words. `tokview score` asks it of a target's `/detokenize`
(`vocabulary_probe`), `tokview batch` and the proxy of their own tokenizer's decode (`vocabulary_guard`).

Its own module, free of the store: a batch process never imports DuckDB.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokview.core.record import Capture
    from tokview.core.tokenizer import TokenizerAdapter

PROBE_IDS = 1024
"""Output ids of a sample read back: a 14,000-id reasoning trace is probed by its start, not left out."""
TOLD = 3
"""Samples told (enough words to judge) that decide, by majority; up to `probe_candidates`' count are looked at."""
MIN_WORDS = 3
"""Distinct words of three letters or more a probe needs to tell anything: a blank or one-word answer is in any text."""
SHARE = 0.7
"""Of the probe's words, the share the other side must hold."""
_MARKUP = re.compile(r"<[^<>\s]{1,48}>")
"""A special token's text (`<|im_end|>`, `</think>`, `<tool_call>`): on one side only when a side skipped it."""
_WORD = re.compile(r"\w{3,}")


def answer_ids(capture: Capture) -> list[int]:
    """The ids `answer_text` speaks of: a dual capture's text fields are its chat path's, whose answer is other ids
    than the raw path's `output_ids` at any temperature above 0 (read against those, a sound run read as another
    vocabulary); its chat ids when the server returned them, else none to compare."""
    if capture.endpoint == "dual":
        return list(capture.parsed_output_ids or ())
    return list(capture.output_ids)


def answer_text(capture: Capture) -> str:
    """Everything its server said of a sample's output ids: the raw text, the reasoning and content, and each tool
    call's name and arguments (a tool parser takes them out of the text: a long call's ids read as none of it)."""
    calls = [f"{c.get('name') or ''} {_as_written(c.get('arguments'))}" for c in capture.tool_calls or ()]
    return " ".join(t for t in (capture.text, capture.reasoning, capture.content, *calls) if t)


def _as_written(arguments: object) -> str:
    """A call's arguments as the server gave them (`reads_as` reads their escapes: the `\\n` of re-dumped code is
    the line break an XML call layout's ids spell; an escaped copy added beside them once gave `u5317`-like words no
    ids spell, and a correct run with non-ASCII arguments read as another vocabulary)."""
    return arguments if isinstance(arguments, str) else ""


def unescaped(text: str) -> str:
    """`text` with JSON's string escapes read (`\\n`, `\\"`, `\\u5317`…): a parser returns arguments re-dumped
    (`北` where the ids spell `\\u5317`, or the other way round), so both sides are compared so read."""
    return _ESCAPE.sub(_read_escape, text)


_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|([nrtbf\"\\/]))")
_ESCAPED = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", '"': '"', "\\": "\\", "/": "/"}


def _read_escape(match: re.Match[str]) -> str:
    code, char = match.groups()
    return chr(int(code, 16)) if code else _ESCAPED[char]


def read_back(capture: Capture, tokenizer: TokenizerAdapter) -> tuple[bool | None, str, str]:
    """(`reads_as` of the capture's answer against `tokenizer`'s decode of its first `PROBE_IDS` ids, the server's
    text, the decode): the one reading batch's first answers, the proxy and doctor make with their own tokenizer.
    None when there are no ids to read (a dual capture without its chat ids). A decode the tokenizer refuses (an id
    it lacks) reads as none of the words."""
    ids = answer_ids(capture)
    text = answer_text(capture)
    if not ids:
        return None, text, ""
    try:
        decoded = tokenizer.decode(ids[:PROBE_IDS], skip_special_tokens=False)
    except Exception:  # its own error, or an OverflowError
        decoded = ""
    return reads_as(text, decoded, whole=len(ids) <= PROBE_IDS), text, decoded


def reads_as(text: str, decoded: str, *, whole: bool = True) -> bool | None:
    """Whether the target's `decoded` text of a sample's output ids is that sample's `text`: when the probe read all
    the ids, the answer's words must be found in the decoded text; when it read their start, the decoded words in the
    answer. None when the server's text, or the side looked for, has fewer than `MIN_WORDS` words.

    Each side is read as written and with its JSON escapes read (`unescaped`), and the better of the readings of the
    side looked for decides: a parser returns arguments re-dumped (`北` where the ids spell `\\u5317`, `\\n` where they
    spell a line break), while ids may spell a backslash that is text (`\\frac`, `C:\\new`), which read as an escape
    would lose its word. A word is found anywhere in the other side with its whitespace taken out, and with its markup
    taken out or kept: a side that skipped special tokens glues the words around them (Harmony's `analysis` and the
    reasoning's first word), the other keeps them apart, and a tag may spell the words a parser returned
    (Qwen3-Coder's `<function=get_weather>` is the `get_weather` of its tool call)."""
    said = _readings(text)
    if max(len(_words(form)) for form in said) < MIN_WORDS:  # a server that said (next to) nothing tells nothing
        return None
    looked_for, other = (said, _readings(decoded)) if whole else (_readings(decoded), said)
    within = "\n".join(
        part for form in other for part in ("".join(_MARKUP.sub("", form).split()), "".join(form.split()))
    )
    shares = [
        sum(word in within for word in wanted) / len(wanted)
        for wanted in map(_words, looked_for)
        if len(wanted) >= MIN_WORDS
    ]
    return max(shares) >= SHARE if shares else None


def _readings(text: str) -> tuple[str, ...]:
    """A text as written and with its JSON escapes read (one reading when it holds none)."""
    read = unescaped(text)
    return (text,) if read == text else (text, read)


def _words(text: str) -> set[str]:
    return set(_WORD.findall(_MARKUP.sub("", text)))
