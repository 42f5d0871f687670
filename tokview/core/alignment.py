"""Align the text fields a server returned back onto the ids it produced.

Reasoning parsers split *decoded text*; the delimiter ids vanish from every text field while they stay
in the raw ids. Walking the ids' bytes against the returned text tells, per id, whether its text was
kept, kept only in part (whitespace trimmed), or hidden; and where the text says something the ids
do not (drift). The walk is linear: one pass over the ids with a bounded look-ahead to resynchronise.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, groupby

from tokview.core.segments import positions_of
from tokview.core.tool_calls import ToolCallsOnIds

KEPT = "kept"
PARTIAL = "partial"
HIDDEN = "hidden"
DRIFT = "drift"
"""The id's text was found, but only after text that no id accounts for."""

RESYNC_WINDOW = 256
LOOKAHEAD_IDS = 256
"""How many later ids a step looks at for one whose text begins at the cursor (ids the text never held)."""


@dataclass(frozen=True)
class Alignment:
    """Per-id status, plus the returned text that no id accounts for."""

    statuses: tuple[str, ...]
    unmatched_text: str
    fields: tuple[int | None, ...] = ()
    """Per id: the index (into the `texts` given to `align`) of the field its text landed in; None if hidden."""

    def status_runs(self) -> list[tuple[str, int]]:
        """(status, count) of each run of equal statuses, in order: a few pairs for a 2,000-id answer.

        `align` records them as it walks (`_with_runs`); any other alignment (one read back from a store,
        or made with `dataclasses.replace`, which never carries them over) reads them off `statuses`."""
        recorded = self.__dict__.get("_runs")
        if recorded is not None:
            return list(recorded)
        return [(status, len(list(run))) for status, run in groupby(self.statuses)]

    def _with_runs(self, runs: list[_Run]) -> Alignment:
        """This alignment, remembering the runs its walk recorded (not a field: equality and
        `dataclasses.replace` ignore it, so they can never be stale)."""
        object.__setattr__(self, "_runs", tuple((run.status, run.count) for run in runs))
        return self

    def positions(self, status: str) -> list[int]:
        """Every index with this status, found with `tuple.index` (its `==` runs in C, and is an identity
        check for the interned status strings `align` uses): a rare status costs no Python step per id. An
        alignment `align` made reads them off the runs its walk recorded: a few runs, no pass over the ids."""
        found: list[int] = []
        recorded = self.__dict__.get("_runs")
        if recorded is not None:
            start = 0
            for run_status, n in recorded:
                if run_status == status:
                    found.extend(range(start, start + n))
                start += n
            return found
        at = -1
        try:
            while True:
                at = self.statuses.index(status, at + 1)
                found.append(at)
        except ValueError:
            return found


def _common_prefix(a: bytes, b: bytes, start: int) -> int:
    n = 0
    limit = min(len(a), len(b) - start)
    while n < limit and a[n] == b[start + n]:
        n += 1
    return n


def _resync(target: bytes, cursor: int, piece: bytes, following: bytes) -> int:
    """Where `piece` resumes in the text after some unaccounted text, or -1.

    A short piece (" the") can occur anywhere, so a candidate only counts when the next id's bytes
    follow it too; jumping to a false match would mark every id in between as hidden.
    """
    limit = cursor + RESYNC_WINDOW + len(piece)
    found = target.find(piece, cursor, limit)
    while found != -1:
        end = found + len(piece)
        if not following or target.startswith(following, end) or end == len(target):
            return found
        found = target.find(piece, found + 1, limit)
    return -1


def _keep_run(
    pieces: Sequence[bytes],
    start: int,
    end: int,
    *,
    cursor: int,
    size: int,
    encoded: list[tuple[int, bytes]],
    starts: list[int],
    fields: list[int | None],
) -> int:
    """Fill the fields of pieces[start:end], kept (the text holds them verbatim from `cursor`, `size` bytes in all);
    returns the new cursor.

    Each id's field is the text field its first byte falls in. When every id has bytes and no field
    boundary falls inside the run (the common case), they all share the field of `cursor`. Otherwise
    pieces are measured once and the fields filled a stretch at a time between field boundaries (one
    or two per answer): either way a 2,000-id run costs a few list operations, not a Python step per id."""
    run = pieces[start:end]
    k = bisect_right(starts, cursor) - 1
    if all(run) and (k + 1 == len(starts) or starts[k + 1] >= cursor + size):  # `all`: no empty piece, in C
        fields.extend([encoded[k][0]] * len(run))
        return cursor + size
    lengths = list(map(len, run))
    if 0 in lengths:  # an id with no bytes has no field: the plain walk (from `k`, the field at `cursor`)
        for n in lengths:
            if n:
                while k + 1 < len(starts) and cursor >= starts[k + 1]:
                    k += 1
                fields.append(encoded[k][0])
                cursor += n
            else:
                fields.append(None)
        return cursor
    begins = list(accumulate(lengths, initial=cursor))  # begins[i]: offset of piece i; the last is the end
    i = 0
    while i < len(run):
        k = bisect_right(starts, begins[i]) - 1
        nxt = bisect_left(begins, starts[k + 1], i, len(run)) if k + 1 < len(starts) else len(run)
        fields.extend([encoded[k][0]] * (nxt - i))
        i = nxt
    return begins[-1]


