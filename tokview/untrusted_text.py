"""Text that came from outside (a server's error body, a model name, a failure reason quoting either) made
safe to store and safe to print.

A server may send any JSON string: a `\\ud800` escape decodes to a lone surrogate, which no UTF-8 file,
orjson dump or DuckDB column accepts (one in a failure reason killed the batch's writer thread), and an
ESC, BEL or C1 control in an error body printed as is clears the screen or retitles the window. One
function per place such text goes:

- `storable(text)`: each lone surrogate written as its escape (`\\ud800`), everything else kept;
- `printable(text)`: for a terminal, every control character but newline and tab (C0, DEL, C1) and
  every lone surrogate written as an escape (`\\x1b`, `\\x9b`, `\\ud800`), so what a server said is
  still readable and can no longer act on the terminal; `printable_line` keeps it on one line too;
- `printable_json(dump)`: a JSON dump for a terminal (the C1 controls JSON leaves raw, escaped).

Model output that is training data is never rewritten here: a lone surrogate in an answer's text is a
malformed answer (`servers/shapes.py`), not something to repair.

This module imports nothing from tokview, so every layer can use it.
"""

from __future__ import annotations

import codecs
import json
import re
import sys

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""C0 and C1 controls (newline and tab apart), lone surrogates, and the bidirectional embeddings, overrides and
isolates: U+202E in a note or a sample id reversed what the terminal drew after it (the text read otherwise than it
was)."""


def _escape(match: re.Match[str]) -> str:
    return char_escape(match.group())


def char_escape(ch: str) -> str:
    """One character as Python writes its escape: `\\x1b`, `\\ud800`, `\\U0001f389`."""
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def writes_unicode(stream: object) -> bool:
    """Whether a text stream's encoding can write every character (UTF-8, -16 or -32); a stream that names none is
    taken to (Python's own default)."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        return codecs.lookup(encoding).name in ("utf-8", "utf-16", "utf-32")
    except LookupError:
        return False


def storable(text: str) -> str:
    """`text` with each lone surrogate written as its `\\udXXX` escape: valid UTF-8 for a file or a column."""
    return _LONE_SURROGATE.sub(_escape, text) if _LONE_SURROGATE.search(text) else text


def has_lone_surrogate(text: str) -> bool:
    """True when `text` holds a character no UTF-8 encoding has (a JSON `\\ud800` escape decodes to one)."""
    return _LONE_SURROGATE.search(text) is not None


def lone_surrogates(text: str, limit: int = 3) -> str:
    """The first `limit` distinct lone surrogates in `text`, as escapes (`\\ud800, \\udfff`): for a reason."""
    found = dict.fromkeys(_LONE_SURROGATE.findall(text))
    return ", ".join(f"\\u{ord(c):04x}" for c in list(found)[:limit])


def printable(text: str) -> str:
    """`text` for a terminal: control characters other than newline and tab, and lone surrogates, as escapes."""
    return _UNPRINTABLE.sub(_escape, text) if _UNPRINTABLE.search(text) else text


_RAW_IN_JSON = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable_json(text: str) -> str:
    """A JSON document for a terminal: the DEL and C1 controls, the bidi overrides and the line and paragraph
    separators (a reader splitting lines at them broke a record) JSON leaves raw inside strings escaped as `\\u009b`
    (the same JSON to a parser). The dump escapes C0 controls itself; lone surrogates must be
    made `storable` first."""
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def stdout_json(value: object) -> str:
    """`value` as a JSON document for stdout (`printable_json`): its text as it is where stdout writes UTF-8, every
    non-ASCII character escaped where the locale cannot (a `\\xe9` written in its place was no JSON)."""
    return printable_json(json.dumps(value, ensure_ascii=not writes_unicode(sys.stdout)))


_LINE_BREAKS = re.compile("[\u2028\u2029]")


def printable_line(text: str) -> str:
    """`printable`, and newlines, tabs and the line and paragraph separators escaped too: for text that must stay on
    its one line (a reader that splits lines at U+2028, as Python's `splitlines` does, broke a record in two)."""
    return _LINE_BREAKS.sub(_escape, printable(text).replace("\n", "\\n").replace("\t", "\\t"))


def clipped(text: str, limit: int) -> str:
    """`text` up to `limit` characters, cut before a word with " …" when longer: a reason cut at 200 characters named
    `/v1/completion` for `/v1/completions` and left its brackets open. Where the last space is in the first half (a
    JSON body, a URL, base64), it is cut at the limit: a word boundary there kept nothing of the server's words."""
    if len(text) <= limit:
        return text
    head = text[: limit - 2]
    word = head.rsplit(" ", 1)[0]
    return (word if len(word) >= limit // 2 else head) + " …"  # a body of few spaces is cut where it must be


_PRINTED_ESCAPE = re.compile(r"\\(?:x([0-9a-f]{2})|u([0-9a-f]{4})|(n)|(t))")


def from_printed(text: str) -> str:
    """What `printable_line` printed as `text`, its escapes (`\\x1b`, `\\u202e`, `\\n`, `\\t`) read back: a sample
    id copied from `tokview stats --samples` into `tokview show`. Ambiguous for text that held such an escape as
    typed, so a caller tries the text as given first."""

    def one(match: re.Match[str]) -> str:
        byte, code, newline, _tab = match.groups()
        if byte or code:
            return chr(int(byte or code, 16))
        return "\n" if newline else "\t"

    return _PRINTED_ESCAPE.sub(one, text)


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def not_utf8(text: str) -> str | None:
    """Where a line read with `errors="surrogateescape"` (`batch.inputs.open_lines`, `core.prompts.iter_jsonl`) holds a byte that is not UTF-8 (`byte 0xff at column 44`), else None.
    UTF-8 cannot encode a surrogate, so an escaped byte is the only way one gets into the text."""
    if text.isascii():
        return None
    found = _ESCAPED_BYTE.search(text)
    if found is None:
        return None
    return f"byte 0x{ord(found.group()) - 0xDC00:02x} at column {found.start() + 1}"
