"""Server-sent events cut out of a byte stream as they arrive, each kept as the bytes the server sent.

The proxy forwards a stream event by event (never a half event: a client's SSE parser would see a cut
JSON chunk), and edits only the events that carry ids it asked for, so the rest go out byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import orjson

DONE = object()
"""What `data_of` returns for `data: [DONE]`."""


class EventSplitter:
    """Feed bytes as they come; get back every event completed so far (its bytes, terminator included)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._more: list[bytes] = []
        """Reads after `_buffer` that end no event, kept apart: joining each onto a growing buffer was quadratic."""
        self._pending = 0
        self._tail = b""
        """The last two bytes held: a blank line may begin in them and end in the next read."""

    def _held(self) -> bytes:
        if self._more:
            self._buffer, self._more = self._buffer + b"".join(self._more), []
        return self._buffer

    def feed(self, data: bytes) -> Iterator[bytes]:
        buffer = self._held() + data if self.pending else data
        start = 0
        while True:
            end, size = _event_end(buffer, start)
            if end < 0:
                break
            yield buffer[start : end + size]
            start = end + size
        self._keep(buffer[start:])

    def _keep(self, buffer: bytes) -> None:
        self._buffer, self._more, self._pending, self._tail = buffer, [], len(buffer), buffer[-2:]

    def feed_whole(self, data: bytes) -> bytes:
        """Like `feed`, but every event completed so far as one bytes (no object per event): a read holding
        many events is then edited in one pass. Events end at the last blank line: LF LF, or LF CR LF (which
        ends CR LF CR LF too, and an LF line followed by an empty CR LF one)."""
        if self.pending:
            seam = self._tail + data  # a blank line may start in what is held
            if b"\n\n" not in seam and b"\n\r\n" not in seam:
                self._more.append(data)
                self._pending += len(data)
                self._tail = seam[-2:]
                return b""
        buffer = self._held() + data if self.pending else data
        lf, crlf = buffer.rfind(b"\n\n"), buffer.rfind(b"\n\r\n")
        end = max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)
        self._keep(buffer[end:])
        return buffer[:end]

    @property
    def pending(self) -> int:
        """Bytes of an event not ended yet."""
        return self._pending

    def rest(self) -> bytes:
        """What is left when the stream ends (a server that closed mid-event): forwarded as it is."""
        rest = self._held()
        self._keep(b"")
        return rest


def _event_end(buffer: bytes, start: int) -> tuple[int, int]:
    """(index of the blank line that ends the next event, its length), or (-1, 0).

    Line by line from `start`: searching the whole rest of the buffer for each kind of terminator (LF LF,
    CR LF CR LF) scanned a read to its end once per event, quadratic in a read holding a whole stream."""
    i = buffer.find(b"\n", start)
    while i >= 0:
        after = buffer[i + 1 : i + 2]
        if after == b"\n":
            return i, 2
        if after == b"\r" and buffer[i + 2 : i + 3] == b"\n":  # an empty CR LF line after CR LF or LF
            return (i - 1, 4) if i > start and buffer[i - 1 : i] == b"\r" else (i, 3)
        i = buffer.find(b"\n", i + 1)
    return -1, 0


def data_of(event: bytes) -> Any:
    """The JSON of an event's `data:` lines, DONE for `[DONE]`, None for an event without (or with bad) data."""
    lines = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
    if not lines:
        return None
    payload = b"\n".join(lines)
    if payload == b"[DONE]":
        return DONE
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        pass
    try:  # a lone surrogate escape ("\ud800") is valid JSON that orjson refuses: read, the answer is then judged
        # as the servers layer judges it (a malformed response), never silently short of this event's ids
        return json.loads(payload)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's json reads (orjson refused it)
        return None


def stream_chunks(raw: bytes) -> tuple[list[dict[str, Any]], bool]:
    """A whole stream's JSON chunks (the objects of its `data:` events, in order) and whether it said [DONE]."""
    chunks, done, _ = read_stream(raw)
    return chunks, done


def read_stream(raw: bytes) -> tuple[list[dict[str, Any]], bool, int]:
    """`stream_chunks`, and how many `data:` events held no JSON object (skipped: the recorder refuses a stream
    with any, since the ids such an event carried would be missing from the sample).

    The recorder's reading of every stream it records: in bulk when the stream is the plain shape both servers
    send (each event one `data:` line, LF-terminated, [DONE] last), as one JSON array in one `orjson.loads`;
    otherwise, or when that array does not parse (a bad event), event by event."""
    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 BOM may open a stream (the SSE spec drops it)
    bulk = _plain_chunks(raw)
    return bulk if bulk is not None else _chunks_one_by_one(raw)


_DATA_SEP = b"\n\ndata:"
_DONE_TAILS = (b"data: [DONE]\n\n", b"data:[DONE]\n\n")


def _plain_chunks(raw: bytes) -> tuple[list[dict[str, Any]], bool, int] | None:
    """The chunks of a plain stream, or None when the stream is not plain or its array does not parse.

    Plain: it starts with `data:`, ends with a [DONE] event, and every newline in it is part of an event's
    blank line followed by the next `data:` (or of the last blank line): so no event has a second line or
    field, and the payloads joined by commas are exactly the events' JSON (a JSON text never holds a raw
    newline: a string's newlines are escaped)."""
    tail = next((t for t in _DONE_TAILS if raw.endswith(t)), None)
    if tail is None or not raw.startswith(b"data:"):
        return None
    body = raw[: -len(tail)]
    n = body.count(_DATA_SEP) + 1  # JSON events: the blank line before [DONE] is not in `body`'s separators
    if raw.count(b"\n") != 2 * n + 2 or (body and not body.endswith(b"\n\n")):
        return None
    if not body:
        return [], True, 0
    try:
        values = orjson.loads(b"[" + body[5:-2].replace(_DATA_SEP, b",") + b"]")
    except orjson.JSONDecodeError:
        return None
    if len(values) != n:  # a payload holding a top-level comma (`data: 1, 2`): not one JSON value an event
        return None
    # Equal to event by event whenever each event is one JSON value (every stream vLLM and SGLang send). Only
    # broken events that make up for each other (one cut in two, another holding two values) could parse here
    # and not there; a stream like that was never a valid answer, and its ids are then checked like any other.
    chunks = [v for v in values if type(v) is dict]
    return chunks, True, n - len(chunks)


def _chunks_one_by_one(raw: bytes) -> tuple[list[dict[str, Any]], bool, int]:
    splitter = EventSplitter()
    events = list(splitter.feed(raw))
    rest = splitter.rest()
    if rest:
        events.append(rest)
    chunks, done, unreadable = [], False, 0
    for event in events:
        data = data_of(event)
        if data is DONE:
            done = True
        elif isinstance(data, dict):
            chunks.append(data)
        elif any(line.startswith(b"data:") for line in event.splitlines()):  # not a comment: data, unreadable
            unreadable += 1
    return chunks, done, unreadable