def align(
    pieces: Sequence[bytes],
    texts: Sequence[str | None],
    special: Sequence[bool],
    *,
    fast_runs: bool = True,
    special_at: Sequence[int] | None = None,
) -> Alignment:
    """Match each id's bytes, in order, against the concatenated text fields.

    `fast_runs`: a run of non-special ids whose joined bytes the text holds verbatim at the cursor is
    all kept, checked with one comparison instead of one per id (the common case: the whole answer of
    a 2,000-id sample is two or three runs). False walks id by id, the reference the tests compare it with.
    `special_at`: the positions of the true `special` flags, when the caller has them."""
    encoded = [(i, t.encode("utf-8")) for i, t in enumerate(texts) if t]
    target = b"".join(b for _, b in encoded)
    starts, offset = [], 0
    for _, b in encoded:
        starts.append(offset)
        offset += len(b)
    walk = _Walk(pieces, special, encoded, target, starts)
    n = len(pieces)
    if not fast_runs:
        for index in range(n):
            walk.step(index)
        return walk.result()
    run_start = 0
    # each run of non-special ids, then the special id ending it
    for stop in [*(true_positions(special) if special_at is None else special_at), n]:
        if stop - run_start > 1 and target.startswith(joined := b"".join(pieces[run_start:stop]), walk.cursor):
            walk.add(KEPT, stop - run_start)
            walk.cursor = _keep_run(
                pieces,
                run_start,
                stop,
                cursor=walk.cursor,
                size=len(joined),
                encoded=encoded,
                starts=starts,
                fields=walk.fields,
            )
        else:  # this run drifts or trims: id by id
            for index in range(run_start, stop):
                walk.step(index)
        if stop < n:
            walk.step(stop)
        run_start = stop + 1
    return walk.result()


def true_positions(flags: Sequence[bool]) -> list[int]:
    """Indexes of the true flags, in order. For a list of bools (what `special_flags` gives) `list.index(True)`
    finds them in C; any other sequence is read with `compress`."""
    if not isinstance(flags, list):
        return list(compress(range(len(flags)), flags))
    return positions_of(flags, True)


@dataclass(slots=True)
class _Run:
    """A run of consecutive ids with one status, counted up in place as the walk adds to it."""

    status: str
    count: int


class _Walk:
    """The id-by-id alignment: one `step` per id, in order."""

    def __init__(
        self,
        pieces: Sequence[bytes],
        special: Sequence[bool],
        encoded: list[tuple[int, bytes]],
        target: bytes,
        starts: list[int],
    ) -> None:
        self.pieces, self.special, self.encoded, self.target, self.starts = pieces, special, encoded, target, starts
        self.cursor = 0
        self.statuses: list[str] = []
        self.runs: list[_Run] = []
        self.fields: list[int | None] = []
        self.unmatched = bytearray()
        self._ahead: tuple[int, int, int, int | None] = (-1, 0, 0, None)
        """(cursor, first id, end id, match) of the last look-ahead: ids in [first, end) were tried at cursor
        and `match` is the first whose text begins there (None: none did), so a run of hidden ids is scanned once."""

    def add(self, status: str, n: int = 1) -> None:
        """`n` more ids with this status (the fields are the caller's)."""
        if n == 1:
            self.statuses.append(status)
        else:
            self.statuses.extend([status] * n)
        if self.runs and self.runs[-1].status is status:
            self.runs[-1].count += n
        else:
            self.runs.append(_Run(status, n))

    def field_at(self, pos: int) -> int | None:
        encoded = self.encoded
        return encoded[bisect_right(self.starts, pos) - 1][0] if encoded and pos < len(self.target) else None

    def step(self, index: int) -> None:
        piece, is_special, target, cursor = self.pieces[index], self.special[index], self.target, self.cursor
        fields = self.fields
        if not piece or target.startswith(piece, cursor):
            fields.append(self.field_at(cursor) if piece else None)
            self.add(KEPT)
            self.cursor = cursor + len(piece)
            return
        common = _common_prefix(piece, target, cursor)
        if common and not piece[common:].strip():
            fields.append(self.field_at(cursor))
            self.add(PARTIAL)  # trailing whitespace trimmed (e.g. content.strip())
            self.cursor = cursor + common
            return
        core = piece.lstrip()
        if core and core != piece and target.startswith(core, cursor):
            fields.append(self.field_at(cursor))
            self.add(PARTIAL)  # leading whitespace trimmed (e.g. "\n\nThe" → "The")
            self.cursor = cursor + len(core)
            return
        if not piece.strip() or is_special:
            self.add(HIDDEN)
            fields.append(None)
            return
        pieces, special = self.pieces, self.special
        following = pieces[index + 1] if index + 1 < len(pieces) and not special[index + 1] else b""
        found = _resync(target, cursor, piece, following)
        if self._text_resumes_later(index, cursor, RESYNC_WINDOW if found == -1 else found - cursor):
            found = -1  # the text holds none of this id: it goes on with a later one, right at the cursor
        if found != -1:
            self.unmatched += target[cursor:found]
            fields.append(self.field_at(found))
            self.add(DRIFT)
            self.cursor = found + len(piece)
        else:
            self.add(HIDDEN)
            fields.append(None)

    def _text_resumes_later(self, index: int, cursor: int, drift: int) -> bool:
        """Whether a later id's text (followed by the next id's) begins at the cursor, and the ids skipped to reach
        it are fewer bytes than the `drift` bytes of text a resync would skip: then this id is one the text
        never held (an output that echoes the prompt's tail before its own text, SGLang #17240), not text
        that no id accounts for. The cheaper explanation wins; specials count no bytes (no text shows them)."""
        match = self._match_after(index, cursor)
        if match is None:
            return False
        skipped = sum(len(p) for p, s in zip(self.pieces[index:match], self.special[index:match]) if not s)
        return skipped <= drift

    def _match_after(self, index: int, cursor: int) -> int | None:
        """The first id after `index` (within LOOKAHEAD_IDS) whose text, and its next id's, begins at the cursor."""
        pieces, special, target = self.pieces, self.special, self.target
        seen_cursor, first, end, match = self._ahead
        if seen_cursor != cursor or first > index + 1 or (match is not None and match <= index):
            first, end, match = index + 1, index + 1, None
        if match is not None:
            return match
        stop = min(len(pieces), index + 1 + LOOKAHEAD_IDS)
        for j in range(end, stop):
            piece = pieces[j]
            if special[j] or not piece.strip() or not target.startswith(piece, cursor):
                continue
            following = pieces[j + 1] if j + 1 < len(pieces) and not special[j + 1] else b""
            if target.startswith(following, cursor + len(piece)) or cursor + len(piece) == len(target):
                match = j
                break
        self._ahead = (cursor, first, max(end, stop) if match is None else match, match)
        return match

    def result(self) -> Alignment:
        self.unmatched += self.target[self.cursor :]
        alignment = Alignment(
            tuple(self.statuses), self.unmatched.decode("utf-8", errors="replace"), tuple(self.fields)
        )
        return alignment._with_runs(self.runs)


def align_with_tool_calls(
    pieces: Sequence[bytes],
    texts: Sequence[str | None],
    special: Sequence[bool],
    on_ids: ToolCallsOnIds,
    server_calls: Sequence[Mapping[str, str | None]] | None,
    *,
    special_at: Sequence[int] | None = None,
) -> Alignment:
    """`align`, with the ids of the tool calls aligned to the server's `tool_calls` field instead of the text.

    A tool parser takes the calls out of the text: the markers are hidden, the call id text comes back only
    as `tool_calls[k].id` (Kimi) and the arguments as `tool_calls[k].function.arguments`. So the ids outside
    the calls are aligned to `texts` (reasoning, content) as ever, and each call's id and arguments ids to
    the k-th server call's own text (field `len(texts) + 2k` and `+ 2k + 1`; hermes, which writes no id,
    aligns its JSON to the name and the arguments). A call the server did not return stays hidden.
    Without calls on the ids, or without calls in the `tool_calls` field (no tool parser ran, or it ran with
    `tool_choice: none`, or the call text came back in `content`), it is plain `align`."""
    if not on_ids.found or not server_calls:
        return align(pieces, texts, special, special_at=special_at)
    ranges = _merged([*on_ids.sections, *(c.span for c in on_ids.calls), *((m, m + 1) for m in on_ids.markers)])
    outside = _complement(ranges, len(pieces))
    out_pieces = [p for a, b in outside for p in pieces[a:b]]
    out_special = [s for a, b in outside for s in special[a:b]]
    main = align(out_pieces, texts, out_special)
    statuses: list[str] = [HIDDEN] * len(pieces)
    fields: list[int | None] = [None] * len(pieces)
    unmatched = [main.unmatched_text]
    at = 0
    for a, b in outside:
        statuses[a:b] = main.statuses[at : at + b - a]
        fields[a:b] = main.fields[at : at + b - a]
        at += b - a
    base = len(texts)
    for k, call in enumerate(on_ids.calls):
        server = server_calls[k] if k < len(server_calls) else None
        if server is None:
            continue
        offset = base + 2 * k
        if call.id_span is None:  # hermes: the JSON holds the name and the arguments, and no id
            name, arguments = server.get("name"), server.get("arguments")
            if call.parameters is not None:  # qwen3_coder: `<function=NAME>`, the values as text between XML tags
                name, arguments = (None if name is None else "=" + name), _values_text(arguments)
                parts = [(call.arguments_span, [name, arguments], offset)]
            else:
                parts = _hermes_parts(pieces, call.arguments_span, name, arguments, offset)
        else:
            parts = [
                (call.id_span, [server.get("id")], offset),
                (call.arguments_span, [server.get("arguments")], offset + 1),
            ]
        for span, field_texts, first_field in parts:
            if span is None or span[0] >= span[1]:
                continue
            a, b = span
            sub = align(pieces[a:b], field_texts, special[a:b])
            statuses[a:b] = sub.statuses
            fields[a:b] = [None if f is None else first_field + f for f in sub.fields]
            unmatched.append(sub.unmatched_text)
    return Alignment(tuple(statuses), "".join(unmatched), tuple(fields))


def _hermes_parts(
    pieces: Sequence[bytes], span: tuple[int, int] | None, name: str | None, arguments: str | None, offset: int
) -> list[tuple[tuple[int, int] | None, list[str | None], int]]:
    """A hermes call's JSON (`{"name": …, "arguments": …}`) as two parts, the ids of the name's value and those of the
    arguments' value, each aligned to its own field; the keys and the braces between them are left to neither (hidden).
    Aligned to the name and the arguments as one text, a one-token name (`search`) was not matched and the walk resumed
    inside the arguments, taking the `": "` after `"name"` for theirs; a part that began at the `"arguments"` key was
    aligned past its own ids to the first `": {"` of a nested value. The keys are found by reading the JSON (top-level
    keys only: a `"name"` inside the arguments is not the call's). The whole JSON to both fields when they are not."""
    whole = [(span, [name, arguments], offset)]
    if span is None:
        return whole
    a, b = span
    values = _top_level_values(b"".join(pieces[a:b]))
    name_at, arguments_at = values.get("name"), values.get("arguments", values.get("parameters"))
    if name_at is None or arguments_at is None:
        return whole
    ends = list(accumulate(len(p) for p in pieces[a:b]))

    def ids_of(start: int, end: int) -> tuple[int, int]:  # the pieces that hold bytes start … end-1
        first = bisect_right(ends, start)
        last = bisect_left(ends, end)
        return a + first, a + min(last, len(ends) - 1) + 1

    name_ids, arguments_ids = ids_of(*name_at), ids_of(*arguments_at)
    if name_ids[1] > arguments_ids[0] and arguments_ids[1] > name_ids[0]:  # one piece holds both: no clean cut
        return whole
    return [(name_ids, [name], offset), (arguments_ids, [arguments], offset + 1)]


def _top_level_values(raw: bytes) -> dict[str, tuple[int, int]]:
    """Where each top-level key's value lies in the first JSON object of `raw` (byte offsets, end exclusive); a value
    cut short (the call ran out of tokens) runs to the end. Empty when `raw` holds no object that begins well."""
    text = raw.decode("utf-8", "surrogateescape")  # one character per undecodable byte: offsets map back exactly
    at = text.find("{")
    if at < 0:
        return {}
    decoder = json.JSONDecoder()
    found: dict[str, tuple[int, int]] = {}

    def skip(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    def offset(i: int) -> int:
        return len(text[:i].encode("utf-8", "surrogateescape"))

    i = skip(at + 1)
    while i < len(text) and text[i] == '"':
        try:
            key, i = decoder.raw_decode(text, i)
        except ValueError:
            break
        i = skip(i)
        if i >= len(text) or text[i] != ":":
            break
        start = skip(i + 1)
        try:
            _, i = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):  # cut short: the value runs to the end
            found[str(key)] = (offset(start), len(raw))
            break
        found[str(key)] = (offset(start), offset(i))  # a key given twice: the last, as the parser reads it
        i = skip(i)
        if i >= len(text) or text[i] != ",":
            break
        i = skip(i + 1)
    return found


def _values_text(arguments: str | None) -> str | None:
    """An XML call's arguments as the ids spell them: each value's text in order (a string as it is, any other JSON),
    so its ids align to the field that returned them; the JSON text itself when it is no object."""
    try:
        values = json.loads(arguments) if arguments is not None else None
    except (ValueError, RecursionError):
        return arguments
    if not isinstance(values, dict):
        return arguments
    return "".join(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in values.values())


def _merged(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def _complement(ranges: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    out, at = [], 0
    for a, b in ranges:
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < n:
        out.append((at, n))
    return out
